"""Parse a HugeCTR network JSON file into typed specs, keeping each layer's line number.

Both forms HugeCTR writes are read: the inference form (with an ``inference`` section) and the
training form (``solver`` and ``optimizer`` sections, which inference ignores). Only the
``layers`` array matters for the dense network; ``layers[0]`` is the ``Data`` layer, as HugeCTR's
parser requires. A layer's ``name`` is optional (``Model.graph_to_json`` writes none); its first
top names it then.

Every error names the file, the line of the layer and the field, e.g.
``dlrm.json:97 layers[9] 'fc4'.fc_param.num_output: must be an integer >= 1, got -3``.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hps_core.errors import ConfigError, Problem
from hps_core.formats.json_text import json_syntax_hint
from hps_core.formats.uris import model_path

_MISSING: Any = object()
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_PATH_PART = re.compile(r"[^\[\]]+")


class NetworkForm(enum.Enum):
    """Which of HugeCTR's JSON forms a file is."""

    INFERENCE = "inference"
    TRAINING = "training"
    GRAPH = "graph"


@dataclass(frozen=True)
class SparseInputSpec:
    """One sparse (categorical) input of the ``Data`` layer.

    Args:
        name: the top name embedding layers consume.
        slot_num: slots (feature fields) per sample.
        nnz_per_slot: the most keys per slot, one number or one per slot; ``None`` if absent.
        is_fixed_length: every sample has exactly ``nnz_per_slot`` keys per slot.
    """

    name: str
    slot_num: int
    nnz_per_slot: int | tuple[int, ...] | None
    is_fixed_length: bool

    @property
    def fixed_hotness(self) -> int | None:
        """Keys in every slot of every sample when the input has a fixed length with one
        ``nnz_per_slot`` for all its slots (HugeCTR's ``DataReaderSparseParam(name, hotness,
        True, slot_num)``, as MLPerf DLRM-v2's multi-hot inputs); else ``None``."""
        nnz = self.nnz_per_slot
        if not self.is_fixed_length or nnz is None:
            return None
        if isinstance(nnz, tuple):
            return nnz[0] if len(set(nnz)) == 1 else None
        return nnz


@dataclass(frozen=True)
class DataSpec:
    """The ``Data`` layer: names and widths of the inputs.

    Args:
        dense_name: top name of the dense features.
        dense_dim: dense features per sample (0 when there are none).
        label_names: top names of the labels (not available at inference).
        sparse: the sparse inputs in file order.
        line: line of the ``Data`` layer in the file.
    """

    dense_name: str
    dense_dim: int
    label_names: tuple[str, ...]
    sparse: tuple[SparseInputSpec, ...]
    line: int


@dataclass(frozen=True)
class LayerSpec:
    """One entry of the ``layers`` array after ``Data``, as written in the file.

    Args:
        index: position in the ``layers`` array.
        line: line of the layer's opening brace.
        source: file name used in messages.
        name: the layer's ``name``, or its first top when it has none.
        type: the HugeCTR layer type, e.g. ``InnerProduct``.
        bottoms: input tensor names.
        tops: output tensor names.
        raw: the layer's JSON object, for the type-specific fields.
    """

    index: int
    line: int
    source: str
    name: str
    type: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    raw: Mapping[str, Any]

    def where(self, field: str | None = None) -> str:
        """Location for messages: ``file:line layers[i] 'name'`` plus ``.field``."""
        base = f"{self.source}:{self.line} layers[{self.index}] '{self.name}'"
        return f"{base}.{field}" if field else base

    def error(self, message: str, field: str | None = None) -> ConfigError:
        """Return a :class:`ConfigError` located at this layer (and ``field``)."""
        return ConfigError(Problem(self.where(field), message))

    def has(self, field: str) -> bool:
        """Whether the dotted ``field`` (e.g. ``mc_param.projection_dim``) is present."""
        return _lookup(self.raw, field) is not _MISSING

    def int_field(self, field: str, default: Any = _MISSING, minimum: int | None = None) -> int:
        """Read an integer field (dotted path), checking it against ``minimum``.

        Args:
            field: dotted path inside the layer object.
            default: value when the field is absent; absent and no default is an error.
            minimum: smallest allowed value.

        Returns:
            The integer.

        Raises:
            ConfigError: missing, not an integer, or below ``minimum``.
        """
        value = self._value(field, default)
        bound = "" if minimum is None else f" >= {minimum}"
        if not _is_int(value) or (minimum is not None and value < minimum):
            raise self.error(f"must be an integer{bound}, got {value!r}", field)
        return int(value)

    def float_field(self, field: str, default: Any = _MISSING) -> float:
        """Read a number field (dotted path)."""
        value = self._value(field, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"must be a number, got {value!r}", field)
        return float(value)

    def int_list_field(self, field: str, minimum: int | None = None) -> tuple[int, ...]:
        """Read a non-empty list of integers (dotted path), each at least ``minimum``."""
        value = self._value(field, _MISSING)
        bound = "" if minimum is None else f" >= {minimum}"
        ok = isinstance(value, list) and value and all(_is_int(v) for v in value)
        if not ok or (minimum is not None and min(value) < minimum):
            raise self.error(f"must be a non-empty list of integers{bound}, got {value!r}", field)
        return tuple(int(v) for v in value)

    def int_pairs_field(self, field: str) -> tuple[tuple[int, int], ...]:
        """Read a non-empty list of ``[a, b]`` integer pairs (dotted path)."""
        value = self._value(field, _MISSING)
        pairs = isinstance(value, list) and value and all(isinstance(p, list) for p in value)
        if not pairs or not all(len(p) == 2 and _is_int(p[0]) and _is_int(p[1]) for p in value):
            raise self.error(f"must be a non-empty list of [int, int] pairs, got {value!r}", field)
        return tuple((int(a), int(b)) for a, b in value)

    def _value(self, field: str, default: Any) -> Any:
        value = _lookup(self.raw, field)
        if value is _MISSING:
            if default is _MISSING:
                raise self.error("is required", field)
            return default
        return value


@dataclass(frozen=True)
class NetworkSpec:
    """A parsed network file.

    Args:
        source: file name used in messages.
        form: inference, training or bare graph form.
        data: the ``Data`` layer.
        layers: every layer after ``Data`` in file order.
        inference: the ``inference`` section (``dense_model_file``, ...), empty if absent.
    """

    source: str
    form: NetworkForm
    data: DataSpec
    layers: tuple[LayerSpec, ...]
    inference: Mapping[str, Any]


def load_network_json(path: str | Path) -> NetworkSpec:
    """Read and parse a HugeCTR network JSON file.

    Args:
        path: the file.

    Returns:
        The parsed :class:`NetworkSpec`.

    Raises:
        ConfigError: unreadable file, invalid JSON, or a malformed ``layers`` array.

    Example:
        >>> spec = load_network_json("dcn_inference.json")  # doctest: +SKIP
        >>> spec.layers[0].type  # doctest: +SKIP
        'DistributedSlotSparseEmbeddingHash'
    """
    path = model_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read network file: {exc}", where=str(path)) from None
    return parse_network_json(text, source=str(path))


def parse_network_json(text: str, source: str = "<network>") -> NetworkSpec:
    """Parse the text of a HugeCTR network JSON file.

    Args:
        text: the JSON text.
        source: name used in messages (usually the file path).

    Returns:
        The parsed :class:`NetworkSpec`.

    Raises:
        ConfigError: invalid JSON or a malformed ``layers`` array.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{source}:{exc.lineno}:{exc.colno}"
        hint = json_syntax_hint(text, exc.pos)
        raise ConfigError(f"invalid JSON: {exc.msg}{hint}", where=where) from None
    if not isinstance(document, dict):
        raise ConfigError("the network file must hold a JSON object", where=source)
    if "layers" not in document and "models" in document:
        raise ConfigError(_ps_json_given(document), where=source)
    layers = document.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ConfigError("'layers' must be a non-empty array", where=f"{source} layers")
    lines = [text.count("\n", 0, offset) + 1 for offset in _layer_offsets(text)]
    problems: list[Problem] = []
    specs = []
    for index, (obj, line) in enumerate(zip(layers, lines, strict=True)):
        try:
            specs.append(_layer_spec(obj, index, line, source))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    data = _data_spec(specs[0])
    inference = document.get("inference", {})
    if not isinstance(inference, dict):
        raise ConfigError("'inference' must be an object", where=f"{source} inference")
    return NetworkSpec(
        source=source,
        form=_form(document),
        data=data,
        layers=tuple(specs[1:]),
        inference=inference,
    )


def _ps_json_given(document: Mapping[str, Any]) -> str:
    """The message for a ps.json passed where a network JSON belongs (an easy mix-up: both
    sit in a model folder, and ``hps check`` and ``hps repo`` take the ps.json)."""
    message = (
        "expected a HugeCTR network JSON (a 'layers' array), but this looks like a ps.json "
        "(top-level 'models', no 'layers')"
    )
    models = document.get("models")
    named = [
        f"models[{i}].network_file = {model['network_file']!r}"
        for i, model in enumerate(models if isinstance(models, list) else [])
        if isinstance(model, dict) and isinstance(model.get("network_file"), str)
    ]
    if named:
        # Relative paths in a ps.json are relative to its folder (hps_core/config/parse.py).
        message += f"; it names its network files, relative to its folder: {', '.join(named)}"
    return message


def _form(document: Mapping[str, Any]) -> NetworkForm:
    if "inference" in document:
        return NetworkForm.INFERENCE
    if "solver" in document or "optimizer" in document:
        return NetworkForm.TRAINING
    return NetworkForm.GRAPH


def _layer_spec(obj: Any, index: int, line: int, source: str) -> LayerSpec:
    where = f"{source}:{line} layers[{index}]"
    if not isinstance(obj, dict):
        raise ConfigError("each layer must be a JSON object", where=where)
    layer_type = obj.get("type")
    if not isinstance(layer_type, str) or not layer_type:
        raise ConfigError("'type' must be a non-empty string", where=f"{where}.type")
    if layer_type == "Data":
        if index:
            raise ConfigError("only layers[0] may be the Data layer", where=f"{where}.type")
        return LayerSpec(index, line, source, str(obj.get("name", "data")), "Data", (), (), obj)
    bottoms = _names(obj.get("bottom"), f"{where}.bottom")
    tops = _names(obj.get("top"), f"{where}.top")
    name = obj.get("name", tops[0])
    if not isinstance(name, str) or not name:
        raise ConfigError("'name' must be a non-empty string", where=f"{where}.name")
    return LayerSpec(index, line, source, name, layer_type, bottoms, tops, obj)


def _names(value: Any, where: str) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise ConfigError("must be a tensor name or a non-empty list of names", where=where)
    if not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"tensor names must be non-empty strings, got {value!r}", where=where)
    return tuple(names)


def _data_spec(spec: LayerSpec) -> DataSpec:
    if spec.type != "Data":
        raise ConfigError(
            f"layers[0] must be the Data layer, got type '{spec.type}'",
            where=f"{spec.source}:{spec.line} layers[0]",
        )
    dense = spec.raw.get("dense")
    dense_name = _lookup(spec.raw, "dense.top")
    if not isinstance(dense, dict) or not isinstance(dense_name, str) or not dense_name:
        raise spec.error("must be an object with a 'top' name and a 'dense_dim'", "dense")
    label_names: tuple[str, ...] = ()
    if spec.has("label.top"):
        label_names = _names(_lookup(spec.raw, "label.top"), spec.where("label.top"))
    sparse_list = spec.raw.get("sparse", [])
    if not isinstance(sparse_list, list):
        raise spec.error("must be a list of sparse inputs", "sparse")
    return DataSpec(
        dense_name=dense_name,
        dense_dim=spec.int_field("dense.dense_dim", minimum=0),
        label_names=label_names,
        sparse=tuple(_sparse_input(spec, i, s) for i, s in enumerate(sparse_list)),
        line=spec.line,
    )


def _sparse_input(spec: LayerSpec, i: int, entry: Any) -> SparseInputSpec:
    field = f"sparse[{i}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("top"), str) or not entry["top"]:
        raise spec.error("must be an object with a 'top' name and a 'slot_num'", field)
    nnz = None
    for key in ("nnz_per_slot", "max_feature_num_per_sample"):
        if key in entry:
            path = f"{field}.{key}"
            many = isinstance(entry[key], list)
            nnz = spec.int_list_field(path, 1) if many else spec.int_field(path, minimum=1)
            break
    return SparseInputSpec(
        name=entry["top"],
        slot_num=spec.int_field(f"{field}.slot_num", minimum=1),
        nnz_per_slot=nnz,
        is_fixed_length=bool(entry.get("is_fixed_length", False)),
    )


def _lookup(obj: Any, field: str) -> Any:
    """Value at a dotted path whose parts may index lists (``sparse[0].slot_num``)."""
    for part in field.split("."):
        key, *indices = _PATH_PART.findall(part)
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
        for index in map(int, indices):
            if not isinstance(obj, list) or index >= len(obj):
                return _MISSING
            obj = obj[index]
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _skip_whitespace(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()


def _layer_offsets(text: str) -> list[int]:
    """Character offsets of the elements of the top-level ``layers`` array.

    ``json`` reports no positions, so this walks the top-level object with ``raw_decode``
    (the text is known to be valid JSON by now); the last ``layers`` key wins, as in ``json``.
    """
    decoder = json.JSONDecoder()
    offsets: list[int] = []
    pos = _skip_whitespace(text, 0) + 1  # past '{'
    while True:
        pos = _skip_whitespace(text, pos)
        if text[pos] == "}":
            return offsets
        key, pos = decoder.raw_decode(text, pos)
        pos = _skip_whitespace(text, _skip_whitespace(text, pos) + 1)  # past ':'
        if key == "layers" and text[pos] == "[":
            offsets, pos = _array_offsets(decoder, text, pos)
        else:
            pos = decoder.raw_decode(text, pos)[1]
        pos = _skip_whitespace(text, pos)
        pos += 1  # past ',' or '}'
        if text[pos - 1] == "}":
            return offsets


def _array_offsets(decoder: json.JSONDecoder, text: str, pos: int) -> tuple[list[int], int]:
    offsets = []
    pos = _skip_whitespace(text, pos + 1)  # past '['
    if text[pos] == "]":
        return offsets, pos + 1
    while True:
        pos = _skip_whitespace(text, pos)
        offsets.append(pos)
        pos = _skip_whitespace(text, decoder.raw_decode(text, pos)[1])
        pos += 1  # past ',' or ']'
        if text[pos - 1] == "]":
            return offsets, pos
