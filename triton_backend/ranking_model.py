"""Triton Python-backend models serving ranking models (embedding lookup + dense network).

Two classes share the model files and the engine and differ only in their request contract
(:mod:`triton_backend.ranking_contracts`); a model folder's ``1/model.py`` is one line::

    from triton_backend.ranking_model import HugeCTRRankingModel as TritonPythonModel
    from triton_backend.ranking_model import SamplesRankingModel as TritonPythonModel

``initialize`` validates config.pbtxt, the ps.json, every file it names, and the pairing of
tables with the network's embedding layers, and loads the dense network, so a broken model
fails to load with the reason; tables are opened by the first ``execute`` (``model_warmup``
in config.pbtxt makes that happen before the model is READY). All requests of one
``execute`` become one batch: one lookup per table, one forward pass. A bad request gets its
own ``INVALID_ARG`` response and the others are served. ``KIND_GPU`` instances look up
through their GPU's embedding caches and run the dense network with CuPy on that GPU;
``KIND_CPU`` instances use the host tier and NumPy.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np
import triton_python_backend_utils as pb_utils

from hps_core.errors import HPSError, RequestError
from hps_core.infer import RankingSession, SparseBatch, concat_batches, split_samples
from hps_core.lookup.devices import to_host
from hps_core.model_check import check_model_files
from triton_backend.lookup_service import LookupService, log_to_stderr
from triton_backend.model_settings import check_io, read_settings
from triton_backend.ranking_contracts import (
    CATCOLUMN,
    DENSE,
    DES,
    OUTPUT0,
    ROWINDEX,
    SCORE,
    SPARSE,
    HugeCTRContract,
    SamplesContract,
)
from triton_backend.tensors import error_response, input_array, output_tensor

logger = logging.getLogger("hps_core")

_TRITON_TYPES = {np.float32: "TYPE_FP32", np.int32: "TYPE_INT32", np.int64: "TYPE_INT64"}


class _RankingModel:
    """``TritonPythonModel`` of a ranking model; subclasses choose the contract."""

    #: input name -> NumPy dtype, in the order ``parse`` takes them.
    inputs: ClassVar[dict[str, type]]
    output: ClassVar[str]
    contract_type: ClassVar[type[HugeCTRContract] | type[SamplesContract]]

    def initialize(self, args: dict[str, str]) -> None:
        """Validate the model and load its dense network before Triton marks it loaded.

        Args:
            args: Triton's initialize arguments.
        """
        log_to_stderr()
        settings = read_settings(args)
        check_io(
            settings.config,
            inputs={name: _TRITON_TYPES[dtype] for name, dtype in self.inputs.items()},
            outputs={self.output: "TYPE_FP32"},
        )
        check_model_files(settings.ps_json, settings.hps_model)
        # The service and the session share one HPS lookup session: the service starts it
        # (tables, cache warm-up, refresher) on the first execute and publishes its metrics.
        self.service = LookupService(settings)
        self.session = RankingSession.open(
            settings.ps_json, settings.hps_model, settings.lookup_device
        )
        self.contract = self.contract_type(self.session.layout)
        layout = self.session.layout
        logger.info(
            "model '%s': ps.json %s, model '%s', %d dense, slots %s, %d outputs, %s instance%s",
            settings.triton_model,
            settings.ps_json,
            settings.hps_model,
            layout.dense_dim,
            list(layout.slot_nums),
            layout.label_dim,
            settings.instance_kind,
            "" if settings.lookup_device is None else f" on GPU {settings.lookup_device}",
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer a batch of requests with one lookup per table and one forward pass.

        Args:
            requests: Triton inference requests.

        Returns:
            One response per request, in order.
        """
        responses: list[Any] = [None] * len(requests)
        batches: list[SparseBatch] = []
        served: list[int] = []
        for i, request in enumerate(requests):
            try:
                arrays = [
                    to_host(input_array(request, name, dtype))
                    for name, dtype in self.inputs.items()
                ]
                batches.append(self.contract.parse(*arrays))
            except RequestError as exc:
                responses[i] = error_response(str(exc))
                continue
            served.append(i)
        if batches:
            try:
                self.service.session()
                scores = self.session.predict(concat_batches(batches))
                pieces = split_samples(scores, [b.batch_size for b in batches])
                for i, piece in zip(served, pieces, strict=True):
                    out = output_tensor(self.output, self.contract.response(piece))
                    responses[i] = pb_utils.InferenceResponse(output_tensors=[out])
            except HPSError as exc:
                # The server side failed (e.g. a sparse file vanished): every request of the
                # batch learns why, and the next execute tries again.
                logger.error("prediction failed: %s", exc)
                for i in served:
                    responses[i] = error_response(
                        f"prediction failed: {exc}", pb_utils.TritonError.INTERNAL
                    )
        self.service.report()
        return responses

    def finalize(self) -> None:
        """Stop background work and detach from the shared tables."""
        self.service.close()


class HugeCTRRankingModel(_RankingModel):
    """HugeCTR's ``hugectr`` backend contract: ``DES``, ``CATCOLUMN``, ``ROWINDEX`` ->
    ``OUTPUT0``."""

    inputs: ClassVar[dict[str, type]] = {DES: np.float32, CATCOLUMN: np.int64, ROWINDEX: np.int32}
    output: ClassVar[str] = OUTPUT0
    contract_type: ClassVar[type[HugeCTRContract]] = HugeCTRContract


class SamplesRankingModel(_RankingModel):
    """One sample per row of Triton's batch: ``dense``, ``sparse`` -> ``score``."""

    inputs: ClassVar[dict[str, type]] = {DENSE: np.float32, SPARSE: np.int64}
    output: ClassVar[str] = SCORE
    contract_type: ClassVar[type[SamplesContract]] = SamplesContract
