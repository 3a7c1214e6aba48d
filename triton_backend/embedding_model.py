"""Triton Python-backend model serving HugeCTR's ``hps`` embedding-lookup contract.

A model folder's ``1/model.py`` is one line::

    from triton_backend.embedding_model import EmbeddingModel as TritonPythonModel

``initialize`` validates config.pbtxt, the ps.json and the files it names, so a broken model
fails to load with a clear reason; the tables themselves are loaded by the first ``execute``
(HugeCTR's implicit initialisation; ``model_warmup`` in config.pbtxt makes that happen before
the model is READY). All requests of one ``execute`` become one lookup per table; a bad request
gets its own ``INVALID_ARG`` response and the others are served. On a ``KIND_GPU`` instance
the lookups go through that GPU's embedding caches, keys may arrive on the GPU, and the
output is returned from GPU memory.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hps_core.host_memory import keep_freed_memory
from hps_core.infer.model_io import EMBEDDING_IO, EMBEDDING_IO_UNBATCHED, KEYS, NUMKEYS, OUTPUT0
from hps_core.model_check import check_model_files
from hps_core.wording import plural
from triton_backend.batched_execute import execute_batched
from triton_backend.hps_contract import HpsContract, batch_tables, split_outputs
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


def _declared_rank(config: dict[str, Any], name: str) -> int:
    """How many dims config.pbtxt declares for output ``name`` (1 when it says nothing)."""
    for output in config.get("output", []):
        if output.get("name") == name:
            return max(1, len(output.get("dims", [])))
    return 1


class EmbeddingModel:
    """``TritonPythonModel`` for the ``KEYS``/``NUMKEYS`` -> ``OUTPUT0`` contract."""

    def initialize(self, args: dict[str, str]) -> None:
        """Validate the model before Triton marks it loaded.

        Args:
            args: Triton's initialize arguments.
        """
        log_to_stderr()
        keep_freed_memory()  # this instance's process: its batches reuse their pages
        settings = read_settings(args)
        files = ServedFiles.settle(settings)  # before anything reads them
        # max_batch_size 0: each request whole, OUTPUT0 of the rank config.pbtxt declares.
        self.batched = int(settings.config.get("max_batch_size", 0)) > 0
        check_io(settings.config, EMBEDDING_IO if self.batched else EMBEDDING_IO_UNBATCHED)
        self.output_rank = 2 if self.batched else _declared_rank(settings.config, OUTPUT0)
        checked = check_model_files(
            settings.ps_json, settings.hps_model, network=False, source=settings.source_ps_json
        )
        model = checked.model
        check_instance_device(settings, model.deployed_device_list, f"model '{model.name}'")
        for line in inert_parameters(settings):
            logger.warning("model '%s': %s", settings.triton_model, line)
        self.contract = HpsContract.from_model(model)
        self.service = LookupService(settings, files)
        self.service.publish_tier_bytes(checked.footprint)
        self.service.start_at_load()
        logger.info(
            "model '%s' version %d: ps.json %s, model '%s', %s (dims %s), %s instance%s",
            settings.triton_model,
            settings.version,
            settings.shown_ps_json,
            settings.hps_model,
            plural(self.contract.num_tables, "table"),
            list(self.contract.dims),
            settings.instance_kind,
            "" if settings.lookup_device is None else f" on GPU {settings.lookup_device}",
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer a batch of requests with one lookup per table.

        Args:
            requests: Triton inference requests.

        Returns:
            One response per request, in order.
        """
        return execute_batched(
            requests, self._parse, self._lookup, OUTPUT0, self.service.count_failed
        )

    def _parse(self, request: Any) -> list[Any]:
        return self.contract.parse(
            input_array(request, KEYS, np.int64),
            input_array(request, NUMKEYS, np.int32),
            self.batched,
        )

    def _lookup(self, parsed: list[list[Any]]) -> list[Any]:
        values = self.service.start().lookup_tables(batch_tables(parsed))
        outputs = split_outputs(values, parsed)  # [1, n] each
        return outputs if self.output_rank == 2 else [o.reshape(-1) for o in outputs]

    def finalize(self) -> None:
        """Stop background work and detach from the shared tables."""
        self.service.close()
