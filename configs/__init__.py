"""jaxtl config files: model presets, the shared skeleton, and recipes."""
