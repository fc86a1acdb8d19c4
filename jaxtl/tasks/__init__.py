"""Labeled tasks: readers, features per task kind, metrics, fine-tuning."""
