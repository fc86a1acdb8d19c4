"""Host-side (numpy) input pipeline: sources, tokenizers, packing, batching."""
