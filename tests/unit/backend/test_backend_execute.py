"""The shared ``execute`` loop: a request that does not parse, or whose output the run refuses,
fails alone with INVALID_ARG; a tier down fails its batch with UNAVAILABLE, any other server-side
failure with INTERNAL; each failed
request is counted by reason (Triton's Python backend counts every response as a success)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import numpy as np
import pytest

from hps_core.errors import ModelFileError, RequestError, TierUnavailableError


class _Error:
    INVALID_ARG, INTERNAL, UNAVAILABLE = "INVALID_ARG", "INTERNAL", "UNAVAILABLE"

    def __init__(self, message: str, code: str) -> None:
        self.message, self.code = message, code


class _Response:
    def __init__(self, output_tensors: Any = None, error: Any = None) -> None:
        self.output_tensors, self.error = output_tensors, error


class _Tensor:
    @staticmethod
    def from_dlpack(name: str, array: Any) -> tuple[str, np.ndarray]:
        return name, np.from_dlpack(array)


@pytest.fixture
def execute_batched(monkeypatch: pytest.MonkeyPatch) -> Any:
    stand_in = types.SimpleNamespace(
        InferenceResponse=_Response, TritonError=_Error, Tensor=_Tensor
    )
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stand_in)
    for name in ("triton_backend.tensors", "triton_backend.batched_execute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("triton_backend.batched_execute").execute_batched


def parse(request: int) -> int:
    if request < 0:
        raise RequestError(f"request {request} is negative")
    return request


def test_failures_are_answered_alone_and_counted_by_reason(execute_batched) -> None:
    failed: list[str] = []

    def run(parsed: list[int]) -> list[Any]:
        return [RequestError("odd") if p % 2 else np.full(2, p, np.float32) for p in parsed]

    responses = execute_batched([2, -1, 3, 4], parse, run, "OUT", failed.append)
    assert [r.error.code if r.error else None for r in responses] == [
        None, "INVALID_ARG", "INVALID_ARG", None,
    ]  # fmt: skip
    assert responses[1].error.message == "request -1 is negative"
    assert responses[2].error.message == "odd"
    name, values = responses[3].output_tensors[0]
    assert name == "OUT" and values.tolist() == [4.0, 4.0]
    assert failed == ["invalid_argument", "invalid_argument"]

    def broken(parsed: list[int]) -> list[Any]:
        raise TierUnavailableError("volatile_db: no node answered")

    failed.clear()
    responses = execute_batched([1, -5, 2], parse, broken, "OUT", failed.append)
    assert [r.error.code for r in responses] == ["UNAVAILABLE", "INVALID_ARG", "UNAVAILABLE"]
    assert "tier unavailable: volatile_db: no node answered" in responses[0].error.message
    assert sorted(failed) == ["invalid_argument", "unavailable", "unavailable"]

    def vanished(parsed: list[int]) -> list[Any]:
        raise ModelFileError("t0/emb_vector: cannot open")

    failed.clear()
    responses = execute_batched([1, 2], parse, vanished, "OUT", failed.append)
    assert [r.error.code for r in responses] == ["INTERNAL", "INTERNAL"]
    assert "server error: t0/emb_vector: cannot open" in responses[0].error.message
    assert failed == ["internal", "internal"]
