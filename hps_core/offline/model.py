"""Offline scoring of a ranking model, in the shape of HugeCTR's Python inference API."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hps_core.arrays import first_gpu
from hps_core.config import load_ps_config
from hps_core.errors import OVERWRITE_HINT, ModelFileError, RequestError
from hps_core.formats.progress import RowProgress
from hps_core.infer.contracts import HugeCTRContract
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout
from hps_core.infer.session import RankingSession
from hps_core.nn import DenseExecutor, build_graph, load_network_json
from hps_core.offline.dataset import (
    DatasetColumns,
    dataset_columns,
    dataset_files,
    dataset_rows,
    iter_dataset,
    read_ahead,
)
from hps_core.offline.metrics import auc


@dataclass(frozen=True)
class DatasetPredictions:
    """The predictions of a whole dataset.

    Args:
        scores: float32 ``[samples, label_dim]``.
        labels: float32 ``[samples, label_dim]``, or None for a dataset without labels.
        columns: the dataset's columns that were read.
    """

    scores: np.ndarray
    labels: np.ndarray | None
    columns: DatasetColumns

    def auc(self) -> float:
        """AUC of the first label and prediction (HugeCTR's ``evaluate``).

        Raises:
            RequestError: the dataset has no labels, or only one class.
        """
        if self.labels is None:
            raise RequestError("the dataset has no label columns: no AUC")
        if not len(self.labels):
            raise RequestError("the dataset has no rows: no AUC")
        return auc(self.labels[:, 0], self.scores[:, 0], f"label column '{self.columns.labels[0]}'")


class InferenceModel:
    """A ranking model scored in this process: HugeCTR's ``InferenceModel`` /
    ``InferenceSession`` for offline prediction.

    On a GPU (``device_id``) batches run through the GPU pipeline (embedding caches, CUDA
    graphs); without one, on the CPU with NumPy. Each table's rows are read once into the
    machine's shared host tier.

    Args:
        session: the loaded model.

    Example:
        >>> model = InferenceModel.from_ps_json("ps.json", "dlrm")  # doctest: +SKIP
        >>> model.predict_dataset("val.parquet").auc()  # doctest: +SKIP
        0.79
        >>> model.check_out_tensor("interaction1").shape  # doctest: +SKIP
        (1024, 480)
    """

    def __init__(self, session: RankingSession) -> None:
        self.session = session
        self._contract = HugeCTRContract(session.layout)
        self._last: SparseBatch | None = None
        self._debug: DenseExecutor | None = None

    @classmethod
    def from_ps_json(
        cls,
        ps_json: str | os.PathLike[str],
        model_name: str | None = None,
        device_id: int | str | None = "auto",
        precision: str | None = None,
    ) -> InferenceModel:
        """Open a model of a ps.json (its ``network_file``, ``dense_file`` and tables).

        Args:
            ps_json: the ps.json.
            model_name: the model (default: the only one).
            device_id: GPU to score on; None: the CPU; ``"auto"``: GPU 0 when there is one,
                else the CPU.
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``; ``None``: the ps.json's
                ``use_mixed_precision`` (FP16), else FP32, as served.

        Returns:
            The model.

        Raises:
            ConfigError: no such model, or the ps.json and the network disagree.
        """
        if device_id == "auto":
            device_id = first_gpu()
        elif device_id == "cpu":  # as hps predict --device cpu
            device_id = None
        if model_name is None:
            models = load_ps_config(ps_json).models
            if len(models) != 1:
                names = ", ".join(m.name for m in models)
                raise RequestError(f"{ps_json} has {len(models)} models ({names}): name one")
            model_name = models[0].name
        return cls(RankingSession.open(ps_json, model_name, device_id, precision))

    @classmethod
    def from_files(
        cls,
        network_file: str | os.PathLike[str],
        dense_file: str | os.PathLike[str],
        sparse_files: Sequence[str | os.PathLike[str]],
        *,
        model_name: str = "model",
        max_batch_size: int = 1024,
        default_values: Sequence[float] | None = None,
        device_id: int | str | None = "auto",
        precision: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
    ) -> InferenceModel:
        """Open a model from HugeCTR's files without a ps.json, as ``InferenceParams`` names
        them (a ps.json for them is written to ``workdir``).

        Args:
            network_file: the network JSON.
            dense_file: the dense model file.
            sparse_files: one sparse model folder per embedding layer, in the network's order.
            model_name: the model's name.
            max_batch_size: most samples per batch (HugeCTR's ``max_batchsize``).
            default_values: the vector value of unknown keys per table (default 0).
            device_id: as :meth:`from_ps_json`.
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``; ``None``: the ps.json's
                ``use_mixed_precision`` (FP16), else FP32, as served.
            workdir: folder for the generated ps.json (default: a new temporary folder).

        Returns:
            The model.

        Raises:
            ConfigError: the files do not fit together (each problem named).
        """
        graph = build_graph(load_network_json(network_file))
        embeddings = [node.layer for node in graph.embeddings]
        if len(sparse_files) != len(embeddings):
            raise RequestError(
                f"{network_file} has {len(embeddings)} embedding layers, "
                f"{len(sparse_files)} sparse files were given"
            )
        nnz = {s.name: s.nnz_per_slot for s in graph.spec.data.sparse}
        document = {
            "supportlonglong": True,
            "models": [
                {
                    "model": model_name,
                    "network_file": str(Path(network_file).resolve()),
                    "dense_file": str(Path(dense_file).resolve()),
                    "sparse_files": [str(Path(p).resolve()) for p in sparse_files],
                    "embedding_vecsize_per_table": [e.vec_size for e in embeddings],
                    "maxnum_catfeature_query_per_table_per_sample": [
                        e.slot_num * nnz[e.sparse_input] for e in embeddings
                    ],
                    "default_value_for_each_table": list(
                        default_values if default_values is not None else [0.0] * len(embeddings)
                    ),
                    "maxnum_des_feature_per_sample": graph.spec.data.dense_dim,
                    "max_batch_size": max_batch_size,
                    "deployed_device_list": [device_id if isinstance(device_id, int) else 0],
                }
            ],
        }
        folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="hps-"))
        folder.mkdir(parents=True, exist_ok=True)
        ps_json = folder / f"{model_name}_ps.json"
        ps_json.write_text(json.dumps(document, indent=2))
        return cls.from_ps_json(ps_json, model_name, device_id, precision)

    @property
    def layout(self) -> RankingLayout:
        """The model's tables, slots and widths."""
        return self.session.layout

    # -- scoring ------------------------------------------------------------------------------

    def predict(self, dense: Any, keys: Any, row_ptrs: Any) -> np.ndarray:
        """Predict one batch given as HugeCTR's ``predict(dense, embeddingcolumns, row_ptrs)``
        takes it (the ``hugectr`` backend's ``DES``, ``CATCOLUMN``, ``ROWINDEX``; see
        :mod:`hps_core.infer.contracts`).

        Args:
            dense: ``B * dense_dim`` floats, sample by sample.
            keys: the keys, sample-major (sample 0's keys of every table, then sample 1's).
            row_ptrs: per table ``B * S_t + 1`` offsets, concatenated in table order.

        Returns:
            float32 ``[B, label_dim]``.

        Raises:
            RequestError: the arrays do not describe a valid batch (naming which).
        """
        batch = self._contract.parse(
            np.asarray(dense, dtype=np.float32).reshape(-1),
            np.asarray(keys, dtype=np.int64).reshape(-1),
            np.asarray(row_ptrs, dtype=np.int32).reshape(-1),
        )
        return self.predict_batch(batch)

    def predict_batch(self, batch: SparseBatch) -> np.ndarray:
        """Predict a :class:`~hps_core.infer.SparseBatch` (up to ``max_batch_size``).

        Returns:
            float32 ``[B, label_dim]`` on the host.
        """
        scores = self.session.predict(batch)
        self._last = batch
        return np.asarray(scores.get() if hasattr(scores, "get") else scores, np.float32)

    def predict_dataset(
        self,
        source: str | os.PathLike[str],
        columns: DatasetColumns | None = None,
        batch_size: int | None = None,
        progress: bool | None = None,
    ) -> DatasetPredictions:
        """Predict every sample of a Parquet dataset (see :mod:`hps_core.offline.dataset`).

        Args:
            source: a Parquet file, a folder of them, or HugeCTR's ``_file_list.txt``.
            columns: the columns to read (default: ``_metadata.json``, else Criteo's names
                when the files use them, else by position).
            batch_size: samples per batch (default and most: the model's ``max_batch_size``).
            progress: report progress (a bar on a terminal, else log lines); None: for
                datasets of more than a million rows.

        Returns:
            Scores and labels of every sample, in file and row order.

        Raises:
            ModelFileError: the dataset does not fit the model (naming file and column).
        """
        files = dataset_files(source)
        columns = columns or dataset_columns(files, self.layout, source)
        size = min(batch_size or self.layout.max_batch_size, self.layout.max_batch_size)
        total = dataset_rows(files)
        scores, labels = [], []
        enabled = total > 1_000_000 if progress is None else progress
        with RowProgress(total, f"scoring {source}", enabled) as bar:
            batches = iter_dataset(files, columns, self.layout, size)
            if self.session.xp is not np:
                # On a GPU the next batches are read while this one is scored (on the CPU both
                # would take the same cores: 36.9K against 38.9K rows/s on the 2-core machine).
                batches = read_ahead(batches)
            for batch in batches:
                scores.append(self.predict_batch(batch.samples))
                if batch.labels is not None:
                    labels.append(batch.labels)
                bar.update(batch.samples.batch_size)
        width = self.layout.label_dim
        return DatasetPredictions(
            np.concatenate(scores) if scores else np.empty((0, width), np.float32),
            np.concatenate(labels)
            if labels
            else np.empty((0, len(columns.labels)), np.float32)
            if columns.labels
            else None,
            columns,
        )

    def evaluate(self, source: str | os.PathLike[str], **options: Any) -> float:
        """AUC of a labelled dataset (HugeCTR's ``evaluate``); options as
        :meth:`predict_dataset`."""
        return self.predict_dataset(source, **options).auc()

    # -- debugging ----------------------------------------------------------------------------

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """Names :meth:`check_out_tensor` answers: the dense input, each embedding layer's
        pooled output and every layer's output, in execution order."""
        graph = self.session.executor.graph
        names = [graph.spec.data.dense_name]
        for node in graph.nodes:
            if node.used:
                names.extend(node.spec.tops)
        return tuple(dict.fromkeys(names))

    def check_out_tensor(self, name: str) -> np.ndarray:
        """A named tensor of the network for the last batch predicted (HugeCTR's
        ``check_out_tensor``): every layer's own output, a ReLU's input included (the
        batch runs again, unfused, in the model's precision).

        Args:
            name: a tensor name (:attr:`tensor_names`).

        Returns:
            The tensor as float32 NumPy, samples first.

        Raises:
            RequestError: nothing was predicted yet, or no tensor has that name (the message
                lists the names).
        """
        if name not in self.tensor_names:
            raise RequestError(
                f"no tensor '{name}' in model '{self.layout.model}'; its tensors: "
                f"{', '.join(self.tensor_names)}"
            )
        if self._last is None:
            raise RequestError("check_out_tensor needs a prediction first")
        session = self.session
        if self._debug is None:
            self._debug = session.executor.unfused()
        with session.device():
            tensors = self._debug.tensors(
                session.xp.asarray(self._last.dense), session.embeddings(self._last)
            )
        value = tensors[name]
        return np.asarray(value.get() if hasattr(value, "get") else value, np.float32)

    def close(self) -> None:
        """Release the model's tables (its host tier is shared with other users)."""
        self.session.lookup.close()


def write_predictions(
    path: str | os.PathLike[str], result: DatasetPredictions, overwrite: bool = False
) -> Path:
    """Write a dataset's predictions as Parquet: the label columns (when there are any)
    next to one ``prediction`` column per label (``prediction_<i>`` for several).

    Args:
        path: the output file.
        result: :meth:`InferenceModel.predict_dataset`'s result.
        overwrite: replace an existing file.

    Returns:
        The path.

    Raises:
        ModelFileError: the file exists and ``overwrite`` is false.
    """
    out = Path(path)
    if out.exists() and not overwrite:
        raise ModelFileError(f"{out} exists; {OVERWRITE_HINT}")
    arrays, names = [], []
    if result.labels is not None:
        for j, name in enumerate(result.columns.labels):
            arrays.append(pa.array(result.labels[:, j]))
            names.append(name)
    width = result.scores.shape[1]
    for j in range(width):
        arrays.append(pa.array(result.scores[:, j]))
        names.append("prediction" if width == 1 else f"prediction_{j}")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(arrays, names=names), out)
    return out
