"""Write Triton model folders that serve ps.json models through ``triton_backend``.

Used by ``hps repo`` (a HugeCTR user's ps.json -> a ready model repository) and by
``hps prepare`` for the default repository, so both produce the same layout::

    <repo>/<model>/config.pbtxt
    <repo>/<model>/ps.json         the ps.json, file paths relative to this folder when inside
    <repo>/<model>/1/model.py      one import of triton_backend
    <repo>/<model>/warmup/...      a warm-up request that loads the tables before READY
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hps_core.config import ModelConfig, PSConfig, load_ps_config

EMBEDDING_MODEL_PY = '''\
"""Triton entry point: HugeCTR's `hps` lookup contract (KEYS, NUMKEYS -> OUTPUT0)."""

from triton_backend.embedding_model import EmbeddingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''


@dataclass(frozen=True)
class InstanceGroup:
    """One ``instance_group`` entry of config.pbtxt.

    Args:
        count: instances per device (per GPU for ``KIND_GPU``).
        kind: ``KIND_CPU``, ``KIND_GPU`` or ``KIND_AUTO``.
        gpus: GPUs of ``KIND_GPU`` instances; empty means every visible GPU.
    """

    count: int = 2
    kind: str = "KIND_CPU"
    gpus: tuple[int, ...] = ()

    def pbtxt(self) -> str:
        """The entry in config.pbtxt syntax."""
        gpus = f" gpus: [ {', '.join(map(str, self.gpus))} ]" if self.gpus else ""
        return f"{{ count: {self.count} kind: {self.kind}{gpus} }}"


@dataclass(frozen=True)
class ServingOptions:
    """How Triton batches and places a generated model.

    Args:
        max_batch_size: requests Triton's dynamic batcher may hand to one ``execute``.
        max_queue_delay_us: how long the batcher waits to fill a batch.
        instances: the instance groups.
        warmup: add a warm-up request that loads the tables before the model is READY.
    """

    max_batch_size: int = 16
    max_queue_delay_us: int = 100
    instances: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    warmup: bool = True


def embedding_config_pbtxt(
    triton_name: str, model: ModelConfig, options: ServingOptions, hps_model: str | None = None
) -> str:
    """config.pbtxt of an embedding-lookup model (HugeCTR ``hps`` contract).

    Args:
        triton_name: the Triton model name (the folder name).
        model: the ps.json model it serves.
        options: batching and placement.
        hps_model: the ps.json model name when it differs from ``triton_name``.

    Returns:
        The file's text.
    """
    dims = ",".join(str(t.dim) for t in model.tables)
    names = ",".join(t.name for t in model.tables)
    params = [("ps_json", "ps.json"), ("embedding_vecsize_per_table", dims), ("table_names", names)]
    if hps_model and hps_model != triton_name:
        params.append(("hps_model_name", hps_model))
    parameters = ",\n".join(
        f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params
    )
    groups = ",\n".join(f"  {g.pbtxt()}" for g in options.instances)
    warmup = ""
    if options.warmup:
        t = len(model.tables)
        warmup = f"""
model_warmup [
  {{
    name: "load_tables"
    batch_size: 1
    inputs {{
      key: "KEYS"
      value: {{ data_type: TYPE_INT64 dims: [ {t} ] input_data_file: "keys" }}
    }}
    inputs {{
      key: "NUMKEYS"
      value: {{ data_type: TYPE_INT32 dims: [ {t} ] input_data_file: "numkeys" }}
    }}
  }}
]"""
    return f"""name: "{triton_name}"
backend: "python"
max_batch_size: {options.max_batch_size}
dynamic_batching {{ max_queue_delay_microseconds: {options.max_queue_delay_us} }}
input [
  {{ name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}
]
instance_group [
{groups}
]
parameters [
{parameters}
]{warmup}
"""


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    os.replace(tmp, path)


def write_embedding_model(
    repo_dir: Path,
    config: PSConfig,
    model: ModelConfig,
    options: ServingOptions | None = None,
    triton_name: str | None = None,
) -> Path:
    """Write one embedding-lookup model folder.

    Args:
        repo_dir: the model repository.
        config: the whole ps.json (written into the folder).
        model: the model to serve.
        options: batching and placement.
        triton_name: folder / Triton name; the ps.json model name by default.

    Returns:
        The model folder.
    """
    options = options or ServingOptions()
    name = triton_name or model.name
    folder = (repo_dir / name).resolve()
    _write(folder / "config.pbtxt", embedding_config_pbtxt(name, model, options, model.name))
    _write(folder / "1" / "model.py", EMBEDDING_MODEL_PY)
    _write(folder / "ps.json", json.dumps(config.to_dict(relative_to=folder), indent=2) + "\n")
    if options.warmup:
        # One key per table: loading every table is the point, the key need not exist.
        t = len(model.tables)
        _write(folder / "warmup" / "keys", np.zeros(t, dtype="<i8").tobytes())
        _write(folder / "warmup" / "numkeys", np.ones(t, dtype="<i4").tobytes())
    return folder


def write_repository(
    ps_json: str | os.PathLike[str], out_dir: str | os.PathLike[str], options: ServingOptions
) -> list[Path]:
    """Write a model repository serving every model of a ps.json.

    Args:
        ps_json: the HugeCTR ps.json.
        out_dir: the repository folder (created if needed).
        options: batching and placement of every model.

    Returns:
        The model folders written.
    """
    config = load_ps_config(ps_json)
    repo = Path(out_dir)
    return [write_embedding_model(repo, config, model, options) for model in config.models]
