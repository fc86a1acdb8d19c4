"""Evaluating language models without fine-tuning: scoring continuations
(:mod:`jaxtl.eval.scoring`), few-shot classification by prompting
(:mod:`jaxtl.eval.prompting`) and the EleutherAI ``lm-eval`` adapter
(:mod:`jaxtl.eval.lm_eval_adapter`)."""
