"""Checkpoint conversion: Hugging Face BERT, GPT-2 and T5 folders in and out."""

from jaxtl.convert.hf import Imported, export_hf, import_hf, is_hf_folder
from jaxtl.convert.task import export_task_hf, is_task_workdir, load_task_spec

__all__ = ["Imported", "export_hf", "export_task_hf", "import_hf", "is_hf_folder",
           "is_task_workdir", "load_task_spec"]
