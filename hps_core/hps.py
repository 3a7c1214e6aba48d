"""The process-wide HPS object, like HugeCTR's Python ``hugectr.inference.HPS``.

``HPS(ps_json)`` returns the one instance of this process for that ps.json, creating it on
first use; models and their tables are opened lazily, on their first lookup (implicit
initialisation: a Triton model needs no explicit init call). Safe to share between threads.

Example:
    >>> from hps_core import HPS  # doctest: +SKIP
    >>> hps = HPS("ps.json")  # doctest: +SKIP
    >>> vectors = hps.lookup(np.array([1, 2, 3], dtype=np.int64), "wdl", 0)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np

from hps_core.config import PSConfig, load_ps_config
from hps_core.errors import RequestError
from hps_core.lookup import ModelLookup


class HPS:
    """Hierarchical parameter server of one ps.json in this process.

    Args:
        ps_config: path of the ps.json.
    """

    _instances: ClassVar[dict[Path, HPS]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, ps_config: str | os.PathLike[str]) -> HPS:
        path = Path(ps_config).resolve()
        with cls._instances_lock:
            instance = cls._instances.get(path)
            if instance is None:
                instance = super().__new__(cls)
                instance._init(load_ps_config(path))
                cls._instances[path] = instance
        return instance

    def _init(self, config: PSConfig) -> None:
        self.config = config
        self._models: dict[str, ModelLookup] = {}
        self._lock = threading.Lock()

    @classmethod
    def get(cls, ps_config: str | os.PathLike[str]) -> HPS:
        """The instance for ``ps_config`` (same as calling ``HPS(ps_config)``)."""
        return cls(ps_config)

    def model(self, model_name: str) -> ModelLookup:
        """The lookup session of ``model_name``, created on first use.

        Args:
            model_name: a ``model`` name of the ps.json.

        Returns:
            Its :class:`~hps_core.lookup.ModelLookup`.
        """
        session = self._models.get(model_name)
        if session is None:
            with self._lock:
                session = self._models.get(model_name)
                if session is None:
                    session = ModelLookup(self.config, self.config.model(model_name))
                    self._models[model_name] = session
        return session

    def lookup(
        self, keys: np.ndarray, model_name: str, table_id: int, device_id: int = 0
    ) -> np.ndarray:
        """Embedding vectors of ``keys`` in one table, like HugeCTR's ``HPS.lookup``.

        Args:
            keys: int64 keys (any shape; flattened).
            model_name: a model of the ps.json.
            table_id: index of the table in the model's ``sparse_files``.
            device_id: GPU of the embedding cache; unused while lookups are host-only.

        Returns:
            float32 ``[len(keys), dim]``; the table's default vector for unknown keys.
        """
        del device_id  # the GPU cache tier is not in this version
        keys = np.asarray(keys)
        if keys.dtype != np.int64:
            if keys.dtype.kind not in "iu":
                raise RequestError(f"keys must be integers, got {keys.dtype}")
            keys = keys.astype(np.int64)
        return self.model(model_name).lookup(table_id, keys.ravel())

    def close(self) -> None:
        """Detach from every table and forget this instance."""
        with self._lock:
            for session in self._models.values():
                session.close()
            self._models.clear()
        with self._instances_lock:
            path = self.config.source_path
            if path is not None and self._instances.get(Path(path).resolve()) is self:
                del self._instances[Path(path).resolve()]

    @classmethod
    def close_all(cls) -> None:
        """Close every instance of this process (used at Triton ``finalize``)."""
        for instance in list(cls._instances.values()):
            instance.close()
