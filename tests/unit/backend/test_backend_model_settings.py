"""read_settings / check_io on the ``args`` Triton passes to ``initialize``.

The model configs are the ones ``hps repo`` writes, parsed with Triton's own protobuf schema
(from tritonclient) and turned into the JSON Triton hands to the Python backend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from hps_core.config import parse_ps_config
from hps_core.errors import ConfigError
from hps_core.infer.model_io import EMBEDDING_IO, samples_io
from hps_core.triton_repo import InstanceGroup, ServingOptions, embedding_config_pbtxt
from triton_backend.model_settings import (
    ModelSettings,
    check_instance_device,
    check_io,
    inert_parameters,
    read_settings,
)


def triton_config(triton_name: str = "emb", hps_model: str = "emb") -> dict[str, Any]:
    """The decoded config.pbtxt of a generated embedding model, as Triton's JSON."""
    config = parse_ps_config(
        {
            "supportlonglong": True,
            "models": [
                {
                    "model": hps_model,
                    "sparse_files": ["t0", "t1"],
                    "deployed_device_list": [0],
                    "default_value_for_each_table": [0.0, 0.0],
                    "maxnum_catfeature_query_per_table_per_sample": [2, 26],
                    "embedding_vecsize_per_table": [1, 16],
                }
            ],
        },
        Path("/models"),
    )
    options = ServingOptions(instances=(InstanceGroup(2, "KIND_GPU", (0,)),))
    text = embedding_config_pbtxt(triton_name, config.models[0], options, hps_model)
    message = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def triton_args(model_dir: Path, config: dict[str, Any], **extra: str) -> dict[str, str]:
    args = {
        "model_config": json.dumps(config),
        "model_repository": str(model_dir),
        "model_name": config["name"],
        "model_version": "1",
    }
    args.update(extra)
    return args


def with_parameter(config: dict[str, Any], key: str, value: str | None) -> dict[str, Any]:
    config = json.loads(json.dumps(config))
    if value is None:
        config["parameters"].pop(key, None)
    else:
        config["parameters"][key] = {"string_value": value}
    return config


def test_generated_config_reads_back(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    settings = read_settings(
        triton_args(
            tmp_path,
            triton_config(),
            model_instance_kind="GPU",
            model_instance_device_id="1",
            model_instance_name="emb_0",
        )
    )
    assert settings.triton_model == "emb" and settings.hps_model == "emb"
    assert settings.ps_json == (tmp_path / "ps.json").resolve()
    assert (settings.instance_kind, settings.device_id) == ("GPU", 1)
    assert settings.config["parameters"]["embedding_vecsize_per_table"] == {"string_value": "1,16"}
    check_io(settings.config, EMBEDDING_IO)


def test_instance_defaults_to_cpu_device_0(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    settings = read_settings(triton_args(tmp_path, triton_config()))
    assert (settings.instance_kind, settings.device_id) == ("CPU", 0)
    settings = read_settings(triton_args(tmp_path, triton_config(), model_instance_device_id=""))
    assert settings.device_id == 0


@pytest.mark.parametrize("given", ["conf/hps.json", "./conf/hps.json", "  conf/hps.json  "])
def test_ps_json_parameter_is_relative_to_the_model_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    model_dir = tmp_path / "repo" / "emb"
    (model_dir / "conf").mkdir(parents=True)
    (model_dir / "conf" / "hps.json").write_text("{}")
    monkeypatch.chdir(tmp_path)  # the server's working folder must not matter
    config = with_parameter(triton_config(), "ps_json", given)
    settings = read_settings(triton_args(model_dir, config))
    assert settings.ps_json == (model_dir / "conf" / "hps.json").resolve()
    assert settings.ps_json.is_absolute()


def test_absolute_ps_json_parameter(tmp_path: Path) -> None:
    elsewhere = tmp_path / "shared" / "ps.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text("{}")
    config = with_parameter(triton_config(), "ps_json", str(elsewhere))
    settings = read_settings(triton_args(tmp_path / "emb", config))
    assert settings.ps_json == elsewhere.resolve()


def test_hps_model_name_parameter_overrides_the_triton_name(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    settings = read_settings(triton_args(tmp_path, triton_config("emb_v2", "wdl")))
    assert (settings.triton_model, settings.hps_model) == ("emb_v2", "wdl")
    config = with_parameter(triton_config("emb_v2", "wdl"), "hps_model_name", "")
    assert read_settings(triton_args(tmp_path, config)).hps_model == "emb_v2"


def test_missing_ps_json_named_by_the_parameter(tmp_path: Path) -> None:
    config = with_parameter(triton_config(), "ps_json", "conf/ps.json")
    with pytest.raises(ConfigError) as info:
        read_settings(triton_args(tmp_path, config))
    [problem] = info.value.problems
    assert problem.where == "config.pbtxt parameters.ps_json"
    assert str(tmp_path / "conf" / "ps.json") in problem.message
    assert "'ps_json'" in problem.message


def test_missing_default_ps_json_names_the_model_folder(tmp_path: Path) -> None:
    config = with_parameter(triton_config(), "ps_json", None)
    with pytest.raises(ConfigError) as info:
        read_settings(triton_args(tmp_path, config))
    [problem] = info.value.problems
    assert problem.where == "model folder"
    assert str(tmp_path / "ps.json") in problem.message and "'ps_json'" in problem.message


def test_ps_json_parameter_naming_a_folder_is_missing(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    config = with_parameter(triton_config(), "ps_json", "conf")
    with pytest.raises(ConfigError, match=r"parameters\.ps_json"):
        read_settings(triton_args(tmp_path, config))


def test_check_io_lists_every_missing_or_mistyped_tensor() -> None:
    config = triton_config()
    config["input"] = [i for i in config["input"] if i["name"] != "KEYS"]
    config["output"][0]["data_type"] = "TYPE_FP16"
    with pytest.raises(ConfigError) as info:
        check_io(config, EMBEDDING_IO)
    problems = {(p.where, p.message) for p in info.value.problems}
    assert problems == {
        ("config.pbtxt input", "'KEYS' (TYPE_INT64) is missing"),
        ("config.pbtxt output 'OUTPUT0'", "data_type must be TYPE_FP32, got TYPE_FP16"),
    }


def test_check_io_checks_the_dims_a_contract_fixes() -> None:
    """The samples contract fixes each tensor's width: a config.pbtxt from another model
    (13 dense features, 26 keys) does not load a model of 4 and 3."""
    config = {
        "input": [
            {"name": "dense", "data_type": "TYPE_FP32", "dims": ["13"]},
            {"name": "sparse", "data_type": "TYPE_INT64", "dims": ["26"]},
        ],
        "output": [{"name": "score", "data_type": "TYPE_FP32", "dims": ["1"]}],
    }
    check_io(config, samples_io(13, 26, 1))
    with pytest.raises(ConfigError) as info:
        check_io(config, samples_io(4, 3, 1))
    assert {(p.where, p.message) for p in info.value.problems} == {
        ("config.pbtxt input 'dense'", "dims must be [4], got [13]"),
        ("config.pbtxt input 'sparse'", "dims must be [3], got [26]"),
    }


def test_check_io_without_any_tensor_section() -> None:
    with pytest.raises(ConfigError) as info:
        check_io({"name": "x"}, EMBEDDING_IO)
    assert sorted(p.message.split("'")[1] for p in info.value.problems) == [
        "KEYS",
        "NUMKEYS",
        "OUTPUT0",
    ]


def test_gpu_instance_outside_deployed_devices_is_refused() -> None:
    def settings(kind: str, device: int) -> ModelSettings:
        return ModelSettings("m", "m", Path("/ps.json"), kind, device, {}, instance_name="m_0")

    check_instance_device(settings("GPU", 1), [0, 1], "model 'm'")
    check_instance_device(settings("CPU", 3), [0], "model 'm'")  # CPU instances use no cache
    with pytest.raises(ConfigError) as info:
        check_instance_device(settings("GPU", 2), [0, 1], "model 'm'")
    text = str(info.value)
    assert "model 'm'.deployed_device_list" in text and "GPU 2" in text and "m_0" in text


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("true", True), ("False", False), ("no", False)]
)
def test_share_gpu_cache_parameter(tmp_path: Path, value: str | None, expected: bool) -> None:
    (tmp_path / "ps.json").write_text("{}")
    config = with_parameter(triton_config(), "share_gpu_cache", value)
    assert read_settings(triton_args(tmp_path, config)).share_gpu_cache is expected


def test_share_gpu_cache_parameter_must_be_a_boolean(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    config = with_parameter(triton_config(), "share_gpu_cache", "sometimes")
    with pytest.raises(ConfigError) as info:
        read_settings(triton_args(tmp_path, config))
    [problem] = info.value.problems
    assert problem.where == "config.pbtxt parameters.share_gpu_cache"
    assert "'sometimes'" in problem.message


@pytest.mark.parametrize("value, want", [(None, None), ("TF32", "tf32"), ("fp16", "fp16")])
def test_precision_parameter(tmp_path: Path, value: str | None, want: str | None) -> None:
    """None: not given, the ps.json's use_mixed_precision decides (the ranking model)."""
    (tmp_path / "ps.json").write_text("{}")
    config = with_parameter(triton_config(), "precision", value)
    assert read_settings(triton_args(tmp_path, config)).precision == want


def test_unknown_precision_is_named(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    config = with_parameter(triton_config(), "precision", "bf16")
    with pytest.raises(ConfigError, match=r"parameters\.precision: must be one of fp32"):
        read_settings(triton_args(tmp_path, config))


def test_a_default_miss_policy_is_said_to_be_without_effect(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    config = with_parameter(triton_config(), "async_miss_policy", "default")
    (line,) = inert_parameters(read_settings(triton_args(tmp_path, config)))
    assert line.startswith(
        "config.pbtxt parameters.async_miss_policy = default: accepted without effect: GPU "
        "lookups answer every missed key with its true row"
    )
    for policy in ("fetch", None):
        config = with_parameter(triton_config(), "async_miss_policy", policy)
        assert inert_parameters(read_settings(triton_args(tmp_path, config))) == []
