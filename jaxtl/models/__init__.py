"""Transformer models: config, layers, stacks."""

from jaxtl.models.config import TransformerConfig
from jaxtl.models.transformer import EncoderDecoder, EncoderOrDecoder, build_model

__all__ = ["TransformerConfig", "EncoderDecoder", "EncoderOrDecoder", "build_model"]
