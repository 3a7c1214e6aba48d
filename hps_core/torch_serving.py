"""A user's PyTorch model served with its tables in the HPS: loading it and running batches.

The model folder (written by ``hps repo-torch``) holds the user's Python file and the
dense weights beside ``model.py``; config.pbtxt names them:

- ``torch_module``: ``FILE.py:FACTORY``. ``FACTORY(ps_config_file: str, model_name: str)``
  returns the ``torch.nn.Module`` to serve: the user's model with its tables as
  :mod:`hps_core.hps_torch` layers or :mod:`hps_core.hps_torchrec` collections of that ps.json
  model. A module class plus its weights, rather than an exported program: TorchRec models take
  ``KeyedJaggedTensor`` s, which ``torch.export`` does not carry whole, and the factory may
  build anything a Python file can.
- ``torch_state_dict`` (optional): the module's weights, loaded with ``strict=True`` (every
  weight of the module, and only those: ``hps repo-torch`` leaves the tables' out of it, the
  ps.json's files hold them), read with ``weights_only=True``.

Every input of config.pbtxt is a keyword argument of the module's ``forward``, batched along
dimension 0 (``max_batch_size`` > 0, fixed dims). ``forward`` returns the one output as a
tensor, or several as a tuple in config.pbtxt's order or a dict by name; each ``[batch, ...]``.

Example:
    >>> module = load_module(folder, "dlrm.py:build", ps_json, "dlrm", "dense.pt")  # doctest: +SKIP
    >>> outputs = TorchBatcher(module, io, device)(requests)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hps_core.errors import ConfigError, ModelFileError, Problem, RequestError

MODULE_PARAMETER = "torch_module"
STATE_DICT_PARAMETER = "torch_state_dict"

TRITON_TYPES = {
    "TYPE_FP32": np.dtype(np.float32),
    "TYPE_FP16": np.dtype(np.float16),
    "TYPE_INT32": np.dtype(np.int32),
    "TYPE_INT64": np.dtype(np.int64),
}
"""The config.pbtxt data types a served module's tensors may have."""
_TORCH_TYPES = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
}


@dataclass(frozen=True)
class TorchTensorSpec:
    """One input or output of the served module.

    Args:
        name: its name in config.pbtxt and requests (a keyword of ``forward`` for inputs).
        dtype: its NumPy dtype (float32, float16, int32 or int64).
        dims: its dims without the batch dimension, all fixed.
    """

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]


@dataclass(frozen=True)
class TorchIO:
    """The served module's inputs and outputs, in config.pbtxt's order."""

    inputs: tuple[TorchTensorSpec, ...]
    outputs: tuple[TorchTensorSpec, ...]


def torch_io(config: Mapping[str, Any]) -> TorchIO:
    """The inputs and outputs config.pbtxt declares (Triton's JSON form).

    Args:
        config: the decoded config.pbtxt.

    Returns:
        The tensors.

    Raises:
        ConfigError: no batching, a dim of -1, a type the module cannot take, no output.
    """
    problems: list[Problem] = []
    if int(config.get("max_batch_size", 0)) < 1:
        why = "must be at least 1: the requests are batched along dim 0"
        problems.append(Problem("config.pbtxt max_batch_size", why))
    found: dict[str, list[TorchTensorSpec]] = {"input": [], "output": []}
    for section in ("input", "output"):
        for item in config.get(section, []):
            where = f"config.pbtxt {section} '{item['name']}'"
            dims = tuple(int(d) for d in item.get("dims", []))
            if any(d < 0 for d in dims):
                problems.append(Problem(where, f"dims must be fixed, got {list(dims)}"))
            dtype = TRITON_TYPES.get(str(item.get("data_type", "")))
            if dtype is None:
                why = f"data_type {item.get('data_type')} is not one of {list(TRITON_TYPES)}"
                problems.append(Problem(where, why))
                continue
            found[section].append(TorchTensorSpec(str(item["name"]), dtype, dims))
    if not config.get("output"):
        problems.append(Problem("config.pbtxt output", "the module's output is not declared"))
    if problems:
        raise ConfigError(problems)
    return TorchIO(tuple(found["input"]), tuple(found["output"]))


def load_module(
    folder: Path,
    module_spec: str,
    ps_json: Path,
    hps_model: str,
    state_dict: str | None,
    device: torch.device,
) -> torch.nn.Module:
    """Build the user's module from its file, load its weights and place it for inference.

    Args:
        folder: where ``module_spec``'s file and ``state_dict`` are (the version folder).
        module_spec: ``FILE.py:FACTORY`` (parameter ``torch_module``).
        ps_json: the ps.json the factory is given.
        hps_model: the ps.json model the factory is given.
        state_dict: the weights file (parameter ``torch_state_dict``) or ``None``.
        device: where the module runs (``cpu`` or ``cuda:N``).

    Returns:
        The module in eval mode on ``device``.

    Raises:
        ConfigError: the parameter is malformed, the file or factory is missing, or the
            weights do not match the module's (naming the keys).
        ModelFileError: the weights file cannot be read.
    """
    where = f"config.pbtxt parameters.{MODULE_PARAMETER}"
    file_name, _, factory_name = module_spec.partition(":")
    if not file_name.endswith(".py") or not factory_name.isidentifier():
        raise ConfigError(Problem(where, f"must be FILE.py:FACTORY, got '{module_spec}'"))
    path = folder / file_name
    if not path.is_file():
        raise ConfigError(Problem(where, f"{path} is not there"))
    name = f"hps_torch_module_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    code = importlib.util.module_from_spec(spec)
    sys.modules[name] = code  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(code)
    factory = getattr(code, factory_name, None)
    if not callable(factory):
        raise ConfigError(Problem(where, f"{path} has no function '{factory_name}'"))
    module = factory(str(ps_json), hps_model)
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            Problem(
                where, f"{factory_name}() returned {type(module).__name__}, not a torch.nn.Module"
            )
        )
    if state_dict is not None:
        _load_weights(module, folder / state_dict)
    return module.to(device).eval()


def _load_weights(module: torch.nn.Module, path: Path) -> None:
    where = f"config.pbtxt parameters.{STATE_DICT_PARAMETER}"
    if not path.is_file():
        raise ConfigError(Problem(where, f"{path} is not there"))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a file that is not a state dict
        raise ModelFileError(f"{path}: cannot read as a PyTorch state dict: {exc}") from None
    if not isinstance(state, Mapping):
        raise ModelFileError(f"{path}: holds a {type(state).__name__}, not a state dict")
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # weights of other shapes than the module's
        raise ConfigError(Problem(where, f"{path}: {exc}".replace("\n\t", " "))) from None
    wrong = []
    if result.missing_keys:
        wrong.append(f"{len(result.missing_keys)} weights of the module are not in it "
                     f"({_some(result.missing_keys)})")  # fmt: skip
    if result.unexpected_keys:
        wrong.append(f"{len(result.unexpected_keys)} of its weights are not the module's "
                     f"({_some(result.unexpected_keys)})")  # fmt: skip
    if wrong:
        raise ConfigError(Problem(where, f"{path}: " + "; ".join(wrong)))


def _some(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:4])
    return shown + (f", ... {len(keys) - 4} more" if len(keys) > 4 else "")


class TorchBatcher:
    """Runs the requests of one ``execute`` through the module as one batch.

    Args:
        module: the module, on ``device``.
        io: its inputs and outputs.
        device: where it runs; inputs are moved there (CUDA inputs stay on their GPU).
        max_batch_size: the most samples of one forward (config.pbtxt ``max_batch_size``).
    """

    def __init__(
        self, module: torch.nn.Module, io: TorchIO, device: torch.device, max_batch_size: int
    ) -> None:
        self.module, self.io, self.device = module, io, device
        self.max_batch_size = max_batch_size

    def checked(self, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """One request's inputs, checked against config.pbtxt.

        Args:
            arrays: each input's array (NumPy, or anything with ``shape`` and ``dtype``).

        Returns:
            The arrays by input name.

        Raises:
            RequestError: an input missing, of another dtype, or of other dims.
        """
        found = {}
        samples = None
        for spec in self.io.inputs:
            if spec.name not in arrays:
                raise RequestError(f"input '{spec.name}' is missing")
            array = arrays[spec.name]
            if np.dtype(str(array.dtype)) != spec.dtype:
                raise RequestError(f"input '{spec.name}' must be {spec.dtype}, got {array.dtype}")
            shape = tuple(int(d) for d in array.shape)
            if shape[1:] != spec.dims or len(shape) != len(spec.dims) + 1:
                raise RequestError(
                    f"input '{spec.name}' must be [batch, {', '.join(map(str, spec.dims))}], "
                    f"got {list(shape)}"
                )
            if samples is not None and shape[0] != samples:
                raise RequestError(
                    f"input '{spec.name}' has {shape[0]} samples, the others {samples}"
                )
            samples = shape[0]
            found[spec.name] = array
        if samples is not None and samples > self.max_batch_size:
            raise RequestError(f"{samples} samples exceed max_batch_size {self.max_batch_size}")
        return found

    def __call__(self, requests: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
        """Run the requests as one forward.

        Args:
            requests: each request's checked inputs (:meth:`checked`).

        Returns:
            Per request, its outputs in config.pbtxt's order (NumPy, each ``[its samples,
            ...]``), or a ``RequestError`` where its scores are not finite.

        Raises:
            RequestError: the module's outputs do not match config.pbtxt.
        """
        sizes = [int(next(iter(r.values())).shape[0]) for r in requests] if self.io.inputs else []
        inputs = {
            spec.name: self._batched([r[spec.name] for r in requests], spec)
            for spec in self.io.inputs
        }
        with torch.inference_mode():
            answer = self.module(**inputs)
        # Triton sends the answers from the host: each output crosses to it once, for every
        # request (after the forward: the copy waits for it), rather than a GPU tensor per
        # response handed to the server; the finiteness check reads them there too.
        outputs = [o.cpu() for o in self._outputs(answer, sum(sizes))]
        found: list[list[Any]] = []
        start = 0
        for n in sizes:
            pieces = [o[start : start + n] for o in outputs]
            start += n
            bad = _not_finite(pieces, self.io.outputs)
            found.append(bad if bad is not None else [_answer(p) for p in pieces])
        return found

    def _batched(self, arrays: list[Any], spec: TorchTensorSpec) -> torch.Tensor:
        if all(isinstance(a, np.ndarray) for a in arrays):
            # One copy out of the requests' memory (Triton's, read-only, released after
            # execute), which the module may keep views of until its answers are out.
            batch = torch.from_numpy(
                np.concatenate(arrays) if len(arrays) > 1 else arrays[0].copy()
            )
            return batch.to(self.device, non_blocking=True)
        tensors = [torch.from_dlpack(a) for a in arrays]  # CUDA inputs (CuPy) on their GPU
        return torch.cat(tensors).to(self.device, non_blocking=True)

    def _outputs(self, answer: Any, samples: int) -> list[torch.Tensor]:
        specs = self.io.outputs
        given = type(answer).__name__
        if isinstance(answer, torch.Tensor):
            answer = (answer,)
        if isinstance(answer, Mapping):
            missing = [s.name for s in specs if s.name not in answer]
            if missing:
                raise RequestError(f"the module's outputs lack {missing} (it gave {list(answer)})")
            answer = tuple(answer[s.name] for s in specs)
        if not isinstance(answer, (tuple, list)) or len(answer) != len(specs):
            raise RequestError(
                f"the module answered {given}; config.pbtxt declares "
                f"{len(specs)} output(s): a tensor, a tuple in their order or a dict by name"
            )
        found = []
        for spec, tensor in zip(specs, answer, strict=True):
            shape = (samples, *spec.dims)
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
                got = list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
                raise RequestError(f"the module's output '{spec.name}' is {got}, "
                                   f"config.pbtxt declares {list(shape)}")  # fmt: skip
            found.append(tensor.to(_TORCH_TYPES[spec.dtype]).contiguous())
        return found


def _answer(tensor: torch.Tensor) -> Any:
    """An output piece (on the host) as Triton takes it: a NumPy array of its own (Triton's
    stub owns what it is handed: not a view into PyTorch's memory)."""
    return tensor.numpy().copy()


def _not_finite(pieces: list[torch.Tensor], specs: Sequence[TorchTensorSpec]) -> Any:
    """A request whose float outputs are not all finite is refused, naming where."""
    for spec, piece in zip(specs, pieces, strict=True):
        if piece.is_floating_point() and not bool(torch.isfinite(piece).all()):
            sample = int((~torch.isfinite(piece)).reshape(piece.shape[0], -1).any(1).nonzero()[0])
            return RequestError(
                f"output '{spec.name}' of sample {sample} is not finite: a value overflowed "
                "inside the module, so the request is refused"
            )
    return None


def instance_device(kind: str, device_id: int) -> torch.device:
    """Where an instance's module runs: its GPU for ``GPU`` instances, else the CPU."""
    if kind == "GPU":
        return torch.device("cuda", device_id)
    return torch.device("cpu")
