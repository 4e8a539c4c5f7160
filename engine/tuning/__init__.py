"""Decoder tuning: an Optuna study over the declared settings (docs/tuning.md)."""
