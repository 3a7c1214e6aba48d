"""ps.json fields hps-triton reads but that change nothing here, and what they do in HugeCTR.

HugeCTR's ps.json parser accepts them, so hps-triton does too (a user's file loads
unchanged); a value other than HugeCTR's default asks for something this project does not do
(or does anyway), which :func:`inert_settings` says, one line per field, for ``hps check`` and
the model's load log. ``fp8_quant`` acts on models with static GPU tables, as in HugeCTR, and
is listed only for the others; on a static model, the tables it leaves in FP32 (``dim`` 1 and
2) get a line each. The same lines name each key the file gives twice with different values,
and the value taken (the last, as HugeCTR's JSON reader takes it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from hps_core.config.schema import ModelConfig, PSConfig
from hps_core.quant import RowFormat, StoragePrecision

_MODEL_FIELDS: dict[str, str] = {
    "fp8_quant": (
        'it applies to static tables only (embedding_cache_type "static" or '
        "use_static_table, with gpucache), as in HugeCTR, which quantises them to FP8 with "
        'per-row scales; this model has none. "storage_precision" is this project\'s way to '
        "compress the tables of a dynamic cache"
    ),
    "use_hctr_cache_implementation": (
        "false selects HugeCTR's lock-free dynamic GPU cache instead of its original one; here "
        "the GPU cache has one implementation"
    ),
    "thread_pool_size": (
        "sizes HugeCTR's host thread pool for asynchronous inserts of missed keys; here "
        "inserts run on the GPU, with no host threads"
    ),
    "use_context_stream": (
        "makes HugeCTR's TensorFlow and TensorRT plugins look up on the framework's stream; "
        "Triton models never read it"
    ),
    "num_of_worker_buffer_in_pool": (
        "sizes HugeCTR's pool of per-lookup embedding-cache buffers; here a lookup takes none"
    ),
    "num_of_refresher_buffer_in_pool": (
        "sizes HugeCTR's pool of cache-refresh buffers; here a refresh takes none"
    ),
    "hit_rate_threshold": (
        "sets the batch hit rate below which HugeCTR inserts a batch's missed keys into the "
        "GPU cache before answering (above it, in the background, the misses answered with "
        "default vectors); GPU lookups here answer every miss with its true row and insert "
        "it after the answer, whatever the hit rate (as HugeCTR does at 1.0), so there is "
        "nothing to choose"
    ),
    "enable_pagelock": (
        "page-locks the host copy of HugeCTR's static tables; here the host tier is always "
        "page-locked for GPU instances"
    ),
}
_TOP_FIELDS: dict[str, str] = {
    "fuse_embedding_table": (
        "makes HugeCTR look up tables of equal dim through one fused table and cache; here "
        "each table keeps its own"
    ),
}

# Model fields that act here on some models: no warning for a model they act on.
_ACTS_ON: dict[str, Callable[[ModelConfig], bool]] = {
    "fp8_quant": lambda model: model.static_tables,
    # At 1.0 and above HugeCTR answers every miss with its true row too, as every GPU lookup
    # does here (no engine here chooses by it).
    "hit_rate_threshold": lambda model: model.hit_rate_threshold >= 1.0,
}


def _non_default(config: Any, names: dict[str, str]) -> list[tuple[str, Any, str]]:
    defaults = {f.name: f.default for f in fields(config)}
    return [
        (name, getattr(config, name), meaning)
        for name, meaning in names.items()
        if getattr(config, name) != defaults[name]
        and not (name in _ACTS_ON and _ACTS_ON[name](config))
    ]


def _fp8_kept_fp32(model: ModelConfig) -> list[str]:
    """Tables ``fp8_quant`` leaves in FP32 on a static model (dim 1 and 2: an FP8 row, the
    codes padded to 4 bytes and a 4-byte scale, would not be smaller; HugeCTR quantises them
    anyway), when no extension field decides their precision instead."""
    if not (model.fp8_quant and model.static_tables):
        return []
    if model.storage_precision is not None or model.storage_precision_per_table is not None:
        return []
    fp8 = StoragePrecision.FP8
    return [
        f"table '{t.name}' (dim {t.dim}) stays FP32: its FP8 row would take "
        f"{RowFormat(fp8, t.dim).row_bytes} bytes, its FP32 row takes {4 * t.dim}"
        for t in model.tables
        if t.storage is StoragePrecision.FP32
    ]


def inert_settings(config: PSConfig, model: ModelConfig | None = None) -> list[str]:
    """One line per field of ``config`` (and of ``model``, or of every model) set to a value
    other than HugeCTR's default although it has no effect here, naming where it is set and
    what HugeCTR would do with it; one line per table of a static model that
    ``fp8_quant`` leaves in FP32; and one line per key given twice with different values,
    naming the file and the value taken. ``hps check`` prints these lines, a model's load
    logs them.

    Args:
        config: the parsed ps.json.
        model: one of its models, or None for all of them.

    Returns:
        The lines, empty when every such field keeps its default.

    Example:
        >>> inert_settings(config)  # doctest: +SKIP
        ["models[0].fp8_quant = true (model 'wdl'): accepted without effect: HugeCTR ..."]
    """
    in_models = re.compile(r"models\[\d+\]")
    lines = [
        _repeated(config, where, values)
        for where, values in config.repeated_keys
        if not in_models.match(where)
    ]
    lines += [
        f"{name} = {_json(value)}: accepted without effect: {meaning}"
        for name, value, meaning in _non_default(config, _TOP_FIELDS)
    ]
    lines += [
        f"{name} = {_json(value)}: accepted without effect: a key of HugeCTR before v3.3, "
        "which ignores it since; volatile_db and persistent_db configure the tiers"
        for name, value in config.legacy_keys
    ]
    for index, entry in enumerate(config.models):
        if model is not None and entry is not model:
            continue
        lines += [
            _repeated(config, where, values)
            for where, values in config.repeated_keys
            if where.startswith(f"models[{index}].")
        ]
        lines += [
            f"models[{index}].{name} = {_json(value)} (model '{entry.name}'): accepted without "
            f"effect: {meaning}"
            for name, value, meaning in _non_default(entry, _MODEL_FIELDS)
        ]
        lines += [
            f"models[{index}].fp8_quant = true (model '{entry.name}'): {note}"
            for note in _fp8_kept_fp32(entry)
        ]
        lines += [f"models[{index}].{note} (model '{entry.name}')" for note in entry.notes]
    return lines


def _repeated(config: PSConfig, where: str, values: tuple[Any, ...]) -> str:
    """The line of a key given more than once with different values: where, how often, in
    which file, and the value taken."""
    shown = " then ".join(json.dumps(v) for v in values)
    file = "" if config.source_path is None else f" in {config.source_path}"
    return (
        f"{where} is given {len(values)} times{file} ({shown}): {json.dumps(values[-1])} is "
        "taken, the last, as HugeCTR's JSON reader takes it; keep only the one you mean"
    )


def _json(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)
