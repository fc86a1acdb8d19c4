"""Host-side (numpy) input pipeline: corruptions, packing, batching."""
