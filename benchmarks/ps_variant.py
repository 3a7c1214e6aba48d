"""A benchmark's copy of a model's ps.json with its cache kind and storage precision set."""

from __future__ import annotations

import json
from pathlib import Path


def ps_variant(
    ps_json: Path,
    cache: str,
    storage: str | None = None,
    tag: str = "bench",
    min_batch_size: int | None = None,
) -> Path:
    """Write a copy of ``ps_json`` (beside it) whose first model has the given settings.

    Args:
        ps_json: the model's ps.json.
        cache: ``"static"`` (static tables), or a ``gpucacheper`` value (a dynamic cache).
        storage: ``storage_precision`` of the tables; ``None`` keeps the file's.
        tag: part of the copy's name, so that scripts running beside each other do not
            overwrite each other's copies.
        min_batch_size: raise the model's ``max_batch_size`` to at least this.

    Returns:
        The copy's path.

    Example:
        >>> ps_variant(Path("/tmp/dlrm/ps.json"), "0.2", "fp16")  # doctest: +SKIP
        PosixPath('/tmp/dlrm/ps_bench_0.2_fp16.json')
    """
    ps = json.loads(ps_json.read_text())
    model = ps["models"][0]
    if storage is not None:
        model["storage_precision"] = storage
    if cache == "static":
        model["embedding_cache_type"] = "static"
    else:
        model["embedding_cache_type"] = "dynamic"
        model["gpucacheper"] = float(cache)
    if min_batch_size is not None:
        model["max_batch_size"] = max(model.get("max_batch_size", 0), min_batch_size)
    path = ps_json.parent / f"ps_{tag}_{cache}_{storage or 'stored'}.json"
    path.write_text(json.dumps(ps))
    return path
