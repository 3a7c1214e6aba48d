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
import triton_python_backend_utils as pb_utils

from hps_core.errors import HPSError, RequestError
from hps_core.model_check import check_model_files
from triton_backend.hps_contract import (
    KEYS,
    NUMKEYS,
    OUTPUT0,
    HpsContract,
    batch_tables,
    split_outputs,
)
from triton_backend.lookup_service import LookupService, log_to_stderr
from triton_backend.model_settings import check_io, read_settings
from triton_backend.tensors import error_response, input_array, output_tensor

logger = logging.getLogger("hps_core")


class EmbeddingModel:
    """``TritonPythonModel`` for the ``KEYS``/``NUMKEYS`` -> ``OUTPUT0`` contract."""

    def initialize(self, args: dict[str, str]) -> None:
        """Validate the model before Triton marks it loaded.

        Args:
            args: Triton's initialize arguments.
        """
        log_to_stderr()
        settings = read_settings(args)
        check_io(
            settings.config,
            inputs={KEYS: "TYPE_INT64", NUMKEYS: "TYPE_INT32"},
            outputs={OUTPUT0: "TYPE_FP32"},
        )
        model = check_model_files(settings.ps_json, settings.hps_model)
        self.contract = HpsContract.from_model(model)
        self.service = LookupService(settings)
        logger.info(
            "model '%s': ps.json %s, model '%s', %d tables (dims %s), %s instance%s",
            settings.triton_model,
            settings.ps_json,
            settings.hps_model,
            self.contract.num_tables,
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
        responses: list[Any] = [None] * len(requests)
        parsed: list[list[Any]] = []
        served: list[int] = []
        for i, request in enumerate(requests):
            try:
                keys = self.contract.parse(
                    input_array(request, KEYS, np.int64), input_array(request, NUMKEYS, np.int32)
                )
            except RequestError as exc:
                responses[i] = error_response(str(exc))
                continue
            parsed.append(keys)
            served.append(i)
        if parsed:
            try:
                values = self.service.session().lookup_tables(batch_tables(parsed))
                for i, out in zip(served, split_outputs(values, parsed), strict=True):
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[output_tensor(OUTPUT0, out)]
                    )
            except HPSError as exc:
                # The server side failed (e.g. a sparse file vanished): every request of the
                # batch learns why, and the next execute tries again.
                logger.error("lookup failed: %s", exc)
                for i in served:
                    responses[i] = error_response(
                        f"lookup failed: {exc}", pb_utils.TritonError.INTERNAL
                    )
        self.service.report()
        return responses

    def finalize(self) -> None:
        """Stop background work and detach from the shared tables."""
        self.service.close()
