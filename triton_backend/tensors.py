"""Tensors in and out of Triton's Python backend through DLPack.

Triton 2.51's stub was built against NumPy 1.x: with NumPy 2, ``Tensor.as_numpy`` returns
wrong data and ``Tensor(name, ndarray)`` sends an empty tensor. DLPack works both ways for
NumPy 2 and CuPy, on CPU and GPU, so it is the only path used here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from hps_core.errors import RequestError


def input_array(request: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """Array view of input ``name`` of ``request``, where Triton put it.

    Args:
        request: a ``pb_utils.InferenceRequest``.
        name: the input's name.
        dtype: the input's data type in config.pbtxt (Triton has already enforced it).

    Returns:
        The input as a NumPy array, or a CuPy array if Triton delivered it on a GPU (with
        ``FORCE_CPU_ONLY_INPUT_TENSORS: "no"``); no copy either way.

    Raises:
        RequestError: the request lacks the input.
    """
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise RequestError(f"input '{name}' is missing")
    if 0 in tensor.shape():
        # An empty tensor has no data to export; the stub cannot report its dtype either.
        return np.empty(tensor.shape(), dtype=dtype)
    if tensor.is_cpu():
        return np.from_dlpack(tensor)
    import cupy  # only GPU instances receive device tensors

    return cupy.from_dlpack(tensor)


def output_tensor(name: str, array: Any) -> Any:
    """A ``pb_utils.Tensor`` holding ``array`` (NumPy or CuPy), passed through DLPack.

    Args:
        name: output name.
        array: the data; made C-contiguous if it is not.

    Returns:
        The Triton tensor.
    """
    if isinstance(array, np.ndarray):
        array = np.ascontiguousarray(array)
    return pb_utils.Tensor.from_dlpack(name, array)


def error_response(message: str, code: Any = None) -> Any:
    """A response that fails one request with ``INVALID_ARG`` (or ``code``).

    Args:
        message: what is wrong, naming the input.
        code: a ``pb_utils.TritonError`` code; ``INVALID_ARG`` when ``None``.

    Returns:
        The ``pb_utils.InferenceResponse``.
    """
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
