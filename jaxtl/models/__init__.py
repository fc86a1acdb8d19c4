"""Transformer models: config, layers, stacks."""

from jaxtl.models.config import TransformerConfig
from jaxtl.models.family import Family, family_of
from jaxtl.models.transformer import EncoderDecoder, EncoderOrDecoder, build_model

__all__ = ["TransformerConfig", "Family", "family_of", "EncoderDecoder", "EncoderOrDecoder",
           "build_model"]
