"""The native baselines: the critic's train step (and a K-member ensemble's) written by hand in each framework."""
