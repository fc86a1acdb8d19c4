"""Readers for the labeled target tasks that pretrained models adapt to.

GLUE and IMDB are plain tables: entries of the generic file task
(`jaxtl.tasks.file_task`, also `task=files` for users' own data). TREC's
and CoNLL-U's line formats keep small parsers of their own.

Each reader turns one split of a task's local files into an `Examples`
(sentence or sentence-pair classification, regression, word tagging) or,
for SQuAD, a `SquadExamples` (see `jaxtl.tasks.squad`); `load_task` picks
the reader by the task names `jaxtl.tasks.metrics.TASK_METRICS` uses. The files
are those of the shared data README; `data_dir` defaults to $JAXTL_DATA_DIR.

Errors name the file and 1-based line (SQuAD, one line of JSON, names the
article and question instead). With `on_error="skip"` bad rows are dropped
instead, and each is recorded in `skipped_rows`, so a caller can report how
much data it lost rather than lose it silently. Blank lines are not rows and
are passed over in either mode.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxtl.data import sources
from jaxtl.runtime import console
from jaxtl.tasks import file_task
from jaxtl.tasks.examples import BadRows, Examples, iter_lines
from jaxtl.tasks.squad import SquadExamples, read_squad, split_squad_by_article

# TREC-6 coarse classes, alphabetical: the order class ids follow.
TREC_LABELS = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")

# The 17 Universal Dependencies v2 UPOS tags, alphabetical (the order class
# ids follow); see universaldependencies.org/u/pos.
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
             "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")

SENTIMENT_LABELS = ("negative", "positive")


def _path(data_dir: sources.PathLike | None, *parts: str) -> str:
  path = os.path.join(sources.require_data_dir(
      None if data_dir is None else os.fspath(data_dir)), *parts)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path}")
  return path


def _check_split(task: str, split: str, splits: Sequence[str]) -> None:
  if split not in splits:
    raise ValueError(f"{task} has splits {', '.join(splits)}; got {split!r}")


# --- TREC --------------------------------------------------------------------

_TREC_FILES = {"train": "train_5500.label", "test": "TREC_10.label"}


def read_trec(split: str, data_dir: sources.PathLike | None = None, *,
              on_error: str = "raise") -> Examples:
  """Reads TREC-6 question classification (coarse labels).

  Lines read `COARSE:fine question text` in Latin-1 (one train question has
  a non-UTF-8 byte). TREC has no dev set: "test" is the 500-question
  evaluation set.

  Args:
    split: "train" (5,452 questions) or "test" (500).
    data_dir: Folder holding `trec/`; defaults to $JAXTL_DATA_DIR.
    on_error: "raise" on a bad line, or "skip" it and record it.

  Returns:
    The questions with class ids into `TREC_LABELS`.
  """
  _check_split("trec", split, tuple(_TREC_FILES))
  path = _path(data_dir, "trec", _TREC_FILES[split])
  rows = BadRows(on_error)
  label_ids = {name: i for i, name in enumerate(TREC_LABELS)}
  texts, labels, lines = [], [], []
  for lineno, line in iter_lines(path, "latin-1", rows):
    where = f"{path}:{lineno}"
    head, _, text = line.partition(" ")
    coarse, colon, fine = head.partition(":")
    if not colon or not coarse or not fine:
      rows.bad(where, f"expected 'COARSE:fine question', got {line[:60]!r}")
    elif coarse not in label_ids:
      rows.bad(where, f"unknown label {coarse!r}; known: {TREC_LABELS}")
    elif not text.strip():
      rows.bad(where, "empty question text")
    else:
      texts.append(text.strip())
      labels.append(label_ids[coarse])
      lines.append(where)
  return Examples(texts, labels, TREC_LABELS, path=path,
                  skipped_rows=rows.skipped, lines=lines)


# --- GLUE --------------------------------------------------------------------


def _glue(folder: str, text_fields: tuple[str, ...], label: str,
          labels: tuple[str, ...] = ("0", "1"), names: tuple[str, ...] = (),
          **kw: Any) -> tuple[str, file_task.FileTask]:
  """A GLUE task: its folder and where its fields are. Quotes are not
  special in these files (sentences hold stray ``"``): IANA TSV."""
  regression = kw.get("kind") == "regression"
  return folder, file_task.FileTask(
      text_fields, label, format="tsv_unquoted", labels=() if regression else labels,
      label_names=() if regression else names or labels, **kw)


_GLUE = {
    # CoLA has no header: source, label, original mark, sentence.
    "cola": _glue("CoLA", ("sentence",), "label", names=("unacceptable", "acceptable"),
                  columns=("source", "label", "mark", "sentence")),
    "sst2": _glue("SST-2", ("sentence",), "label", names=SENTIMENT_LABELS),
    "mrpc": _glue("MRPC", ("#1 String", "#2 String"), "Quality",
                  names=("not_equivalent", "equivalent")),
    "rte": _glue("RTE", ("sentence1", "sentence2"), "label",
                 labels=("entailment", "not_entailment")),
    "stsb": _glue("STS-B", ("sentence1", "sentence2"), "score", kind="regression",
                  score_range=(0.0, 5.0)),
}
GLUE_TASKS = tuple(_GLUE)
STSB_RANGE = _GLUE["stsb"][1].score_range


def read_glue(task: str, split: str,
              data_dir: sources.PathLike | None = None, *,
              on_error: str = "raise") -> Examples:
  """Reads a GLUE task from the official TSV files.

  Each task is a `file_task.FileTask` entry of `_GLUE`. Test labels are not
  public: evaluate on "dev". Texts are kept as in the file (SST-2's end in
  a space).

  Args:
    task: One of `GLUE_TASKS`: cola, sst2, mrpc, rte, stsb.
    split: "train" or "dev".
    data_dir: Folder holding `glue/`; defaults to $JAXTL_DATA_DIR.
    on_error: "raise" on a bad row, or "skip" it and record it.

  Returns:
    The examples; STS-B labels are float similarity scores in [0, 5].
  """
  if task not in _GLUE:
    raise ValueError(f"unknown GLUE task {task!r}; known: {GLUE_TASKS}")
  _check_split(task, split, ("train", "dev"))
  folder, spec = _GLUE[task]
  return file_task.read_split(spec, _path(data_dir, "glue", folder, f"{split}.tsv"),
                              on_error=on_error)


# --- IMDB --------------------------------------------------------------------

_IMDB = file_task.FileTask(("text",), "label", labels=("0", "1"),
                           label_names=SENTIMENT_LABELS)


def read_imdb(split: str, data_dir: sources.PathLike | None = None, *,
              on_error: str = "raise") -> Examples:
  """Reads IMDB movie-review sentiment (label 0 negative, 1 positive).

  The files list all negative reviews before all positive ones: shuffle
  before batching. Texts keep the original `<br />` tags.

  Args:
    split: "train" or "test" (25,000 reviews each).
    data_dir: Folder holding `imdb/`; defaults to $JAXTL_DATA_DIR.
    on_error: "raise" on a bad row, or "skip" it and record it.

  Returns:
    The reviews and their labels.
  """
  _check_split("imdb", split, ("train", "test"))
  return file_task.read_split(_IMDB, _path(data_dir, "imdb", f"{split}.jsonl.gz"),
                              on_error=on_error)


# --- CoNLL-U (UD English EWT) ------------------------------------------------


def read_conllu(path: str | os.PathLike[str], *,
                on_error: str = "raise") -> Examples:
  """Reads words and UPOS tags from a CoNLL-U file, one example per sentence.

  Comment lines, multiword-token ranges (ids like `1-2`, whose parts follow
  as separate words) and empty nodes (ids like `1.1`) are not words of the
  surface sentence and are passed over. With on_error="skip" a bad line
  drops its whole sentence, recorded once.

  Args:
    path: The .conllu file.
    on_error: "raise" on a bad line, or "skip" its sentence and record it.

  Returns:
    Sentences with `words` filled in and labels of tag ids into `UPOS_TAGS`.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path}")
  rows = BadRows(on_error)
  tag_ids = {tag: i for i, tag in enumerate(UPOS_TAGS)}
  sentences: list[list[str]] = []
  labels: list[list[int]] = []
  words: list[str] = []
  tags: list[int] = []
  bad = False  # The current sentence had an error (skip mode).

  def finish() -> None:
    nonlocal words, tags, bad
    if words and not bad:
      sentences.append(words)
      labels.append(tags)
    words, tags, bad = [], [], False

  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      word = tag = None
      try:
        line = raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        error = f"not valid utf-8 ({e.reason})"
      else:
        if not line.strip():
          finish()
          continue
        if line.startswith("#"):
          continue
        error, word, tag = _conllu_token(line, len(words), tag_ids)
      if error is not None:
        if not bad:  # Record a broken sentence once.
          rows.bad(f"{path}:{lineno}", error)
        bad = True
      elif word is not None:  # None: a multiword range or empty node.
        words.append(word)
        tags.append(tag)
  finish()
  return Examples([" ".join(w) for w in sentences], labels, UPOS_TAGS,
                  words=sentences, path=path, skipped_rows=rows.skipped)


def _conllu_token(line: str, seen: int, tag_ids: Mapping[str, int]
                  ) -> tuple[str | None, str | None, int | None]:
  """Parses a token line into (error, word, tag id); word None to skip."""
  fields = line.split("\t")
  if len(fields) != 10:
    return f"expected 10 tab-separated fields, got {len(fields)}", None, None
  token_id, form, upos = fields[0], fields[1], fields[3]
  if "-" in token_id or "." in token_id:
    return None, None, None
  if token_id != str(seen + 1):
    return f"word id {token_id!r} where {seen + 1} was expected", None, None
  if not form.strip():
    return "empty word form", None, None
  if upos not in tag_ids:
    return f"unknown UPOS tag {upos!r}; known: {UPOS_TAGS}", None, None
  return None, form, tag_ids[upos]


def read_ud_pos(split: str, data_dir: sources.PathLike | None = None, *,
                on_error: str = "raise") -> Examples:
  """Reads UD English EWT POS tagging: "train", "dev" or "test"."""
  _check_split("pos", split, ("train", "dev", "test"))
  path = _path(data_dir, "ud_ewt", f"en_ewt-ud-{split}.conllu")
  return read_conllu(path, on_error=on_error)


# --- By name -----------------------------------------------------------------

# Each task's splits. SQuAD's "train" and "eval" are the article halves of
# its dev file, the only split available offline.
TASK_SPLITS: dict[str, tuple[str, ...]] = {
    "trec": ("train", "test"),
    "imdb": ("train", "test"),
    **{task: ("train", "dev") for task in GLUE_TASKS},
    "pos": ("train", "dev", "test"),
    "squad": ("train", "eval", "dev"),
}

# The split each task reports results on (GLUE test labels are not public;
# TREC and IMDB have no dev set).
EVAL_SPLITS: dict[str, str] = {
    "trec": "test",
    "imdb": "test",
    **{task: "dev" for task in GLUE_TASKS},
    "pos": "dev",
    "squad": "eval",
}


def load_task(task: str, split: str,
              data_dir: sources.PathLike | None = None, *,
              on_error: str = "raise") -> Examples | SquadExamples:
  """Reads a split of a task by name, so configs can name tasks as strings.

  Args:
    task: A key of `TASK_SPLITS`.
    split: One of the task's splits. For "squad", "dev" is the whole file
      and "train"/"eval" its default `split_squad_by_article` halves.
    data_dir: The shared data folder; defaults to $JAXTL_DATA_DIR.
    on_error: "raise" on a bad row, or "skip" it and record it.

  Returns:
    The split's examples.
  """
  if task not in TASK_SPLITS:
    raise ValueError(console.unknown("task", task, TASK_SPLITS))
  _check_split(task, split, TASK_SPLITS[task])
  if task == "trec":
    return read_trec(split, data_dir, on_error=on_error)
  if task == "imdb":
    return read_imdb(split, data_dir, on_error=on_error)
  if task == "pos":
    return read_ud_pos(split, data_dir, on_error=on_error)
  if task == "squad":
    squad = read_squad("dev", data_dir, on_error=on_error)
    if split == "dev":
      return squad
    train, held_out = split_squad_by_article(squad.examples)
    return dataclasses.replace(
        squad, examples=train if split == "train" else held_out)
  return read_glue(task, split, data_dir, on_error=on_error)
