"""Pretraining objectives: what each one's batches hold and how it is scored."""

from jaxtl.objectives.losses import (LOSS_CHUNK_LEN, OBJECTIVE_FAMILY,
                                     check_objective, chunked_cross_entropy,
                                     forward, loss_weight_total, make_loss_fn,
                                     normalized_loss, summarize, target_prefix,
                                     token_cross_entropy)

__all__ = ["LOSS_CHUNK_LEN", "OBJECTIVE_FAMILY", "check_objective",
           "chunked_cross_entropy", "forward", "loss_weight_total", "make_loss_fn",
           "normalized_loss", "summarize", "target_prefix", "token_cross_entropy"]
