"""SQuAD v1.1 extractive question answering: reader and article split.

Only the dev file is available offline, so a small QA fine-tune trains and
evaluates on two halves of it; `split_squad_by_article` cuts between
articles so that no passage (or its near-duplicate questions) is seen in
both training and evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from jaxtl.data import sources
from jaxtl.tasks.examples import BadRows


@dataclasses.dataclass(frozen=True)
class Answer:
  """A gold answer: its text, found at `context[start:start + len(text)]`."""
  text: str
  start: int

  @property
  def end(self) -> int:
    """Character offset just past the answer."""
    return self.start + len(self.text)


@dataclasses.dataclass(frozen=True)
class SquadExample:
  """One question about one passage, with every annotator's answer."""
  id: str
  title: str
  context: str = dataclasses.field(repr=False)  # Long; kept out of logs.
  question: str
  answers: tuple[Answer, ...]

  @property
  def answer_texts(self) -> list[str]:
    return [a.text for a in self.answers]


@dataclasses.dataclass
class SquadExamples(Sequence):
  """A list of `SquadExample`s plus where they came from and what was lost.

  Attributes:
    examples: The questions, in file order.
    path: The file read, for messages.
    skipped_rows: "where: reason" for each question or article dropped with
      on_error="skip".
  """
  examples: list[SquadExample]
  path: str = ""
  skipped_rows: list[str] = dataclasses.field(default_factory=list)

  def __len__(self) -> int:
    return len(self.examples)

  def __getitem__(self, index):
    return self.examples[index]

  def __iter__(self) -> Iterator[SquadExample]:
    return iter(self.examples)

  def subset(self, indices: Any) -> "SquadExamples":
    """The questions at ``indices``, in that order."""
    return dataclasses.replace(self, examples=[self.examples[i] for i in indices],
                               skipped_rows=[])

  @property
  def skipped(self) -> int:
    """How many questions or articles were dropped as bad."""
    return len(self.skipped_rows)


def _question_error(qa: Any, context: str, seen: set[str]) -> str | None:
  """Says what is wrong with one question entry, or None if it is sound."""
  if not isinstance(qa, dict):
    return "question entry is not an object"
  qid, question, answers = qa.get("id"), qa.get("question"), qa.get("answers")
  if not isinstance(qid, str) or not qid:
    return "missing question id"
  if qid in seen:
    return "duplicate question id"
  if not isinstance(question, str) or not question.strip():
    return "empty question"
  if not isinstance(answers, list) or not answers:
    return "no answers"
  for a in answers:
    if not isinstance(a, dict) or not isinstance(a.get("text"), str):
      return "answer without text"
    text, start = a["text"], a.get("answer_start")
    if not text.strip():
      return "empty answer text"
    if type(start) is not int or start < 0:  # Not bool, not negative.
      return f"answer {text!r} has no valid answer_start ({start!r})"
    if context[start:start + len(text)] != text:
      return f"answer {text!r} is not at character {start} of the context"
  return None


def read_squad_json(path: str | os.PathLike[str], *,
                    on_error: str = "raise") -> SquadExamples:
  """Flattens an official SQuAD v1.1 JSON file into one example per question.

  The file is a single line of JSON, so errors name the article (by index
  and title) and question id rather than a line.

  Args:
    path: The JSON file.
    on_error: "raise" on a bad question (or article), or "skip" it and
      record it.

  Returns:
    The questions in file order.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path}")
  rows = BadRows(on_error)
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{e.lineno}:{e.colno}: malformed JSON "
                       f"({e.msg})") from e
  articles = data.get("data") if isinstance(data, dict) else None
  if not isinstance(articles, list):
    raise ValueError(f"{path}: expected an object with a 'data' list of "
                     "articles")
  examples, seen = [], set()
  for i, article in enumerate(articles):
    article = article if isinstance(article, dict) else {}
    title, paragraphs = article.get("title"), article.get("paragraphs")
    where = f"{path}: article {i} ({title!r})"
    if not isinstance(title, str) or not isinstance(paragraphs, list):
      rows.bad(where, "article needs a 'title' and a 'paragraphs' list")
      continue
    for paragraph in paragraphs:
      paragraph = paragraph if isinstance(paragraph, dict) else {}
      context = paragraph.get("context")
      if not isinstance(context, str) or not context.strip():
        rows.bad(where, "paragraph with an empty or missing context")
        continue
      for qa in paragraph.get("qas") or []:
        error = _question_error(qa, context, seen)
        if error is not None:
          qid = qa.get("id") if isinstance(qa, dict) else None
          rows.bad(f"{where}, question {qid!r}", error)
          continue
        seen.add(qa["id"])
        answers = tuple(Answer(a["text"], a["answer_start"])
                        for a in qa["answers"])
        examples.append(SquadExample(qa["id"], title, context, qa["question"],
                                     answers))
  return SquadExamples(examples, path, rows.skipped)


def read_squad(split: str = "dev", data_dir: sources.PathLike | None = None, *,
               on_error: str = "raise") -> SquadExamples:
  """Reads SQuAD v1.1 from `<data_dir>/squad/` (only "dev" is offline)."""
  if split != "dev":
    raise ValueError(f"squad has only the 'dev' split offline, got {split!r};"
                     " use split_squad_by_article to make train/eval halves")
  path = os.path.join(sources.require_data_dir(data_dir), "squad",
                      "dev-v1.1.json")
  return read_squad_json(path, on_error=on_error)


def split_squad_by_article(examples: Sequence[SquadExample],
                           eval_fraction: float = 0.25, seed: int = 0
                           ) -> tuple[list[SquadExample], list[SquadExample]]:
  """Splits examples into train and eval sets with no article in both.

  Articles are ordered by a SHA-256 hash of (seed, title), which gives the
  same split on every machine and library version, and the first
  round(eval_fraction * articles) of them (at least 1, leaving at least 1
  for training) become the eval set. The fraction counts articles, not
  questions.

  Args:
    examples: Parsed questions (e.g. from `read_squad`).
    eval_fraction: Share of articles held out, in (0, 1).
    seed: Picks a different, equally deterministic split.

  Returns:
    (train, eval), each in the input order.
  """
  if not 0.0 < eval_fraction < 1.0:
    raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
  titles = list(dict.fromkeys(e.title for e in examples))
  if len(titles) < 2:
    raise ValueError(f"need at least 2 articles to split, got {len(titles)}")

  def key(title: str) -> str:
    return hashlib.sha256(f"{seed}\0{title}".encode("utf-8")).hexdigest()

  num_eval = min(max(round(eval_fraction * len(titles)), 1), len(titles) - 1)
  eval_titles = set(sorted(titles, key=key)[:num_eval])
  train = [e for e in examples if e.title not in eval_titles]
  held_out = [e for e in examples if e.title in eval_titles]
  return train, held_out
