"""Typed reading of JSON values that records problems instead of raising at the first one.

A :class:`Collector` converts single JSON values (``true``, ``64``, ``"a/b"``, lists) to
Python values and records a :class:`~hps_core.errors.Problem` for each value that does not
fit, returning ``None`` for it. An :class:`ObjectReader` reads the keys of one JSON object
through a collector and, once done, reports the keys nobody read (typos) with a suggestion.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from hps_core.errors import HPSError, Problem
from hps_core.formats.uris import ModelPath, is_uri, open_uri

E = TypeVar("E", bound=Enum)
Converter = Callable[[Any, str], Any]

# Marks a key without a default: leaving it out is a problem.
REQUIRED: Any = object()

# Any URL: those hps_core.formats.uris does not open (ftp://, http:// outside S3) are problems.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class JSONObject(dict):
    """A JSON object that remembers keys written twice with different values.

    ``json`` keeps the last value of a repeated key, as HugeCTR's parser does; a repeat with
    a different value is almost always an editing mistake, so it is warned about (HugeCTR's
    own samples have one: the file loads there, and so it does here).
    """

    conflicts: dict[str, list[Any]]


def json_object_from_pairs(pairs: list[tuple[str, Any]]) -> JSONObject:
    """``object_pairs_hook`` for :func:`json.loads` that records conflicting repeated keys.

    Args:
        pairs: the key/value pairs of one JSON object, in file order.

    Returns:
        The object, with ``conflicts`` mapping each key repeated with different values to
        all of its values in file order.
    """
    obj = JSONObject()
    seen: dict[str, list[Any]] = {}
    for key, value in pairs:
        seen.setdefault(key, []).append(value)
        obj[key] = value
    obj.conflicts = {
        key: values for key, values in seen.items() if any(v != values[0] for v in values[1:])
    }
    return obj


@dataclass(frozen=True)
class Bounds:
    """An allowed range of numbers; ``None`` leaves that side open-ended."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, x: float) -> bool:
        if self.low is not None and (x < self.low or (self.low_open and x == self.low)):
            return False
        return not (
            self.high is not None and (x > self.high or (self.high_open and x == self.high))
        )

    def text(self) -> str:
        """Describe the range, e.g. ``>= 1`` or ``in [0, 1]`` (empty when unbounded)."""
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            right = ")" if self.high_open else "]"
            return f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return ""


ANY = Bounds()
AT_LEAST_0 = Bounds(low=0)
AT_LEAST_1 = Bounds(low=1)
UNIT = Bounds(low=0, high=1)
OPEN_UNIT = Bounds(low=0, high=1, low_open=True, high_open=True)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def describe(value: Any) -> str:
    """Say what a JSON value is, for "expected ..., found ..." messages.

    Args:
        value: any value decoded from JSON.

    Returns:
        E.g. ``true``, ``null``, ``1.5``, ``the string "0.5"``, ``a list of 3 items``.
    """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"the string {json.dumps(shown)}"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, list):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _unquoted(value: Any) -> Any:
    """A string holding a number as the number (HugeCTR's Triton backends fall back to
    ``stoll``/``stod`` on a string where they expect a number); anything else unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return value


class Collector:
    """Converts JSON values to typed values, collecting every problem found.

    Each conversion method takes ``(value, where)`` and returns the converted value, or
    ``None`` after recording a problem at ``where``.

    Args:
        base_dir: folder that relative file paths are resolved against.
    """

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.problems: list[Problem] = []
        self.repeated: list[tuple[str, tuple[Any, ...]]] = []
        """Keys given more than once with different values: location and every value, in
        file order (the last one is taken, as HugeCTR takes it)."""

    def add(self, where: str, message: str) -> None:
        """Record a problem at ``where``."""
        self.problems.append(Problem(where, message))

    def _mismatch(self, where: str, expected: str, value: Any) -> None:
        self.add(where, f"expected {expected}, found {describe(value)}")

    def boolean(self, value: Any, where: str) -> bool | None:
        """Accept JSON ``true``/``false``, or a string as HugeCTR's Triton backends read one:
        ``"true"``/``"false"`` in any case, or an integer (non-zero is true). A JSON number
        is refused, as there."""
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("true", "false"):
                return text == "true"
            try:
                return int(text) != 0
            except ValueError:
                pass
        if isinstance(value, bool):
            return value
        self._mismatch(where, "true or false", value)
        return None

    def integer(self, value: Any, where: str, bounds: Bounds = ANY) -> int | None:
        """Accept an integer, a float with an integral value such as ``1e6``, or a string of
        one (HugeCTR's Triton backends read quoted numbers)."""
        expected = " ".join(filter(None, ("an integer", bounds.text())))
        value = _unquoted(value)
        if isinstance(value, float) and math.isfinite(value):
            if not value.is_integer():
                self.add(
                    where,
                    f"expected {expected}, found {describe(value)} "
                    f"(HugeCTR would silently truncate it to {int(value)})",
                )
                return None
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self._mismatch(where, expected, value)
            return None
        if value not in bounds:
            self.add(where, f"expected {expected}, found {value}")
            return None
        return value

    def number(self, value: Any, where: str, bounds: Bounds = ANY) -> float | None:
        """Accept a finite JSON number (integer or float), or a string of one, returned as
        ``float``."""
        expected = " ".join(filter(None, ("a number", bounds.text())))
        value = _unquoted(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._mismatch(where, expected, value)
            return None
        if not math.isfinite(value) or value not in bounds:
            self.add(where, f"expected {expected}, found {describe(value)}")
            return None
        return float(value)

    def string(self, value: Any, where: str, nonempty: bool = False) -> str | None:
        """Accept a JSON string; with ``nonempty``, not ``""``."""
        if not isinstance(value, str):
            self._mismatch(where, "a non-empty string" if nonempty else "a string", value)
            return None
        if nonempty and not value:
            self.add(where, "expected a non-empty string, found an empty string")
            return None
        return value

    def secret(self, value: Any, where: str) -> str | None:
        """Accept a JSON string that is a secret (a password): a message about a wrong value
        says what kind of value it is, never the value."""
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__.replace("dict", "object")
            self.add(where, f"expected a string, found a value of type {kind} (not shown)")
            return None
        return value

    def path(self, value: Any, where: str) -> ModelPath | None:
        """Accept a local file path (a relative one is resolved against ``base_dir``) or a
        URI of :mod:`hps_core.formats.uris` (``s3://``, ``hdfs://``, ...)."""
        text = self.string(value, where, nonempty=True)
        if text is None:
            return None
        if is_uri(text):
            try:
                return open_uri(text)
            except HPSError as exc:
                self.add(where, str(exc))
                return None
        if _URL.match(text):
            self.add(
                where,
                f"unsupported URL {json.dumps(text)}; give a local path or an s3://, "
                "hdfs:// or gs:// URI",
            )
            return None
        path = Path(text)
        # Lexical normalisation only: symlinks in a model repository are left alone.
        return path if path.is_absolute() else Path(os.path.normpath(self.base_dir / path))

    def optional_path(self, value: Any, where: str) -> ModelPath | None:
        """Like :meth:`path`, but ``""`` (HugeCTR's "not given") is accepted as ``None``."""
        if value == "":
            return None
        if value is None:
            self.add(
                where, "expected a file path, found null (leave the key out when there is none)"
            )
            return None
        return self.path(value, where)

    def choice(
        self,
        value: Any,
        where: str,
        names: Mapping[str, E],
        allowed: Collection[E] | None = None,
    ) -> E | None:
        """Accept one of the spellings in ``names``, in any case and with spaces or dashes
        for underscores (HugeCTR's Triton backends read ``"Parallel Hash-Map"`` as
        ``parallel_hash_map``).

        Args:
            value: the JSON value.
            where: its location.
            names: every accepted spelling and the member it stands for.
            allowed: members valid here (all of ``names`` when ``None``).
        """
        members = [m for m in dict.fromkeys(names.values()) if allowed is None or m in allowed]
        listed = ", ".join(f'"{m.value}"' for m in members)
        text = self.string(value, where)
        if text is None:
            return None
        member = names.get(text)
        if member is None:
            member = names.get(text.lower().replace(" ", "_").replace("-", "_"))
        if member is not None and member in members:
            return member
        if member is not None:
            self.add(where, f'"{text}" is not allowed here; expected one of {listed}')
            return None
        spellings = [n for n, m in names.items() if m in members]
        close = difflib.get_close_matches(text.lower(), spellings, n=1, cutoff=0.6)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        self.add(where, f'unknown value "{text}"{hint}; expected one of {listed}')
        return None

    def object(self, value: Any, where: str) -> Mapping[str, Any] | None:
        """Accept a JSON object."""
        if isinstance(value, Mapping):
            return value
        self.add(where, f"expected an object {{...}}, found {describe(value)}")
        return None

    def regex(self, value: Any, where: str) -> str | None:
        """Accept a non-empty string that compiles as a regular expression."""
        text = self.string(value, where, nonempty=True)
        if text is None:
            return None
        try:
            re.compile(text)
        except re.error as exc:
            self.add(where, f"invalid regular expression {json.dumps(text)}: {exc}")
            return None
        return text

    def int_in(self, bounds: Bounds = AT_LEAST_1) -> Converter:
        """Return a converter accepting integers within ``bounds`` (default: >= 1)."""
        return partial(self.integer, bounds=bounds)

    def number_in(self, bounds: Bounds) -> Converter:
        """Return a converter accepting finite numbers within ``bounds``."""
        return partial(self.number, bounds=bounds)

    def list_of(self, item: Converter) -> Converter:
        """Return a converter accepting a JSON list whose items ``item`` accepts."""
        return partial(self.items, convert=item)

    def items(self, value: Any, where: str, convert: Converter) -> tuple[Any, ...] | None:
        """Accept a JSON list, converting item ``i`` with ``convert(item, where[i])``."""
        if not isinstance(value, list):
            self._mismatch(where, "a list", value)
            return None
        converted = [convert(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if any(item is None for item in converted):
            return None
        return tuple(converted)


class ObjectReader:
    """Reads the keys of one JSON object through a :class:`Collector`.

    Every key passed to :meth:`get` counts as understood; :meth:`finish` reports the others.

    Args:
        collector: where values are converted and problems recorded.
        obj: the JSON object.
        where: its location, e.g. ``models[0]`` (``""`` for the top level).
    """

    def __init__(self, collector: Collector, obj: Mapping[str, Any], where: str) -> None:
        self._collector = collector
        self._obj = obj
        self._where = where
        self._known: list[str] = []
        for key, values in getattr(obj, "conflicts", {}).items():
            collector.repeated.append((self.path_of(key), tuple(values)))

    def path_of(self, key: str) -> str:
        """Location of ``key`` in this object, e.g. ``models[0].gpucacheper``."""
        return f"{self._where}.{key}" if self._where else key

    def has(self, key: str) -> bool:
        """Whether the object has ``key`` (which then counts as understood)."""
        self._known.append(key)
        return key in self._obj

    def get(self, key: str, convert: Converter, default: Any = REQUIRED, hint: str = "") -> Any:
        """Read and convert ``key``.

        Args:
            key: the JSON key.
            convert: a ``(value, where)`` conversion, e.g. ``collector.boolean``.
            default: value when the key is absent; :data:`REQUIRED` makes absence a problem.
            hint: extra text for the "missing" problem.

        Returns:
            The converted value, the default, or ``None`` when a problem was recorded.
        """
        self._known.append(key)
        if key in self._obj:
            return convert(self._obj[key], self.path_of(key))
        if default is REQUIRED:
            self._collector.add(self.path_of(key), "missing" + (f"; {hint}" if hint else ""))
            return None
        return default

    def read(
        self,
        spec: Mapping[str, Converter],
        defaults: Mapping[str, Any],
        missing_hints: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Read every key of ``spec`` with its converter.

        Args:
            spec: converter of each key.
            defaults: value of each optional key when absent; keys without one are required.
            missing_hints: extra text for the "missing" problem of required keys.

        Returns:
            The converted values by key (``None`` where a problem was recorded).
        """
        hints = missing_hints or {}
        return {
            key: self.get(key, convert, defaults.get(key, REQUIRED), hints.get(key, ""))
            for key, convert in spec.items()
        }

    def finish(
        self, ignored: Iterable[str] = (), hints: Mapping[str, str] | None = None
    ) -> tuple[str, ...]:
        """Report every key that was neither read nor listed in ``ignored``.

        Args:
            ignored: keys HugeCTR accepts here but that have no effect; they are not problems.
            hints: messages for known mistakes, by key (replace the "unknown key" text).

        Returns:
            The ``ignored`` keys present in the object, in file order.
        """
        ignored = frozenset(ignored)
        known = list(dict.fromkeys(self._known))
        present_ignored = []
        for key in self._obj:
            if key in known:
                continue
            if key in ignored:
                present_ignored.append(key)
                continue
            where = self.path_of(str(key))
            if hints and key in hints:
                self._collector.add(where, hints[key])
                continue
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            if close:
                message = f'unknown key (did you mean "{close[0]}"?)'
            else:
                message = "unknown key; known keys here: " + ", ".join(sorted(known))
            self._collector.add(where, message)
        return tuple(present_ignored)


def dataclass_defaults(cls: type) -> dict[str, Any]:
    """Default value of each field of a dataclass that has one (factories are called)."""
    out = {}
    for f in fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out
