"""ps.json fields hps-triton reads but that change nothing here, and what they do in HugeCTR.

HugeCTR's ps.json parser accepts them, so hps-triton does too (a user's file loads
unchanged); a value other than HugeCTR's default asks for something this project does not do
(or does anyway), which :func:`inert_settings` says, one line per field, for ``hps check`` and
the model's load log.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hps_core.config.schema import ModelConfig, PSConfig

_MODEL_FIELDS: dict[str, str] = {
    "fp8_quant": (
        "HugeCTR stores the static tables' vectors in FP8 with per-row scales and dequantises "
        "them in the lookup; here every table stays FP32"
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


def _non_default(config: Any, names: dict[str, str]) -> list[tuple[str, Any, str]]:
    defaults = {f.name: f.default for f in fields(config)}
    return [
        (name, getattr(config, name), meaning)
        for name, meaning in names.items()
        if getattr(config, name) != defaults[name]
    ]


def inert_settings(config: PSConfig, model: ModelConfig | None = None) -> list[str]:
    """One line per field of ``config`` (and of ``model``, or of every model) set to a value
    other than HugeCTR's default although it has no effect here, naming where it is set and
    what HugeCTR would do with it.

    Args:
        config: the parsed ps.json.
        model: one of its models, or None for all of them.

    Returns:
        The lines, empty when every such field keeps its default.

    Example:
        >>> inert_settings(config)  # doctest: +SKIP
        ["models[0].fp8_quant = true: accepted without effect: HugeCTR stores ..."]
    """
    lines = [
        f"{name} = {_json(value)}: accepted without effect: {meaning}"
        for name, value, meaning in _non_default(config, _TOP_FIELDS)
    ]
    for index, entry in enumerate(config.models):
        if model is not None and entry is not model:
            continue
        lines += [
            f"models[{index}].{name} = {_json(value)} (model '{entry.name}'): accepted without "
            f"effect: {meaning}"
            for name, value, meaning in _non_default(entry, _MODEL_FIELDS)
        ]
    return lines


def _json(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
