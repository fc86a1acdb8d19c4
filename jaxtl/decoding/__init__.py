"""Writing tokens with a trained model: the KV-cache loop, beam search
(:mod:`~jaxtl.decoding.generate`) and the sampling filters
(:mod:`~jaxtl.decoding.sampling`)."""
