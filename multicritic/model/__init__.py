"""The critic as a Keras model: `CriticNetwork`, its options and sizes, ensembles' members, `MultiCritic`,
the return normaliser; `CompiledForward`, a host's actor called compiled as the critic is."""
