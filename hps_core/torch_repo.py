"""The Triton model folder of a user's PyTorch module whose tables are in the HPS
(``hps repo-torch``; served by :class:`triton_backend.torch_model.TorchModel`).

The folder::

    <name>/config.pbtxt     inputs/outputs, batching, instances, parameters
    <name>/ps.json          the tables (paths written relative to the folder where they can be)
    <name>/1/model.py       one line: TorchModel
    <name>/1/<module>.py    the user's file, with its factory
    <name>/1/dense.pt       the module's weights without the tables' (the ps.json's files hold
                            those): a TorchRec state dict's ``embedding_bags.<t>.weight`` and
                            ``embeddings.<t>.weight`` are left out
    <name>/warmup/<input>   zeros of one sample per input: the tables open before READY

Example:
    >>> write_torch_model(repo, ps, "dlrm", TorchModelFiles(Path("dlrm.py"), "build",
    ...     Path("model.pt")), [dense, sparse], [score])  # doctest: +SKIP
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.errors import ConfigError, Problem
from hps_core.export.torch_source import load_checkpoint
from hps_core.infer.model_io import HPS_MODEL_PARAMETER, PS_JSON_PARAMETER, ModelIO, TensorSpec
from hps_core.torch_serving import MODULE_PARAMETER, STATE_DICT_PARAMETER
from hps_core.triton_repo import (
    ServingOptions,
    WarmupInput,
    config_pbtxt,
    placed_on_deployed_devices,
    write_file,
    write_ps_json,
)

TORCH_MODEL_PY = '''\
"""Triton entry point: a PyTorch module with its tables in the HPS (torch_module)."""

from triton_backend.torch_model import TorchModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''

DENSE_WEIGHTS = "dense.pt"
_TABLE_WEIGHT_PARTS = ("embedding_bags", "embeddings")


@dataclass(frozen=True)
class TorchModelFiles:
    """The user's files of a served PyTorch module.

    Args:
        module_file: the Python file that builds the module.
        factory: its function ``factory(ps_config_file, model_name) -> torch.nn.Module``.
        state_dict: the trained weights (``torch.save`` of a state dict; tables included or
            not), or ``None`` when the factory builds the module whole.
    """

    module_file: Path
    factory: str
    state_dict: Path | None = None


def is_table_weight(key: str) -> bool:
    """Whether a state dict key is a TorchRec table's weight (``...embedding_bags.<t>.weight``
    or ``...embeddings.<t>.weight``), which the ps.json's files hold instead."""
    parts = key.split(".")
    return len(parts) >= 3 and parts[-1] == "weight" and parts[-3] in _TABLE_WEIGHT_PARTS


def dense_weights(state_dict: Path) -> bytes:
    """The bytes of a state dict without its tables' weights.

    Raises:
        ModelFileError: the file cannot be read as a state dict.
    """
    import torch

    state = load_checkpoint(state_dict)
    dense = {k: v for k, v in state.items() if not is_table_weight(k)}
    buffer = io.BytesIO()
    torch.save(dense, buffer)
    return buffer.getvalue()


def write_torch_model(
    repo_dir: Path,
    ps_json: Path,
    hps_model: str,
    files: TorchModelFiles,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    options: ServingOptions | None = None,
    triton_name: str | None = None,
) -> Path:
    """Write the model folder of a PyTorch module over a ps.json model.

    Args:
        repo_dir: the model repository.
        ps_json: the ps.json of the module's tables.
        hps_model: the ps.json model its layers look up.
        files: the module's file, factory and weights.
        inputs: the module's inputs (``forward``'s keywords), dims per sample, fixed.
        outputs: its outputs.
        options: batching and placement (``max_batch_size`` at least 1).
        triton_name: folder / Triton name; ``hps_model`` by default.

    Returns:
        The model folder.

    Raises:
        ConfigError: the model is not in the ps.json, a file is missing, the factory is not a
            name, dims are not fixed, or batching is off.
    """
    config = load_ps_config(ps_json)
    model = config.model(hps_model)
    options = placed_on_deployed_devices(options or ServingOptions(), model)
    problems = []
    if not files.module_file.is_file():
        problems.append(Problem("--module", f"{files.module_file} is not there"))
    if not files.factory.isidentifier():
        problems.append(Problem("--module", f"'{files.factory}' is not a function name"))
    if files.state_dict is not None and not files.state_dict.exists():
        problems.append(Problem("--state-dict", f"{files.state_dict} is not there"))
    for spec in (*inputs, *outputs):
        if any(d < 1 for d in spec.dims):
            problems.append(Problem(spec.name, f"dims must be fixed, got {list(spec.dims)}"))
    if options.max_batch_size < 1:
        problems.append(Problem("--max-batch-size", "must be at least 1"))
    if not outputs:
        problems.append(Problem("--output", "the module's output is not given"))
    if problems:
        raise ConfigError(problems)
    name = triton_name or hps_model
    folder = (repo_dir / name).resolve()
    version_dir = folder / "1"
    params = [(PS_JSON_PARAMETER, "ps.json"),
              (MODULE_PARAMETER, f"{files.module_file.name}:{files.factory}")]  # fmt: skip
    if hps_model != name:
        params.append((HPS_MODEL_PARAMETER, hps_model))
    if files.state_dict is not None:
        params.append((STATE_DICT_PARAMETER, DENSE_WEIGHTS))
        write_file(version_dir / DENSE_WEIGHTS, dense_weights(files.state_dict))
    io_spec = ModelIO(inputs=tuple(inputs), outputs=tuple(outputs))
    # Triton's warm-up adds the batch dimension (batch_size 1) to these dims.
    warmup = [WarmupInput(s.name, s.dims, s.name) for s in inputs]
    write_file(
        folder / "config.pbtxt",
        config_pbtxt(name, options.max_batch_size, options, io_spec, params, warmup),
    )
    write_file(version_dir / "model.py", TORCH_MODEL_PY)
    write_file(version_dir / files.module_file.name, files.module_file.read_bytes())
    write_ps_json(folder, config)
    if options.warmup:
        for spec in inputs:
            zeros = np.zeros((1, *spec.dims), dtype=np.dtype(spec.dtype).newbyteorder("<"))
            write_file(folder / "warmup" / spec.name, zeros.tobytes())
    return folder
