"""jaxtl: transfer learning for NLP in JAX/Flax."""

__version__ = "0.1.0"
