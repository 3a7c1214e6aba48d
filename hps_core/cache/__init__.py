"""GPU embedding cache (CuPy kernels).

- :mod:`~hps_core.cache.layout`: sets, slots, the empty key; comparison with HugeCTR.
- :mod:`~hps_core.cache.dynamic`: the LRU cache's contract and shared code.
- its NumPy twin, the executable specification the CUDA cache is tested against, is in
  ``tests/unit/cache/cache_twin.py`` (no serving path uses it).
- :mod:`~hps_core.cache.cupy_cache`: CUDA implementation (imported only when CuPy is used);
  its kernels are ``hps_core/cuda/kernels/cache.cu`` (set helpers shared with the GPU pipeline
  in ``cache_set.cuh``), their constants :mod:`~hps_core.cache.kernel_consts`.
- :mod:`~hps_core.cache.static_table`: whole-table cache without eviction.
- :func:`make_cache`: picks one by kind.
"""

from hps_core.cache.dynamic import CacheState, DynamicCache
from hps_core.cache.factory import make_cache
from hps_core.cache.layout import EMPTY_KEY, WAYS, num_sets_for
from hps_core.cache.static_table import StaticTable
from hps_core.cache.stats import CacheStats

__all__ = [
    "EMPTY_KEY",
    "WAYS",
    "CacheState",
    "CacheStats",
    "DynamicCache",
    "StaticTable",
    "make_cache",
    "num_sets_for",
]
