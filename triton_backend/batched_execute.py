"""The ``execute`` loop every model here shares: parse each request, run the rest as one batch.

A request that fails to parse gets its own ``INVALID_ARG`` response naming the input; the
others run together in one call. If that call fails on the server's side, each of its requests
gets an error saying why, and the next ``execute`` tries again: the stub never dies from a
request. A tier that may hold the batch's keys and did not answer (a Redis node down, with
nothing below that holds its rows) is ``UNAVAILABLE``, which a client may retry; anything else
(a sparse file vanished, say) is ``INTERNAL``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import triton_python_backend_utils as pb_utils

from hps_core.errors import HPSError, RequestError, TierUnavailableError
from hps_core.log_every import LogEvery
from triton_backend.tensors import error_response, output_tensor

logger = logging.getLogger("hps_core")
_EVERY = LogEvery()  # a tier down fails batches for as long as it is down: a line per 10 s

Parsed = TypeVar("Parsed")


def execute_batched(
    requests: Sequence[Any],
    parse: Callable[[Any], Parsed],
    run: Callable[[list[Parsed]], Sequence[Any]],
    output_name: str | Sequence[str],
    on_failure: Callable[[str], None] | None = None,
) -> list[Any]:
    """Answer ``requests`` with one ``run`` over all the requests that parse.

    Args:
        requests: Triton inference requests.
        parse: turns one request into its parsed form; raises ``RequestError``.
        run: maps the parsed requests to one output array per request, in order; an output
            may be a ``RequestError`` instead, which fails that request alone.
        output_name: name of the output tensor; several names: each output of ``run`` is
            a sequence of arrays, one per name.
        on_failure: called once per request answered with an error, with the reason
            (``invalid_argument``, ``unavailable`` or ``internal``).

    Returns:
        One ``pb_utils.InferenceResponse`` per request, in order.
    """
    responses: list[Any] = [None] * len(requests)
    parsed: list[Parsed] = []
    served: list[int] = []
    failed = on_failure or (lambda reason: None)
    for i, request in enumerate(requests):
        try:
            parsed.append(parse(request))
        except RequestError as exc:
            responses[i] = error_response(str(exc))
            failed("invalid_argument")
            continue
        served.append(i)
    if parsed:
        try:
            for i, out in zip(served, run(parsed), strict=True):
                if isinstance(out, RequestError):
                    responses[i] = error_response(str(out))
                    failed("invalid_argument")
                    continue
                if isinstance(output_name, str):
                    tensors = [output_tensor(output_name, out)]
                else:
                    tensors = [output_tensor(n, o) for n, o in zip(output_name, out, strict=True)]
                responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
        except TierUnavailableError as exc:
            _EVERY.log(logger, logging.ERROR, "unavailable",
                       "batch of %d requests failed: %s", len(served), exc)  # fmt: skip
            for i in served:
                responses[i] = error_response(
                    f"tier unavailable: {exc}", pb_utils.TritonError.UNAVAILABLE
                )
                failed("unavailable")
        except HPSError as exc:
            logger.error("batch of %d requests failed: %s", len(served), exc)
            for i in served:
                responses[i] = error_response(f"server error: {exc}", pb_utils.TritonError.INTERNAL)
                failed("internal")
    return responses
