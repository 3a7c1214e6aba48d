"""Read and check what Triton passes to ``initialize``: config.pbtxt and the model folder.

Plain Python (no ``triton_python_backend_utils``), so it is tested without a server. Every
problem is raised as a :class:`~hps_core.errors.ConfigError` naming the config.pbtxt field,
which Triton shows as the reason the model failed to load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hps_core.errors import ConfigError, Problem
from hps_core.infer.model_io import (
    FREEZE_SPARSE_PARAMETER,
    HOT_KEYS_PARAMETER,
    HPS_MODEL_PARAMETER,
    MISS_POLICY_PARAMETER,
    PRECISION_PARAMETER,
    PS_JSON_PARAMETER,
    SHARE_CACHE_PARAMETER,
    SOURCE_PS_JSON_PARAMETER,
    ModelIO,
)

PRECISIONS = ("fp32", "tf32", "fp16")
VERSION_PS_JSON = "ps.json"
"""A version folder's own ps.json (``<model>/<version>/ps.json``), preferred to the model's."""
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class ModelSettings:
    """Where this Triton model finds its HPS model, and how its instance runs.

    Args:
        triton_model: the Triton model name.
        hps_model: the ``model`` name inside the ps.json.
        ps_json: absolute path of the ps.json.
        instance_kind: ``"CPU"`` or ``"GPU"``.
        device_id: GPU of the instance (0 for CPU instances).
        config: the decoded config.pbtxt.
        instance_name: Triton's name of this instance.
        miss_policy: HugeCTR's ``async_miss_policy``: ``"fetch"`` (true vectors) or
            ``"default"`` (HugeCTR: default vectors for asynchronous misses); accepted and
            said to be without effect (:func:`inert_parameters`): every GPU lookup here
            answers a miss with its true vector.
        hot_keys: folder of ``<table name>.npy`` key arrays, hottest first, to warm the GPU
            caches with; ``None`` uses each sparse folder's ``meta`` file or file order.
        share_gpu_cache: GPU instances on one GPU share its dynamic caches (CUDA IPC) instead
            of holding one copy each.
        version: the Triton model version this instance serves.
        freeze_sparse: HugeCTR's ``freeze_sparse``: new versions of this model keep the
            sparse files of the version they replace (applied when a version is written, see
            :mod:`hps_core.triton_repo`; here it is checked and logged).
        precision: a ranking model's dense network: ``"fp32"``, ``"tf32"`` or ``"fp16"``
            (parameter ``precision``; HugeCTR's ``mixed_precision`` is FP16); ``None`` when
            not given: the ps.json's ``use_mixed_precision`` decides (FP16, else FP32).
        source_ps_json: the user's ps.json that ``ps_json`` was written from (parameter
            ``source_ps_json``, set by the translation of a HugeCTR repository), or ``None``
            when ``ps_json`` is the user's own.
    """

    triton_model: str
    hps_model: str
    ps_json: Path
    instance_kind: str
    device_id: int
    config: Mapping[str, Any]
    instance_name: str = ""
    miss_policy: str = "fetch"
    hot_keys: Path | None = None
    share_gpu_cache: bool = True
    version: int = 1
    freeze_sparse: bool = False
    precision: str | None = None
    source_ps_json: Path | None = None

    @property
    def shown_ps_json(self) -> Path:
        """The ps.json the model's log lines and errors name: the one the user wrote."""
        return self.ps_json if self.source_ps_json is None else self.source_ps_json

    @property
    def lookup_device(self) -> int | None:
        """The GPU whose caches serve this instance, ``None`` for a CPU instance."""
        return self.device_id if self.instance_kind == "GPU" else None


def _boolean(config: Mapping[str, Any], key: str, default: bool) -> bool:
    text = parameter(config, key)
    if text is None:
        return default
    if text.lower() not in _BOOLEANS:
        raise ConfigError(
            Problem(f"config.pbtxt parameters.{key}", f"must be 'true' or 'false', got '{text}'")
        )
    return _BOOLEANS[text.lower()]


def parameter(config: Mapping[str, Any], key: str) -> str | None:
    """config.pbtxt's ``parameters[key].string_value``, stripped; ``None`` if absent or empty."""
    value = config.get("parameters", {}).get(key)
    if value is None:
        return None
    return str(value.get("string_value", "")).strip() or None


def _io_by_name(config: Mapping[str, Any], section: str) -> dict[str, Mapping[str, Any]]:
    return {item["name"]: item for item in config.get(section, [])}


def check_io(config: Mapping[str, Any], io: ModelIO) -> None:
    """Check that config.pbtxt declares the tensors of the model's contract as the contract
    declares them (:mod:`hps_core.infer.model_io`): each input and output, its data type, and
    its dims where the contract fixes them.

    Args:
        config: decoded config.pbtxt (Triton's JSON).
        io: the contract's tensors.

    Raises:
        ConfigError: listing every missing tensor, wrong data type or wrong dims.
    """
    problems = []
    for section, wanted in (("input", io.inputs), ("output", io.outputs)):
        declared = _io_by_name(config, section)
        for spec in wanted:
            if spec.name not in declared:
                problems.append(
                    Problem(
                        f"config.pbtxt {section}", f"'{spec.name}' ({spec.data_type}) is missing"
                    )
                )
                continue
            where = f"config.pbtxt {section} '{spec.name}'"
            got = declared[spec.name]
            data_type = got.get("data_type")
            if data_type != spec.data_type:
                message = f"data_type must be {spec.data_type}, got {data_type}"
                problems.append(Problem(where, message))
            dims = [int(d) for d in got.get("dims", [])]
            if -1 not in spec.dims and dims != list(spec.dims):
                problems.append(Problem(where, f"dims must be {list(spec.dims)}, got {dims}"))
    if problems:
        raise ConfigError(problems)


def inert_parameters(settings: ModelSettings) -> list[str]:
    """config.pbtxt parameters a model accepts without effect, one line each (logged at load,
    as the ps.json's inert fields are).

    Args:
        settings: the model instance's settings.

    Returns:
        The lines; empty when none is set.
    """
    lines = []
    if settings.miss_policy == "default":
        lines.append(
            f"config.pbtxt parameters.{MISS_POLICY_PARAMETER} = default: accepted without effect: "
            "GPU lookups answer every missed key with its true row (from the host tier and the "
            "tiers below it) and insert it after the answer, never a default vector; no "
            "engine here acts on it"
        )
    return lines


def check_instance_device(settings: ModelSettings, deployed: Sequence[int], where: str) -> None:
    """A GPU instance must run on a GPU of the model's ``deployed_device_list``.

    HugeCTR builds a model's embedding caches on those devices only; an instance elsewhere is
    a placement mistake in config.pbtxt (``instance_group.gpus``) or in the ps.json.

    Args:
        settings: the instance's settings.
        deployed: the model's ``deployed_device_list``.
        where: the ps.json path of the model, e.g. ``models[0]``.

    Raises:
        ConfigError: naming the ps.json field and the instance's GPU.
    """
    device = settings.lookup_device
    if device is not None and device not in deployed:
        raise ConfigError(
            Problem(
                f"{where}.deployed_device_list",
                f"is {list(deployed)} but instance '{settings.instance_name}' runs on GPU "
                f"{device}; add {device} to the list or set instance_group gpus in config.pbtxt",
            )
        )


def read_settings(args: Mapping[str, str]) -> ModelSettings:
    """Decode the ``args`` of ``TritonPythonModel.initialize``.

    The ps.json is the version folder's own ``<model>/<version>/ps.json`` when it exists
    (each version of a model names its own files), else the one the config.pbtxt parameter
    ``ps_json`` names (relative to the model folder), else ``ps.json`` in the model folder.
    The ps.json model defaults to the Triton model's name, as in HugeCTR's backends, unless
    the parameter ``hps_model_name`` names it.

    Args:
        args: Triton's ``initialize`` arguments.

    Returns:
        The model's settings.

    Raises:
        ConfigError: the ps.json cannot be found.
    """
    config = json.loads(args["model_config"])
    model_dir = Path(args["model_repository"])
    name = args["model_name"]
    given = parameter(config, PS_JSON_PARAMETER)
    version = str(args.get("model_version", "") or "1")
    own = model_dir / version / VERSION_PS_JSON
    ps_json = own if own.is_file() else (model_dir / given) if given else model_dir / "ps.json"
    if not ps_json.is_file():
        where = f"config.pbtxt parameters.{PS_JSON_PARAMETER}" if given else "model folder"
        raise ConfigError(
            Problem(where, f"ps.json not found at {ps_json} (set parameter '{PS_JSON_PARAMETER}')")
        )
    policy = parameter(config, MISS_POLICY_PARAMETER) or "fetch"
    if policy not in ("fetch", "default"):
        raise ConfigError(
            Problem(
                f"config.pbtxt parameters.{MISS_POLICY_PARAMETER}",
                f"must be 'fetch' or 'default', got '{policy}'",
            )
        )
    hot = parameter(config, HOT_KEYS_PARAMETER)
    hot_keys = (model_dir / hot).resolve() if hot else None
    if hot_keys is not None and not hot_keys.is_dir():
        raise ConfigError(
            Problem(f"config.pbtxt parameters.{HOT_KEYS_PARAMETER}", f"not a folder: {hot_keys}")
        )
    share = _boolean(config, SHARE_CACHE_PARAMETER, True)
    freeze = _boolean(config, FREEZE_SPARSE_PARAMETER, False)
    precision = (parameter(config, PRECISION_PARAMETER) or "").lower() or None
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(
            Problem(
                f"config.pbtxt parameters.{PRECISION_PARAMETER}",
                f"must be one of {', '.join(PRECISIONS)}, got '{precision}'",
            )
        )
    source = parameter(config, SOURCE_PS_JSON_PARAMETER)
    return ModelSettings(
        triton_model=name,
        hps_model=parameter(config, HPS_MODEL_PARAMETER) or name,
        ps_json=ps_json.resolve(),
        instance_kind=args.get("model_instance_kind", "CPU"),
        device_id=int(args.get("model_instance_device_id", 0) or 0),
        config=config,
        instance_name=args.get("model_instance_name", name),
        miss_policy=policy,
        hot_keys=hot_keys,
        share_gpu_cache=share,
        version=int(version) if version.isdigit() else 1,
        freeze_sparse=freeze,
        precision=precision,
        source_ps_json=Path(source) if source else None,
    )
