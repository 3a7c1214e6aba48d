"""The process-wide HPS object, like HugeCTR's Python ``hugectr.inference.HPS``.

``HPS(ps_json)`` returns the one instance of this process for that ps.json, creating it on
first use; models and their tables are opened lazily, on their first lookup (implicit
initialisation: a Triton model needs no explicit init call). Safe to share between threads.
A model's lookups on a GPU go through the cache bank's kernels (:func:`gpu_engine`).

Example:
    >>> from hps_core import HPS  # doctest: +SKIP
    >>> hps = HPS("ps.json")  # doctest: +SKIP
    >>> vectors = hps.lookup(np.array([1, 2, 3], dtype=np.int64), "wdl", 0)  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hps_core.arrays import to_host
from hps_core.config import PSConfig, load_ps_config
from hps_core.errors import ConfigError, Problem, RequestError
from hps_core.lookup import LookupOptions, ModelLookup
from hps_core.lookup.model_lookup import DEFAULT_OPTIONS
from hps_core.nn.layers.embedding import Combiner


def gpu_engine(lookup: ModelLookup) -> Any:
    """The GPU lookup engine of a model lookup on a GPU, which every GPU lookup of the HPS
    answers through: the cache bank's kernels
    (:class:`~hps_core.infer.gpu.bank_lookup.BankLookup`, the ranking pipeline's
    ``bank_find``/``bank_pool``/``bank_insert``), imported only then."""
    from hps_core.infer.gpu.bank_lookup import BankLookup

    return BankLookup(lookup)


def _combiner(
    combiner: str | Combiner | None, hotness: int | None, offsets: Any
) -> Combiner | None:
    """How a lookup pools: None (a row per key) unless it has a hotness or offsets, then
    ``combiner`` (sum by default)."""
    if hotness is None and offsets is None:
        if combiner is not None:
            raise RequestError("a combiner pools bags: give hotness or offsets with it")
        return None
    if hotness is not None and offsets is not None:
        raise RequestError("give hotness or offsets, not both")
    if combiner is None:
        return Combiner.SUM
    try:
        return Combiner(combiner)
    except ValueError:
        raise RequestError(f"combiner must be 'sum' or 'mean', got {combiner!r}") from None


def _as_keys(keys: Any) -> np.ndarray:
    keys = np.asarray(keys)
    if keys.dtype.kind not in "iu":
        raise RequestError(f"keys must be integers, got {keys.dtype}")
    return keys.astype(np.int64, copy=False).ravel()


class HPS:
    """Hierarchical parameter server of one ps.json in this process.

    Args:
        ps_config: path of the ps.json.
    """

    _instances: ClassVar[dict[Path, HPS]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()
    _resolved: ClassVar[dict[str, Path]] = {}

    def __new__(cls, ps_config: str | os.PathLike[str]) -> HPS:
        given = os.fspath(ps_config)
        # A model's layers ask for their HPS on every forward: an absolute path is resolved
        # once (resolving stats each component of it).
        path = cls._resolved.get(given) if os.path.isabs(given) else None
        if path is None:
            path = Path(given).resolve()
            if os.path.isabs(given):
                cls._resolved[given] = path
        with cls._instances_lock:
            instance = cls._instances.get(path)
            if instance is None:
                instance = super().__new__(cls)
                instance._init(load_ps_config(path))
                cls._instances[path] = instance
        return instance

    def _init(self, config: PSConfig) -> None:
        self.config = config
        self._lookups: dict[tuple[str, int | None, LookupOptions], ModelLookup] = {}
        self._holders: dict[tuple[str, int | None, LookupOptions], int] = {}  # open_model's
        # The options of a served model's lookup (open_model(..., served=True)): what a
        # model's own layers (hps_torch) get from model() without options in that process.
        self._served: dict[tuple[str, int | None], LookupOptions] = {}
        self._lock = threading.Lock()

    @classmethod
    def get(cls, ps_config: str | os.PathLike[str]) -> HPS:
        """The instance for ``ps_config`` (same as calling ``HPS(ps_config)``)."""
        return cls(ps_config)

    def model(
        self,
        model_name: str,
        device_id: int | None = None,
        options: LookupOptions | None = None,
    ) -> ModelLookup:
        """The lookup of ``model_name`` on a device with ``options``, created on first use
        (one per model, device and options in this process; its tables open on first use).

        Args:
            model_name: a ``model`` name of the ps.json.
            device_id: GPU whose embedding caches serve the lookups; ``None``: the host tier.
            options: how it serves (shared GPU caches); ``None``: those of the lookup a
                Triton instance of this process serves the model with (:meth:`open_model`
                with ``served``), else the defaults.

        Returns:
            Its :class:`~hps_core.lookup.ModelLookup`.
        """
        if options is None:
            options = self._served.get((model_name, device_id), DEFAULT_OPTIONS)
        key = (model_name, device_id, options)
        lookup = self._lookups.get(key)
        if lookup is None:
            with self._lock:
                lookup = self._lookups.get(key)
                if lookup is None:
                    model = self.config.model(model_name)
                    lookup = ModelLookup(self.config, model, device_id, options, gpu_engine)
                    self._lookups[key] = lookup
        return lookup

    def open_model(
        self,
        model_name: str,
        device_id: int | None = None,
        options: LookupOptions = DEFAULT_OPTIONS,
        served: bool = False,
    ) -> ModelLookup:
        """:meth:`model`, held until the holder's :meth:`close_model`: a lookup two holders
        opened (two Triton instances of one model in one process, say) closes with the last.

        Args:
            model_name: a ``model`` name of the ps.json.
            device_id: GPU whose embedding caches serve the lookups; ``None``: the host tier.
            options: how it serves.
            served: the lookup a Triton instance serves the model with: :meth:`model`
                without options returns it (a user's PyTorch layers then look up through
                the instance's caches, counters and updates) until it is closed.

        Returns:
            Its :class:`~hps_core.lookup.ModelLookup`.
        """
        lookup = self.model(model_name, device_id, options)  # an unknown model holds nothing
        key = (model_name, device_id, options)
        with self._lock:
            self._holders[key] = self._holders.get(key, 0) + 1
            if served:
                self._served[(model_name, device_id)] = options
        return lookup

    def close_model(
        self,
        model_name: str,
        device_id: int | None = None,
        options: LookupOptions = DEFAULT_OPTIONS,
    ) -> None:
        """Release one hold (:meth:`open_model`) of the lookup :meth:`model` made for these
        arguments; once none is left, detach it from its tables and forget it (the instance's
        other lookups stay open). Nothing if there is none."""
        key = (model_name, device_id, options)
        with self._lock:
            held = self._holders.pop(key, 0) - 1
            if held > 0:
                self._holders[key] = held
                return
            lookup = self._lookups.pop(key, None)
            if self._served.get((model_name, device_id)) == options:
                del self._served[(model_name, device_id)]
        if lookup is not None:
            lookup.close()

    def lookup(
        self,
        keys: np.ndarray,
        model_name: str,
        table_id: int,
        device_id: int | None = None,
        *,
        hotness: int | None = None,
        offsets: np.ndarray | None = None,
        combiner: str | Combiner | None = None,
    ) -> np.ndarray:
        """Embedding vectors of ``keys`` in one table, like HugeCTR's ``HPS.lookup``; with
        ``hotness`` or ``offsets``, pooled per bag (an ``EmbeddingBag``).

        Args:
            keys: integer keys (any shape; flattened).
            model_name: a model of the ps.json.
            table_id: index of the table in the model's ``sparse_files``.
            device_id: GPU whose embedding cache to use; ``None`` reads the host tier.
            hotness: pool bags of this many consecutive keys (``len(keys)`` a multiple).
            offsets: pool CSR bags: bag ``i`` is ``keys[offsets[i]:offsets[i + 1]]``
                (``bags + 1`` integers rising from 0 to ``len(keys)``).
            combiner: ``"sum"`` (the default of a pooled lookup) or ``"mean"``.

        Returns:
            NumPy float32 ``[len(keys), dim]``, or ``[bags, dim]`` pooled (an empty bag pools
            to zeros); the table's default vector for unknown keys.

        Raises:
            RequestError: unknown model or table, keys, hotness or offsets that do not fit.

        Example:
            >>> hps.lookup(keys, "dlrm", 0, hotness=20, combiner="mean")  # doctest: +SKIP
        """
        keys = _as_keys(keys)
        how = _combiner(combiner, hotness, offsets)
        if offsets is not None:
            offsets = np.asarray(offsets)
        lookup = self.model(model_name, device_id)
        return to_host(lookup.lookup_pooled(table_id, keys, how, hotness, offsets))

    def lookup_fromdlpack(
        self,
        keys: Any,
        out: Any,
        model_name: str,
        table_id: int,
        device_id: int,
        *,
        hotness: int | None = None,
        offsets: Any = None,
        combiner: str | Combiner | None = None,
    ) -> None:
        """Look up keys held in a DLPack tensor, writing into a DLPack tensor, on the GPU.

        Like HugeCTR's ``HPS.lookup_fromdlpack``: the keys never visit the host (missed rows
        are read from the host tier in place, over PCIe). The lookup is ordered on the
        caller's current CUDA stream: work queued after this call sees the answer.

        Args:
            keys: DLPack-capable int64 keys on GPU ``device_id`` (e.g. a CuPy or PyTorch tensor).
            out: DLPack-capable C-contiguous float32 ``[len(keys), dim]`` tensor on the same
                GPU; ``[bags, dim]`` pooled.
            model_name: a model of the ps.json.
            table_id: index of the table.
            device_id: the GPU.
            hotness, offsets, combiner: pooled bags, as :meth:`lookup` takes them
                (``offsets`` a DLPack-capable integer tensor on the same GPU).
        """
        lookup = self.model(model_name, device_id)
        lookup.table(table_id)  # rejects a table_id out of range
        how = _combiner(combiner, hotness, offsets)
        xp = lookup.xp
        with xp.cuda.Device(device_id):
            key_array = xp.from_dlpack(keys)
            out_array = xp.from_dlpack(out)
            offsets_array = None if offsets is None else xp.from_dlpack(offsets)
            if key_array.dtype != xp.int64:
                raise RequestError(f"keys must be int64, got {key_array.dtype}")
            lookup.lookup_pooled(
                table_id, key_array.ravel(), how, hotness, offsets_array, out=out_array
            )

    def close(self) -> None:
        """Detach from every table and forget this instance."""
        with self._lock:
            for lookup in self._lookups.values():
                lookup.close()
            self._lookups.clear()
            self._holders.clear()
            self._served.clear()
        with self._instances_lock:
            path = self.config.source_path
            if path is not None and self._instances.get(Path(path).resolve()) is self:
                del self._instances[Path(path).resolve()]

    @classmethod
    def close_all(cls) -> None:
        """Close every instance of this process (used at Triton ``finalize``, and at exit)."""
        for instance in list(cls._instances.values()):
            instance.close()


def init(ps_config_file: str | os.PathLike[str], global_batch_size: int) -> str:
    """Initialise the HPS of a ps.json now, as HugeCTR's plugins' ``hps.Init`` does: check
    the batch size against every model and open every table, so the first lookup finds them
    loaded. Optional, as in HugeCTR since v4.0: :class:`HPS` opens tables on first use.

    Args:
        ps_config_file: the ps.json.
        global_batch_size: samples per batch over all of a model's ``deployed_device_list``
            (each device takes an equal share, at most the model's ``max_batch_size``).

    Returns:
        ``"OK"``, as HugeCTR's.

    Raises:
        ConfigError: the ps.json is invalid, or the batch does not fit a model (naming the
            model's field).

    Example:
        >>> from hps_core import hps  # doctest: +SKIP
        >>> hps.Init(global_batch_size=1024, ps_config_file="ps.json")  # doctest: +SKIP
        'OK'
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int):
        raise ConfigError(
            f"expected an integer >= 1, got {global_batch_size!r}", "global_batch_size"
        )
    if global_batch_size < 1:
        raise ConfigError(f"must be > 0, got {global_batch_size}", "global_batch_size")
    instance = HPS(ps_config_file)
    problems = []
    for index, model in enumerate(instance.config.models):
        replicas = len(model.deployed_device_list)
        local = global_batch_size // replicas
        where = f"models[{index}] (model '{model.name}')"
        if global_batch_size % replicas:
            problems.append(
                Problem(
                    f"{where}.deployed_device_list",
                    f"global_batch_size {global_batch_size} is not divisible by its "
                    f"{replicas} devices",
                )
            )
        elif local > model.max_batch_size:
            problems.append(
                Problem(
                    f"{where}.max_batch_size",
                    f"{model.max_batch_size} is less than global_batch_size / devices = "
                    f"{global_batch_size} / {replicas} = {local}",
                )
            )
    if problems:
        raise ConfigError(problems)
    for model in instance.config.models:
        lookup = instance.model(model.name)
        for table_id in range(lookup.num_tables):
            lookup.table(table_id)
    return "OK"


def Init(**kwargs: Any) -> str:
    """HugeCTR's TensorFlow plugin's ``hps.Init(global_batch_size=..., ps_config_file=...)``
    (keyword arguments only): :func:`init`."""
    unknown = set(kwargs) - {"global_batch_size", "ps_config_file"}
    missing = {"global_batch_size", "ps_config_file"} - set(kwargs)
    if unknown or missing:
        raise TypeError(
            "Init() takes the keyword arguments global_batch_size and ps_config_file"
            + (f"; unknown: {', '.join(sorted(unknown))}" if unknown else "")
            + (f"; missing: {', '.join(sorted(missing))}" if missing else "")
        )
    return init(kwargs["ps_config_file"], kwargs["global_batch_size"])


_IMPORTED_BY = os.getpid()


def _close_at_exit() -> None:
    # A script that never calls close() still releases GPU mappings and host-tier segments
    # in order (the last process using a segment removes it); a forked child does not close
    # what its parent opened.
    if os.getpid() == _IMPORTED_BY:
        # Exiting: a failure here (a CUDA context already torn down) must not turn a clean
        # exit into a traceback; segments left open are detached by shm_segment's own hook.
        with contextlib.suppress(Exception):
            HPS.close_all()


atexit.register(_close_at_exit)
