"""Checkpoint conversion: Hugging Face BERT, GPT-2 and T5 folders in and out."""

from jaxtl.convert.family import SpecialIds
from jaxtl.convert.hf import HFFolderError, Imported, export_hf, import_hf, is_hf_folder
from jaxtl.convert.task import export_task_hf

__all__ = ["HFFolderError", "Imported", "SpecialIds", "export_hf", "export_task_hf",
           "import_hf", "is_hf_folder"]
