"""HugeCTR's dense model file: the raw float32 parameters of the trainable layers.

HugeCTR writes its whole dense weight buffer as it is in memory: every trainable layer in
network-file order, each layer's tensors in the order it allocates them, little-endian float32,
no header and no padding. Only the network file says where one tensor ends and the next begins,
so reading takes the :class:`DenseLayout` built from the graph.

State that is not trained (BatchNorm's running mean and variance) is not in that file: HugeCTR
writes it next to it, as ``<dense model file>.ntp.json`` (``{"layers": [{"type": "BatchNorm",
"mean": [...], "var": [...]}, ...]}``, one entry per such layer in network order, no names;
``Model::download_dense_params_to_files_``). A layer's state tensors follow its trained ones
in :data:`DenseParams`.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np

from hps_core.errors import ModelFileError
from hps_core.formats.uris import FsPath, ModelPath, model_path
from hps_core.nn.layers.base import ParamShape

#: Parameters of one network: layer name -> its tensors in file order, then its state.
DenseParams = dict[str, tuple[np.ndarray, ...]]

NTP_SUFFIX = ".ntp.json"
"""Appended to the dense model file's name for the file of non-trained state."""

_FLOAT = np.dtype("<f4")


@dataclass(frozen=True)
class LayerParams:
    """The parameters one trainable layer stores in the dense model file.

    Args:
        layer: layer name.
        type: HugeCTR layer type.
        where: location of the layer in the network file, for messages.
        params: its tensors in file order.
        state: its non-trained tensors, in the ``.ntp.json`` file (BatchNorm's mean and
            variance).
    """

    layer: str
    type: str
    where: str
    params: tuple[ParamShape, ...]
    state: tuple[ParamShape, ...] = ()

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


def read_dense_blob(
    path: str | Path, layout: DenseLayout, state_file: str | Path | None = None
) -> DenseParams:
    """Read a dense model file and split it into per-layer tensors.

    Args:
        path: the dense model file.
        layout: the layout from :meth:`NetworkGraph.dense_layout`.
        state_file: the file of the non-trained tensors (ps.json's
            ``non_trainable_params_file``); None reads ``<path>.ntp.json``, where HugeCTR
            writes it. Read only when a layer has such tensors.

    Returns:
        Layer name -> float32 tensors in file order.

    Raises:
        ModelFileError: unreadable file, or its size does not match the layout (the message
            names the layer where the file ends early, or the extra floats).
    """
    check_dense_blob_size(path, layout)
    path = model_path(path)
    if isinstance(path, FsPath):  # read as it streams in, no local copy
        floats = np.frombuffer(path.read_bytes(), dtype=_FLOAT).astype(np.float32)
    else:
        floats = np.fromfile(path, dtype=_FLOAT).astype(np.float32, copy=False)
    state = _read_state(
        model_path(state_file) if state_file is not None else model_path(str(path) + NTP_SUFFIX),
        layout,
    )
    params: DenseParams = {}
    offset = 0
    for layer in layout.layers:
        tensors = []
        for param in layer.params:
            tensors.append(floats[offset : offset + param.size].reshape(param.shape))
            offset += param.size
        params[layer.layer] = (*tensors, *state.get(layer.layer, ()))
    return params


def _read_state(ntp: ModelPath, layout: DenseLayout) -> dict[str, tuple[np.ndarray, ...]]:
    """The non-trained tensors of the layers that have some, from the file ``ntp``."""
    holders = [layer for layer in layout.layers if layer.state]
    if not holders:
        return {}
    try:
        entries = json.loads(ntp.read_text())["layers"]
    except (OSError, ValueError, KeyError, TypeError, ModelFileError) as exc:
        names = ", ".join(f"'{layer.layer}'" for layer in holders)
        raise ModelFileError(
            f"{ntp}: cannot read the running statistics of {names} (HugeCTR writes them next "
            f"to the dense model file): {exc}"
        ) from None
    if not isinstance(entries, list) or len(entries) != len(holders):
        count = len(entries) if isinstance(entries, list) else "no"
        raise ModelFileError(
            f"{ntp}: holds {count} layer entries, the network has {len(holders)} layers with "
            "running statistics"
        )
    state = {}
    for i, (layer, entry) in enumerate(zip(holders, entries, strict=True)):
        tensors = []
        for shape in layer.state:
            values = entry.get(shape.name) if isinstance(entry, dict) else None
            if not isinstance(values, list) or len(values) != shape.size:
                raise ModelFileError(
                    f"{ntp}: layers[{i}].{shape.name} must be {shape.size} numbers for layer "
                    f"'{layer.layer}' ({layer.where})"
                )
            tensors.append(np.asarray(values, dtype=np.float32).reshape(shape.shape))
        state[layer.layer] = tuple(tensors)
    return state


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
        size = model_path(path).stat().st_size
    except (OSError, ModelFileError) as exc:
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


def write_dense_blob(
    params: Mapping[str, Sequence[np.ndarray]],
    path: str | Path,
    layout: DenseLayout | None = None,
) -> int:
    """Write parameters as a HugeCTR dense model file (and its ``.ntp.json`` if any).

    Args:
        params: layer name -> tensors, in layout order (as :func:`read_dense_blob` returns).
        path: the file to write.
        layout: the network's dense layout; needed when a layer has non-trained state, which
            then goes to ``<path>.ntp.json`` as HugeCTR writes it.

    Returns:
        The number of float32 values written to the dense model file.

    Example:
        >>> params = {"fc1": (np.ones((2, 3)), np.zeros((1, 3)))}
        >>> write_dense_blob(params, "/tmp/dense.model")  # doctest: +SKIP
        9
    """
    trained = {name: tuple(ts) for name, ts in params.items()}
    entries = []
    for layer in layout.layers if layout is not None else ():
        if layer.state:
            tensors = trained[layer.layer]
            cut = len(layer.params)
            trained[layer.layer] = tensors[:cut]
            entry = {"type": layer.type}
            for shape, tensor in zip(layer.state, tensors[cut:], strict=True):
                entry[shape.name] = np.asarray(tensor, dtype=np.float32).ravel().tolist()
            entries.append(entry)
    arrays = [np.ascontiguousarray(t, dtype=_FLOAT).ravel() for ts in trained.values() for t in ts]
    blob = np.concatenate(arrays) if arrays else np.empty(0, dtype=_FLOAT)
    try:
        blob.tofile(path)
        if entries:
            Path(str(path) + NTP_SUFFIX).write_text(json.dumps({"layers": entries}))
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot write dense model file: {exc}") from None
    return int(blob.size)


def random_dense_params(layout: DenseLayout, seed: int = 0) -> DenseParams:
    """Random parameters for ``layout``, scaled so that activations stay of order one.

    Each tensor is normal with standard deviation ``1 / sqrt(fan_in)``, taking the first
    dimension as fan-in (the last one for ``[1, n]`` vectors); running means are uniform in
    ``[-0.5, 0.5)`` and running variances in ``[0.5, 1.5)``. For tests and benchmarks.

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
        for param in layer.state:  # running statistics: means near 0, variances near 1
            low = 0.5 if param.name == "var" else -0.5
            tensors.append(rng.uniform(low, low + 1.0, param.shape).astype(np.float32))
        params[layer.layer] = tuple(tensors)
    return params
