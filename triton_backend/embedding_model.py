"""Triton Python-backend model serving HugeCTR's ``hps`` embedding-lookup contract.

A model folder's ``1/model.py`` is one line::

    from triton_backend.embedding_model import EmbeddingModel as TritonPythonModel

``initialize`` validates config.pbtxt, the ps.json and the files it names, so a broken model
fails to load with a clear reason; the tables themselves are loaded by the first ``execute``
(HugeCTR's implicit initialisation; ``model_warmup`` in config.pbtxt makes that happen before
the model is READY). All requests of one ``execute`` become one lookup per table; a bad request
gets its own ``INVALID_ARG`` response and the others are served.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from hps_core.errors import HPSError, RequestError
from hps_core.hps import HPS
from hps_core.model_check import check_model_files
from triton_backend.hps_contract import (
    KEYS,
    NUMKEYS,
    OUTPUT0,
    HpsContract,
    batch_tables,
    split_outputs,
)
from triton_backend.model_settings import check_io, read_settings
from triton_backend.tensors import error_response, input_array, output_tensor

logger = logging.getLogger("hps_core")


def _log_to_stderr() -> None:
    # The stub's stderr goes to Triton's log; without a handler, INFO lines would be lost.
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hps %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class EmbeddingModel:
    """``TritonPythonModel`` for the ``KEYS``/``NUMKEYS`` -> ``OUTPUT0`` contract."""

    def initialize(self, args: dict[str, str]) -> None:
        """Validate the model before Triton marks it loaded.

        Args:
            args: Triton's initialize arguments.
        """
        _log_to_stderr()
        self.settings = read_settings(args)
        check_io(
            self.settings.config,
            inputs={KEYS: "TYPE_INT64", NUMKEYS: "TYPE_INT32"},
            outputs={OUTPUT0: "TYPE_FP32"},
        )
        model = check_model_files(self.settings.ps_json, self.settings.hps_model)
        self.contract = HpsContract.from_model(model)
        logger.info(
            "model '%s': ps.json %s, model '%s', %d tables (dims %s), %s instance",
            self.settings.triton_model,
            self.settings.ps_json,
            self.settings.hps_model,
            self.contract.num_tables,
            list(self.contract.dims),
            self.settings.instance_kind,
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
                session = HPS(self.settings.ps_json).model(self.settings.hps_model)
                values = session.lookup_tables(batch_tables(parsed))
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
        return responses

    def finalize(self) -> None:
        """Detach from the shared tables (the last process frees them)."""
        HPS.close_all()
