"""Tensors in and out of Triton's Python backend through DLPack.

Triton 2.51's stub was built against NumPy 1.x: with NumPy 2, ``Tensor.as_numpy`` returns
wrong data and ``Tensor(name, ndarray)`` sends an empty tensor. DLPack works both ways for
NumPy 2 and CuPy, on CPU and GPU, so it is the only path used here.
"""

from __future__ import annotations

import ctypes
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
    if not isinstance(array, np.ndarray):
        return pb_utils.Tensor.from_dlpack(name, array)
    exporter = _NumpyExporter(np.ascontiguousarray(array))
    tensor = pb_utils.Tensor.from_dlpack(name, exporter)
    exporter.release()
    return tensor


# The stub takes the DLPack capsule of a NumPy array, owns its tensor from then on (it calls
# the tensor's deleter itself) and renames the capsule "used_dlpack". NumPy 2's capsule
# destructor knows only DLPack's name for a consumed capsule, "used_dltensor": for any other it
# looks for an unconsumed tensor, fails, and prints a traceback (once per response, into the
# server log). Renaming the consumed capsule to DLPack's name lets the destructor do nothing,
# which is right: the stub already owns and frees the tensor. The name must outlive the
# capsule (PyCapsule_SetName keeps the pointer), hence a module constant.
_CONSUMED = b"used_dltensor"
_STUB_CONSUMED = b"used_dlpack"
_capsule_api = ctypes.pythonapi
_capsule_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_api.PyCapsule_IsValid.restype = ctypes.c_int
_capsule_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_api.PyCapsule_SetName.restype = ctypes.c_int


class _NumpyExporter:
    """A NumPy array as ``pb_utils.Tensor.from_dlpack`` consumes it, keeping the capsule."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self._capsule: Any = None

    def __dlpack__(self, stream: Any = None) -> Any:
        self._capsule = self._array.__dlpack__(stream=stream)
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    def release(self) -> None:
        """Give the consumed capsule DLPack's consumed name (see above) and drop it."""
        capsule, self._capsule = self._capsule, None
        if capsule is not None and _capsule_api.PyCapsule_IsValid(capsule, _STUB_CONSUMED):
            _capsule_api.PyCapsule_SetName(capsule, _CONSUMED)


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
