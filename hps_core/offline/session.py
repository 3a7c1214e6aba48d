"""HugeCTR's ``CreateInferenceSession`` and ``InferenceSession``: one model's predictions of
arrays (and of datasets), as HugeCTR's ``inference_wrapper.hpp`` binds them.

``CreateInferenceSession(model_config_path, inference_params)`` returns an
:class:`InferenceSession`; its ``predict(dense_feature, embeddingcolumns, row_ptrs)`` returns
the predictions as HugeCTR does, a Python list of floats, sample by sample. Underneath it is an
:class:`~hps_core.offline.model.InferenceModel`.

Example:
    >>> session = CreateInferenceSession("wdl.json", params)  # doctest: +SKIP
    >>> session.predict([0.1] * 13, [3, 7, 11], [0, 1, 2, 0, 1])  # doctest: +SKIP
    [0.4981]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hps_core.offline.model import InferenceModel
from hps_core.offline.params import Check_t, DataReaderType_t, InferenceParams


class InferenceSession:
    """HugeCTR's ``hugectr.inference.InferenceSession`` over an :class:`InferenceModel`.

    Args:
        model: the model it predicts with.
    """

    def __init__(self, model: InferenceModel) -> None:
        self.model = model

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """Predict as HugeCTR's ``InferenceSession.predict``, two ways:

        - ``predict(dense_feature, embeddingcolumns, row_ptrs)``: one batch of arrays (lists
          or NumPy; see :meth:`InferenceModel.predict_arrays`). Returns a list of
          ``B * label_dim`` floats, sample by sample (HugeCTR returns a list too; with
          ``label_dim`` above 1 its list is ``B`` long and drops the rest).
        - ``predict(num_batches, source, data_reader_type, check_type, slot_size_array=[],
          num_samples=0, data_source_params=None)``: a float32 NumPy array of
          ``max_batchsize * num_batches`` predictions, 1-D when ``label_dim`` is 1, as
          HugeCTR returns it.

        Raises:
            RequestError: the arrays or arguments are refused (each named).
        """
        if "num_batches" in kwargs or _is_count(args[0] if args else None):
            call = _batch_call(args, kwargs)
            scores = self.model.predict_batches(**call)
            return scores[:, 0] if scores.shape[1] == 1 else scores
        scores = self.model.predict_arrays(*args, **kwargs)
        return scores.reshape(-1).tolist()

    def evaluate(
        self,
        num_batches: int,
        source: str | os.PathLike[str],
        data_reader_type: Any = DataReaderType_t.Parquet,
        check_type: Any = Check_t.Non,
        slot_size_array: Sequence[int] = (),
        num_samples: int = 0,
        data_source_params: Any = None,
    ) -> float:
        """HugeCTR's ``InferenceSession.evaluate``: the AUC of ``num_batches`` batches of a
        labelled Parquet dataset (``num_samples`` is accepted: Parquet files give their
        sizes)."""
        return self.model.evaluate(
            num_batches,
            source,
            data_reader_type,
            check_type,
            slot_size_array,
            data_source_params=data_source_params,
        )

    def refresh_embedding_cache(self) -> None:
        """HugeCTR copies updated rows from the parameter server into the GPU cache here;
        this HPS applies updates to the GPU caches as they arrive, so there is nothing to do."""

    def close(self) -> None:
        """Release the model's tables."""
        self.model.close()


def _is_count(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _batch_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = (
        "num_batches",
        "source",
        "data_reader_type",
        "check_type",
        "slot_size_array",
        "num_samples",
        "data_source_params",
    )
    if len(args) > len(names):
        raise TypeError(f"predict() takes at most {len(names)} arguments, got {len(args)}")
    call = dict(zip(names, args, strict=False)) | kwargs
    call.pop("num_samples", None)
    return call


def CreateInferenceSession(
    model_config_path: str | os.PathLike[str], inference_params: InferenceParams
) -> InferenceSession:
    """HugeCTR's ``hugectr.inference.CreateInferenceSession``: a session of the model that
    ``model_config_path`` (the network JSON) and ``inference_params`` describe.

    Raises:
        ConfigError: a field of ``inference_params`` is refused (naming it), or the files do
            not fit together.
    """
    return InferenceSession(InferenceModel(model_config_path, inference_params))
