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
from typing import Any

import numpy as np

from hps_core.arrays import module_of, to_host
from hps_core.errors import RequestError
from hps_core.host_memory import keep_freed_memory
from hps_core.infer import RankingSession, SparseBatch, concat_batches, split_samples
from hps_core.infer.contracts import HugeCTRContract, SamplesContract
from hps_core.infer.inputs.layout import RankingLayout
from hps_core.infer.model_io import ModelIO, hugectr_io, samples_io
from hps_core.infer.session import dense_precision
from hps_core.model_check import check_model_files
from hps_core.nn import Precision
from hps_core.wording import plural
from triton_backend.batched_execute import execute_batched
from triton_backend.lookup_service import LookupService, log_to_stderr
from triton_backend.model_settings import (
    check_instance_device,
    check_io,
    inert_parameters,
    read_settings,
)
from triton_backend.served_files import ServedFiles
from triton_backend.tensors import input_array

logger = logging.getLogger("hps_core")


class _RankingModel:
    """``TritonPythonModel`` of a ranking model; subclasses choose the contract."""

    @staticmethod
    def model_io(layout: RankingLayout, long_keys: bool) -> ModelIO:
        """The contract's tensors for a model of ``layout`` with 64-bit keys or not (inputs
        in ``parse`` order)."""
        raise NotImplementedError

    @classmethod
    def make_contract(
        cls, layout: RankingLayout, long_keys: bool
    ) -> HugeCTRContract | SamplesContract:
        """The contract that reads and answers this model's requests."""
        raise NotImplementedError

    def initialize(self, args: dict[str, str]) -> None:
        """Validate the model and load its dense network before Triton marks it loaded.

        Args:
            args: Triton's initialize arguments.
        """
        log_to_stderr()
        keep_freed_memory()  # this instance's process: its batches reuse their pages
        settings = read_settings(args)
        files = ServedFiles.settle(settings)  # before anything reads them
        checked = check_model_files(
            settings.ps_json, settings.hps_model, source=settings.source_ps_json
        )
        model = checked.model
        check_instance_device(settings, model.deployed_device_list, f"model '{model.name}'")
        for line in inert_parameters(settings):
            logger.warning("model '%s': %s", settings.triton_model, line)
        # The service makes the instance's lookup (its options fixed) and starts it on the
        # first execute; the session scores through that same object.
        self.service = LookupService(settings, files)
        precision = dense_precision(model, settings.precision)
        self.session = RankingSession.for_lookup(self.service.lookup, precision)
        self.service.publish_tier_bytes(
            checked.footprint, gpu_index=self.session.pipeline is not None
        )
        layout = self.session.layout
        long_keys = self.service.lookup.config.supportlonglong
        self.io = self.model_io(layout, long_keys)
        check_io(settings.config, self.io)
        self.contract = self.make_contract(layout, long_keys)
        # max_batch_size 0 (a HugeCTR repository's): OUTPUT0 is the request's whole tensor.
        self.batched = int(settings.config.get("max_batch_size", 0)) > 0
        logger.info(
            "model '%s': ps.json %s, model '%s', %d dense, slots %s, %s, %s instance%s, %s",
            settings.triton_model,
            settings.shown_ps_json,
            settings.hps_model,
            layout.dense_dim,
            list(layout.slot_nums),
            plural(layout.label_dim, "output"),
            settings.instance_kind,
            "" if settings.lookup_device is None else f" on GPU {settings.lookup_device}",
            Precision(precision).value.upper(),
        )
        self.service.start_at_load()

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer a batch of requests with one lookup per table and one forward pass.

        Args:
            requests: Triton inference requests.

        Returns:
            One response per request, in order.
        """
        return execute_batched(
            requests,
            self._parse,
            self._predict,
            self.io.outputs[0].name,
            self.service.count_failed,
        )

    def _parse(self, request: Any) -> SparseBatch:
        arrays = [to_host(input_array(request, t.name, t.dtype)) for t in self.io.inputs]
        return self.contract.parse(*arrays)

    def _predict(self, batches: list[SparseBatch]) -> list[Any]:
        self.service.start()  # first execute: open tables, warm caches, start the refresher
        scores = self.session.predict(concat_batches(batches))
        pieces = split_samples(scores, [b.batch_size for b in batches])
        responses: list[Any] = []
        every_finite = bool(module_of(scores).isfinite(scores).all())  # one check, most batches
        for piece in pieces:
            refused = None if every_finite else _non_finite(piece)
            if refused is not None:
                responses.append(refused)
                continue
            response = self.contract.response(piece)
            responses.append(response if self.batched else response.reshape(-1))
        return responses

    def finalize(self) -> None:
        """Stop background work and detach from the shared tables."""
        self.service.close()


def _non_finite(scores: Any) -> RequestError | None:
    """A request whose scores are not all finite numbers is refused, naming the first
    sample: finite dense features can still overflow float32 inside the network (3e38 in a
    dense input), and a NaN score answered as a success would pass unseen."""
    host = to_host(scores)
    finite = np.isfinite(host)
    bad = np.flatnonzero(~finite.all(axis=tuple(range(1, host.ndim))))
    if bad.size == 0:
        return None
    sample = int(bad[0])
    value = host[sample][~finite[sample]].reshape(-1)[0]
    return RequestError(
        f"sample {sample} of the request scores {value}: a value overflowed float32 inside "
        "the network (most often dense features far outside what it was trained on), so the "
        f"request is refused ({bad.size} of its {plural(len(host), 'sample')})"
    )


class HugeCTRRankingModel(_RankingModel):
    """HugeCTR's ``hugectr`` backend contract: ``DES``, ``CATCOLUMN``, ``ROWINDEX`` ->
    ``OUTPUT0``."""

    @staticmethod
    def model_io(layout: RankingLayout, long_keys: bool) -> ModelIO:
        return hugectr_io(long_keys)

    @classmethod
    def make_contract(cls, layout: RankingLayout, long_keys: bool) -> HugeCTRContract:
        return HugeCTRContract(layout, np.int64 if long_keys else np.uint32)


class SamplesRankingModel(_RankingModel):
    """One sample per row of Triton's batch: ``dense``, ``sparse`` -> ``score``."""

    @staticmethod
    def model_io(layout: RankingLayout, long_keys: bool) -> ModelIO:
        # The samples contract is this project's own: INT64 keys whatever their width.
        return samples_io(layout.dense_dim, layout.sample_width, layout.label_dim)

    @classmethod
    def make_contract(cls, layout: RankingLayout, long_keys: bool) -> SamplesContract:
        return SamplesContract(layout)
