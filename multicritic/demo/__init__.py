"""`multicritic demo`: learn the exact state values of a random MDP at several reward scales."""
