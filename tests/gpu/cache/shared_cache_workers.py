"""Process bodies for test_shared_cache_gpu.py (spawned: each one is a fresh CUDA process).

A vector is a function of its key (``vectors``), so any process can check any hit exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DIM = 32
NUM_SETS = 64  # 4,096 slots for a universe of 50,000 keys: constant eviction
UNIVERSE = 50_000


def vectors(keys: np.ndarray, dim: int = DIM) -> np.ndarray:
    """Row ``key * (1 .. dim)``: exact in float32 for keys below 2**16 and dim below 128."""
    return keys.astype(np.float32)[:, None] * np.arange(1, dim + 1, dtype=np.float32)


def open_cache(name: str) -> tuple[Any, Any]:
    """Join (or build) group ``name`` on GPU 0 and map its one table's cache."""
    from hps_core.cache.cupy_cache import CupyDynamicCache
    from hps_core.cache.ipc_group import SharedCacheGroup

    group = SharedCacheGroup(name, 1, 0)
    cache = CupyDynamicCache(NUM_SETS, DIM, name="shared", group=group, group_index=0)
    return group, cache


def hammer(name: str, seed: int, rounds: int, start: Any, results: Any) -> None:
    """Query random batches, check every hit, insert the misses; report wrong hits."""
    import cupy

    group, cache = open_cache(name)
    start.wait()
    rng = np.random.default_rng(seed)
    wrong = hits = 0
    for _ in range(rounds):
        keys = rng.integers(0, UNIVERSE, int(rng.integers(1, 4096)))
        out, hit = cache.query(cupy.asarray(keys))
        hit_h, out_h = hit.get(), out.get()
        hits += int(np.count_nonzero(hit_h))
        wrong += int(np.count_nonzero(np.any(out_h[hit_h] != vectors(keys[hit_h]), axis=1)))
        misses = keys[~hit_h]
        cache.replace(misses, vectors(misses))
    del cache
    group.close()
    results.put((seed, wrong, hits, group.lead))


def lead_then_leave(name: str, keys: np.ndarray, joined: Any, done: Any) -> None:
    """Build the group, insert ``keys``, wait for the other process to join, then leave."""
    group, cache = open_cache(name)
    cache.replace(keys, vectors(keys))
    done.put(group.lead)
    joined.wait()
    del cache
    group.close()


def lookup_session(ps_json: str, scope: str, keys: np.ndarray, results: Any) -> None:
    """Look ``keys`` up through a sharing ModelLookup; report its flags and counters."""
    from hps_core.config import load_ps_config
    from hps_core.hps import gpu_engine
    from hps_core.lookup import LookupOptions, ModelLookup

    config = load_ps_config(ps_json)
    options = LookupOptions(share_caches=True, share_scope=scope)
    lookup = ModelLookup(config, config.models[0], 0, options, gpu_engine)
    lookup.lookup(0, keys)
    lookup.flush()
    counters = lookup.counters()[0]
    results.put((lookup.shares_caches, lookup.lead, counters.cache_hits))
    lookup.close()
