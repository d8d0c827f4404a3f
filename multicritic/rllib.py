"""Kept for imports written before `multicritic.interop`: see `multicritic.interop.rllib`."""

from multicritic.interop.rllib import export_rllib_weights, load_rllib_weights, rllib_weight_names  # noqa: F401
