"""Read and check what Triton passes to ``initialize``: config.pbtxt and the model folder.

Plain Python (no ``triton_python_backend_utils``), so it is tested without a server. Every
problem is raised as a :class:`~hps_core.errors.ConfigError` naming the config.pbtxt field,
which Triton shows as the reason the model failed to load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hps_core.errors import ConfigError, Problem

PS_JSON_PARAMETER = "ps_json"
HPS_MODEL_PARAMETER = "hps_model_name"


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
    """

    triton_model: str
    hps_model: str
    ps_json: Path
    instance_kind: str
    device_id: int
    config: Mapping[str, Any]


def _parameter(config: Mapping[str, Any], key: str) -> str | None:
    value = config.get("parameters", {}).get(key)
    if value is None:
        return None
    return str(value.get("string_value", "")).strip() or None


def _io_by_name(config: Mapping[str, Any], section: str) -> dict[str, Mapping[str, Any]]:
    return {item["name"]: item for item in config.get(section, [])}


def check_io(
    config: Mapping[str, Any],
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
) -> None:
    """Check that config.pbtxt declares the inputs and outputs the model needs.

    Args:
        config: decoded config.pbtxt.
        inputs: required input name -> Triton data type (e.g. ``"TYPE_INT64"``).
        outputs: required output name -> Triton data type.

    Raises:
        ConfigError: listing every missing tensor or wrong data type.
    """
    problems = []
    for section, wanted in (("input", inputs), ("output", outputs)):
        declared = _io_by_name(config, section)
        for name, dtype in wanted.items():
            if name not in declared:
                problems.append(
                    Problem(f"config.pbtxt {section}", f"'{name}' ({dtype}) is missing")
                )
            elif declared[name].get("data_type") != dtype:
                problems.append(
                    Problem(
                        f"config.pbtxt {section} '{name}'",
                        f"data_type must be {dtype}, got {declared[name].get('data_type')}",
                    )
                )
    if problems:
        raise ConfigError(problems)


def read_settings(args: Mapping[str, str]) -> ModelSettings:
    """Decode the ``args`` of ``TritonPythonModel.initialize``.

    The ps.json comes from the config.pbtxt parameter ``ps_json`` (relative to the model
    folder), else ``ps.json`` in the model folder. The ps.json model defaults to the Triton
    model's name, as in HugeCTR's backends, unless the parameter ``hps_model_name`` names it.

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
    given = _parameter(config, PS_JSON_PARAMETER)
    ps_json = (model_dir / given) if given else model_dir / "ps.json"
    if not ps_json.is_file():
        where = f"config.pbtxt parameters.{PS_JSON_PARAMETER}" if given else "model folder"
        raise ConfigError(
            Problem(where, f"ps.json not found at {ps_json} (set parameter '{PS_JSON_PARAMETER}')")
        )
    return ModelSettings(
        triton_model=name,
        hps_model=_parameter(config, HPS_MODEL_PARAMETER) or name,
        ps_json=ps_json.resolve(),
        instance_kind=args.get("model_instance_kind", "CPU"),
        device_id=int(args.get("model_instance_device_id", 0) or 0),
        config=config,
    )
