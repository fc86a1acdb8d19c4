"""The pretraining workload, the counterpart of :mod:`jaxtl.tasks`: its
input pipeline (:mod:`~jaxtl.pretraining.pipeline`: corpus -> tokenizer ->
rows -> an objective's batches), the run (:mod:`~jaxtl.pretraining.pretrain`,
from scratch or continued, in stages), tokenizing a corpus once
(:mod:`~jaxtl.pretraining.pretokenize`), and loading any pretrained model
by path, a jaxtl workdir or a Hugging Face folder
(:mod:`~jaxtl.pretraining.pretrained`)."""
