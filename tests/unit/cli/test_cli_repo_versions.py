"""``hps repo --version N``: a new version next to the served one, with its own ps.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_testdata import write_model

from hps_core.cli.main import main
from hps_core.config import load_ps_config
from hps_core.demo import write_dcn_demo
from hps_core.errors import ConfigError
from hps_core.triton_repo import (
    ServingOptions,
    is_frozen,
    model_versions,
    read_config,
    write_config,
    write_repository,
)
from triton_backend.model_settings import read_settings


def _args(folder: Path, version: int) -> dict[str, str]:
    """What Triton passes to initialize, decoded as the backend sees config.pbtxt."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    return {
        "model_config": json.dumps(
            json_format.MessageToDict(config, preserving_proto_field_name=True)
        ),
        "model_repository": str(folder),
        "model_version": str(version),
        "model_name": folder.name,
    }


def _retrained(src: Path, dst: Path) -> Path:
    """A copy of the source model's tables in ``dst`` and a ps.json naming them."""
    shutil.copytree(src / "wdl", dst / "wdl")
    doc = json.loads((src / "ps.json").read_text())
    (dst / "ps.json").write_text(json.dumps(doc))
    return dst / "ps.json"


def test_version_two_has_its_own_ps_json(tmp_path: Path, capsys) -> None:
    ps, _ = write_model(tmp_path / "src")
    repo = tmp_path / "repo"
    assert main(["repo", str(ps), str(repo)]) == 0
    folder = repo / "wdl"
    config = (folder / "config.pbtxt").read_text()
    ps2 = _retrained(tmp_path / "src", tmp_path / "v2")
    capsys.readouterr()

    assert main(["repo", str(ps2), str(repo), "--version", "2"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {folder.resolve()} version 2" in out
    assert "hps reload wdl" in out
    assert model_versions(folder) == [1, 2]
    assert (folder / "config.pbtxt").read_text() == config  # same options, same config
    v2 = load_ps_config(folder / "2" / "ps.json").model("wdl")
    assert [t.sparse_file for t in v2.tables] == [
        (tmp_path / "v2" / "wdl" / "0_sparse").resolve(),
        (tmp_path / "v2" / "wdl" / "1_sparse").resolve(),
    ]
    # Each version's instances read their own ps.json.
    assert read_settings(_args(folder, 2)).ps_json == (folder / "2" / "ps.json").resolve()
    assert read_settings(_args(folder, 2)).version == 2
    assert read_settings(_args(folder, 1)).ps_json == (folder / "ps.json").resolve()
    assert not read_settings(_args(folder, 1)).freeze_sparse


@pytest.mark.parametrize("version", ["1", "2", "0"])
def test_a_version_that_exists_or_would_not_be_served_is_refused(
    tmp_path: Path, capsys, version: str
) -> None:
    ps, _ = write_model(tmp_path / "src")
    repo = tmp_path / "repo"
    assert main(["repo", str(ps), str(repo), "--version", "2"]) == 0
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    capsys.readouterr()
    assert main(["repo", str(ps), str(repo), "--version", version]) == 1
    err = capsys.readouterr().err
    expected = {
        "1": "would not be served: Triton serves the highest version and 2 exists; use --version 3",
        "2": "already exists; versions are not rewritten while they may be served, add version 3",
        "0": "--version: must be 1 or more, got 0",
    }[version]
    assert expected in err
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before


def test_freeze_sparse_keeps_the_previous_sparse_files(tmp_path: Path, capsys) -> None:
    ps, _ = write_model(tmp_path / "src")
    repo = tmp_path / "repo"
    assert main(["repo", str(ps), str(repo), "--freeze-sparse"]) == 0
    folder = repo / "wdl"
    config = read_config(folder / "config.pbtxt")
    assert config.parameters["freeze_sparse"].string_value == "true"
    assert is_frozen(folder)
    assert read_settings(_args(folder, 1)).freeze_sparse
    ps2 = _retrained(tmp_path / "src", tmp_path / "v2")

    # The flag need not be repeated: the model's config.pbtxt says it is frozen.
    assert main(["repo", str(ps2), str(repo), "--version", "2"]) == 0
    v1 = load_ps_config(folder / "ps.json").model("wdl")
    v2 = load_ps_config(folder / "2" / "ps.json").model("wdl")
    assert v2.sparse_files == v1.sparse_files
    assert "freeze_sparse" in (folder / "config.pbtxt").read_text()

    # A frozen model cannot change its tables.
    doc = json.loads(ps2.read_text())
    doc["models"][0]["embedding_table_names"] = ["users", "items"]
    ps2.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["repo", str(ps2), str(repo), "--version", "3"]) == 1
    assert "freeze_sparse keeps its tables" in capsys.readouterr().err
    assert model_versions(folder) == [1, 2]
    # Nor is version 1 rewritten under version 2 (it was, in place, by hps repo without
    # --version).
    v1_files = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert main(["repo", str(ps2), str(repo)]) == 1
    assert "has versions [1, 2]; writing it again would rewrite version 1" in (
        capsys.readouterr().err
    )
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == v1_files


def test_ranking_model_versions_both_triton_models(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    folder = write_dcn_demo(repo)
    folders = write_repository(folder / "ps.json", repo, ServingOptions(), version=2)
    samples = repo / "dcn_samples"
    assert [f.name for f in folders] == ["dcn", "dcn_samples"]
    assert model_versions(folder) == model_versions(samples) == [1, 2]
    for f in folders:
        settings = read_settings(_args(f, 2))
        assert settings.ps_json == (f / "2" / "ps.json").resolve()
        assert settings.hps_model == "dcn"
        model = load_ps_config(settings.ps_json).model("dcn")
        assert model.sparse_files == load_ps_config(folder / "ps.json").model("dcn").sparse_files
    # Version 1 of the samples model still reads the main folder's ps.json.
    assert read_settings(_args(samples, 1)).ps_json == (folder / "ps.json").resolve()


def test_a_new_version_keeps_what_the_operator_set_in_config_pbtxt(tmp_path: Path) -> None:
    """Instances, batching, warm-up and parameters such as the precision stay as the
    operator set them (by hps repo's options or by hand); the version's files decide only the
    inputs and outputs."""
    repo = tmp_path / "repo"
    folder = write_dcn_demo(repo)
    args = ["--kind", "KIND_GPU", "--gpus", "1", "--instances", "3", "--max-batch-size", "8"]
    assert main(["repo", str(folder / "ps.json"), str(repo), *args, "--no-warmup"]) == 0
    for name in ("dcn", "dcn_samples"):
        path = repo / name / "config.pbtxt"
        config = read_config(path)
        config.parameters["precision"].string_value = "tf32"  # set by hand
        write_config(path, config)
    before = {name: read_config(repo / name / "config.pbtxt") for name in ("dcn", "dcn_samples")}
    assert main(["repo", str(folder / "ps.json"), str(repo), "--version", "2"]) == 0
    for name, config in before.items():
        assert read_config(repo / name / "config.pbtxt") == config, name
    group = before["dcn"].instance_group[0]
    assert (group.count, list(group.gpus), before["dcn"].max_batch_size) == (3, [1], 8)
    assert not before["dcn"].model_warmup


def test_a_malformed_config_pbtxt_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.pbtxt").write_text('name: "m"\nparameters { key: "freeze_sparse" \n')
    with pytest.raises(ConfigError) as info:
        is_frozen(folder)
    assert str(folder / "config.pbtxt") in str(info.value)
    assert "not a Triton model configuration" in str(info.value)
