"""Triton Python-backend models serving ranking models (embedding lookup + dense network).

Two classes share the model files and the engine and differ only in their request contract
(:mod:`hps_core.infer.contracts`); a model folder's ``1/model.py`` is one line::

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

from hps_core.infer import RankingSession, SparseBatch, concat_batches, split_samples
from hps_core.infer.contracts import (
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
from hps_core.lookup.devices import to_host
from hps_core.model_check import check_model_files
from triton_backend.batched_execute import execute_batched
from triton_backend.lookup_service import LookupService, log_to_stderr
from triton_backend.model_settings import check_instance_device, check_io, read_settings
from triton_backend.tensors import input_array

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
        model = check_model_files(settings.ps_json, settings.hps_model)
        check_instance_device(settings, model.deployed_device_list, f"model '{model.name}'")
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
        responses = execute_batched(requests, self._parse, self._predict, self.output)
        self.service.report()
        return responses

    def _parse(self, request: Any) -> SparseBatch:
        arrays = [to_host(input_array(request, n, dtype)) for n, dtype in self.inputs.items()]
        return self.contract.parse(*arrays)

    def _predict(self, batches: list[SparseBatch]) -> list[Any]:
        self.service.session()  # first call: open tables, warm caches, start the refresher
        scores = self.session.predict(concat_batches(batches))
        pieces = split_samples(scores, [b.batch_size for b in batches])
        return [self.contract.response(piece) for piece in pieces]

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
