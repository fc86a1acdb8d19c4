"""Typed config sections: what library code takes instead of a ConfigDict.

A recipe is an ``ml_collections`` ConfigDict (overridable from the command
line, locked, printable); library code takes frozen dataclasses, built once
from it at the trainer's door (:func:`build`). Each field is declared once,
with :func:`key`, carrying its default and its one-line meaning: the
recipes' skeleton (``jaxtl.configs.common``) builds its ConfigDict sections
from these fields, and ``jaxtl config`` and the docs' config reference read
the meanings from them, so a key is declared, typed and explained in one
place, next to the code that reads it.

A section whose keys depend on one of its values (the objective by its
``name``, a corpus by its ``kind``) is a :class:`Kinded` base class: the
ConfigDict holds the union of its kinds' keys, and :func:`build` makes the
one class of the chosen kind, from only that kind's keys.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")


def key(default: Any, meaning: str, *, kinds: tuple[str, ...] = ()) -> Any:
  """A field of a section: its default (a dict default is copied per
  instance) and what it means, one short line for a person at the command
  line ("peak learning rate, reached after warmup"). In a class that serves
  several kinds of a :class:`Kinded` section, ``kinds`` names those that
  read the field (default: all of them)."""
  if not meaning.strip():
    raise ValueError(f"key({default!r}): a key needs a meaning")
  metadata = {"meaning": meaning, "kinds": kinds}
  if isinstance(default, dict):
    return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, meaning: str = "") -> Any:
  """A nested section field of class ``cls`` (its defaults by default);
  ``meaning`` defaults to the class's docstring's first line."""
  doc = (cls.__doc__ or "").strip().splitlines()
  return dataclasses.field(default_factory=cls,
                           metadata={"meaning": meaning or (doc[0] if doc else "")})


class Kinded:
  """A section with one class per kind: subclasses register under
  ``KINDS`` by the value of the field named ``KIND_KEY``."""
  KIND_KEY: ClassVar[str]
  KINDS: ClassVar[dict[str, type]]

  @classmethod
  def kind_class(cls, kind: str, where: str) -> type:
    """The class of ``kind``; an unknown one names the known ones."""
    if kind not in cls.KINDS:
      raise ValueError(f"{where}.{cls.KIND_KEY}={kind!r}: expected one of "
                       f"{', '.join(cls.KINDS)}")
    return cls.KINDS[kind]


def fields(cls: type) -> dict[str, dataclasses.Field]:
  """A section class's fields by name, in declaration order."""
  return {f.name: f for f in dataclasses.fields(cls)}


def field_types(cls: type) -> dict[str, Any]:
  """Each field's resolved type (annotations are strings under
  ``from __future__ import annotations``)."""
  return typing.get_type_hints(cls)


def section_class(hint: Any) -> type | None:
  """The section class a field's type names (``X | None`` included)."""
  union = typing.get_origin(hint) in (typing.Union, types.UnionType)
  for candidate in (hint, *(typing.get_args(hint) if union else ())):
    if isinstance(candidate, type) and (dataclasses.is_dataclass(candidate)
                                        or issubclass(candidate, Kinded)):
      return candidate
  return None


def _value(hint: Any, value: Any, where: str) -> Any:
  """A ConfigDict value as the field's type holds it."""
  cls = section_class(hint)
  if cls is not None and value is not None:
    return build(cls, value, where)
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (dict, Mapping) and len(args) == 2 and section_class(args[1]):
    return {k: build(section_class(args[1]), v, f"{where}.{k}") for k, v in value.items()}
  if hasattr(value, "to_dict"):  # a ConfigDict: entries the user names
    return value.to_dict()
  if isinstance(value, list):
    return tuple(value)
  return value


def build(cls: type[T], values: Mapping[str, Any], where: str = "config") -> T:
  """The typed section ``cls`` from a ConfigDict section (or a mapping: keys
  it leaves out take their defaults). Keys of the other kinds of a
  :class:`Kinded` section are left out; a class may build itself from its
  section with a ``from_section(values, where)`` classmethod. ``where`` is
  the section's dotted path, for errors."""
  if hasattr(cls, "from_section"):
    return cls.from_section(values, where)
  if issubclass(cls, Kinded):
    cls = cls.kind_class(values.get(cls.KIND_KEY, fields(cls)[cls.KIND_KEY].default), where)
  hints, kwargs = field_types(cls), {}
  for name, f in fields(cls).items():
    if name in values:
      kwargs[name] = _value(hints[name], values[name], f"{where}.{name}")
    elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
      raise KeyError(f"{where} has no key {name!r}")
  return cls(**kwargs)


def union_keys(classes: list[type]) -> dict[str, tuple[dataclasses.Field, list[type]]]:
  """The keys of several section classes (a Kinded section's kinds), in
  order of first declaration, each with the classes that have it."""
  out: dict[str, tuple[dataclasses.Field, list[type]]] = {}
  for cls in classes:
    for name, f in fields(cls).items():
      out.setdefault(name, (f, []))[1].append(cls)
  return out
