"""HugeCTR's dense model file: the raw float32 parameters of the trainable layers.

HugeCTR writes its whole dense weight buffer as it is in memory: every trainable layer in
network-file order, each layer's tensors in the order it allocates them, little-endian float32,
no header and no padding. Only the network file says where one tensor ends and the next begins,
so reading takes the :class:`DenseLayout` built from the graph.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np

from hps_core.errors import ModelFileError
from hps_core.nn.layers.base import ParamShape

#: Parameters of one network: layer name -> its tensors in file order.
DenseParams = dict[str, tuple[np.ndarray, ...]]

_FLOAT = np.dtype("<f4")


@dataclass(frozen=True)
class LayerParams:
    """The parameters one trainable layer stores in the dense model file.

    Args:
        layer: layer name.
        type: HugeCTR layer type.
        where: location of the layer in the network file, for messages.
        params: its tensors in file order.
    """

    layer: str
    type: str
    where: str
    params: tuple[ParamShape, ...]

    @property
    def size(self) -> int:
        """Number of float32 values the layer stores."""
        return sum(p.size for p in self.params)


@dataclass(frozen=True)
class DenseLayout:
    """Where each trainable layer's tensors lie in the dense model file.

    Args:
        layers: trainable layers in file order.
    """

    layers: tuple[LayerParams, ...]

    @property
    def total_floats(self) -> int:
        """Size of the dense model file in float32 values."""
        return sum(layer.size for layer in self.layers)


def read_dense_blob(path: str | Path, layout: DenseLayout) -> DenseParams:
    """Read a dense model file and split it into per-layer tensors.

    Args:
        path: the dense model file.
        layout: the layout from :meth:`NetworkGraph.dense_layout`.

    Returns:
        Layer name -> float32 tensors in file order.

    Raises:
        ModelFileError: unreadable file, or its size does not match the layout (the message
            names the layer where the file ends early, or the extra floats).
    """
    check_dense_blob_size(path, layout)
    floats = np.fromfile(path, dtype=_FLOAT).astype(np.float32, copy=False)
    params: DenseParams = {}
    offset = 0
    for layer in layout.layers:
        tensors = []
        for param in layer.params:
            tensors.append(floats[offset : offset + param.size].reshape(param.shape))
            offset += param.size
        params[layer.layer] = tuple(tensors)
    return params


def check_dense_blob_size(path: str | Path, layout: DenseLayout) -> int:
    """Check that a dense model file holds exactly the floats ``layout`` needs.

    Args:
        path: the dense model file.
        layout: the network's dense layout.

    Returns:
        The number of float32 values in the file.

    Raises:
        ModelFileError: unreadable file or wrong size; names the layer where it goes wrong.
    """
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read dense model file: {exc}") from None
    if size % _FLOAT.itemsize:
        raise ModelFileError(f"{path}: size {size} bytes is not a whole number of float32 values")
    have, need = size // _FLOAT.itemsize, layout.total_floats
    if have == need:
        return have
    head = f"{path}: dense model file has {have} floats, the network needs {need}"
    if have > need:
        last = f" after the last layer '{layout.layers[-1].layer}'" if layout.layers else ""
        raise ModelFileError(f"{head}; {have - need} floats are left over{last}")
    ends = list(accumulate(layer.size for layer in layout.layers))
    cut = bisect_right(ends, have)  # the first layer that ends past the file's end
    layer = layout.layers[cut]
    found = have - (ends[cut] - layer.size)
    raise ModelFileError(
        f"{head}; the file ends inside layer '{layer.layer}' ({layer.type}, {layer.where}): "
        f"expected {layer.size} floats there, found {found}"
    )


def write_dense_blob(params: Mapping[str, Sequence[np.ndarray]], path: str | Path) -> int:
    """Write parameters as a HugeCTR dense model file.

    Args:
        params: layer name -> tensors, in layout order (as :func:`read_dense_blob` returns).
        path: the file to write.

    Returns:
        The number of float32 values written.

    Example:
        >>> params = {"fc1": (np.ones((2, 3)), np.zeros((1, 3)))}
        >>> write_dense_blob(params, "/tmp/dense.model")  # doctest: +SKIP
        9
    """
    arrays = [np.ascontiguousarray(t, dtype=_FLOAT).ravel() for ts in params.values() for t in ts]
    blob = np.concatenate(arrays) if arrays else np.empty(0, dtype=_FLOAT)
    try:
        blob.tofile(path)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot write dense model file: {exc}") from None
    return int(blob.size)


def random_dense_params(layout: DenseLayout, seed: int = 0) -> DenseParams:
    """Random parameters for ``layout``, scaled so that activations stay of order one.

    Each tensor is normal with standard deviation ``1 / sqrt(fan_in)``, taking the first
    dimension as fan-in (the last one for ``[1, n]`` vectors). For tests and benchmarks.

    Args:
        layout: the network's dense layout.
        seed: random seed.

    Returns:
        Layer name -> float32 tensors in file order.
    """
    rng = np.random.default_rng(seed)
    params: DenseParams = {}
    for layer in layout.layers:
        tensors = []
        for param in layer.params:
            fan_in = param.shape[0] if param.shape[0] > 1 else param.shape[-1]
            tensor = rng.standard_normal(param.shape, dtype=np.float32) / np.sqrt(fan_in)
            tensors.append(tensor.astype(np.float32))
        params[layer.layer] = tuple(tensors)
    return params
