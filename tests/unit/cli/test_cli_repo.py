"""``hps repo``: a model repository Triton can load, whose ps.json serves the same rows."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_testdata import TABLES, ps_document, write_model, write_ps
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from hps_core import HPS
from hps_core.cli.main import main
from hps_core.config import load_ps_config, parse_ps_config
from hps_core.formats.sparse import inspect_sparse_table
from hps_core.triton_repo import InstanceGroup, ServingOptions, placed_on_deployed_devices
from triton_backend.model_settings import read_settings


def parse_pbtxt(path: Path) -> model_config_pb2.ModelConfig:
    """config.pbtxt through Triton's own schema: a syntax or field error fails here."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def run_repo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["repo", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_repository_layout_and_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps, _ = write_model(tmp_path / "src")
    out_dir = tmp_path / "repo"
    code, out, err = run_repo(capsys, str(ps), str(out_dir))
    assert code == 0, err
    folder = out_dir / "wdl"
    assert f"wrote {folder}" in out.splitlines()
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "1/model.py",
        "config.pbtxt",
        "ps.json",
        "warmup/keys",
        "warmup/numkeys",
    ]

    config = parse_pbtxt(folder / "config.pbtxt")
    assert (config.name, config.backend, config.max_batch_size) == ("wdl", "python", 16)
    inputs = {i.name: model_config_pb2.DataType.Name(i.data_type) for i in config.input}
    assert inputs == {"KEYS": "TYPE_INT64", "NUMKEYS": "TYPE_INT32"}
    assert [(o.name, model_config_pb2.DataType.Name(o.data_type)) for o in config.output] == [
        ("OUTPUT0", "TYPE_FP32")
    ]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["ps_json"] == "ps.json"
    assert params["embedding_vecsize_per_table"] == ",".join(str(d) for _, _, d in TABLES)
    [group] = config.instance_group
    assert (group.count, model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)) == (
        2,
        "KIND_CPU",
    )

    tree = ast.parse((folder / "1" / "model.py").read_text())
    imported = [
        (n.module, a.name, a.asname) for n in tree.body if isinstance(n, ast.ImportFrom)
        for a in n.names
    ]  # fmt: skip
    assert ("triton_backend.embedding_model", "EmbeddingModel", "TritonPythonModel") in imported


def test_warmup_files_have_one_entry_per_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path / "src")
    assert run_repo(capsys, str(ps), str(tmp_path / "repo"))[0] == 0
    folder = tmp_path / "repo" / "wdl"
    tables = len(TABLES)
    [warmup] = parse_pbtxt(folder / "config.pbtxt").model_warmup
    assert warmup.batch_size == 1
    for name, dtype in (("KEYS", "<i8"), ("NUMKEYS", "<i4")):
        spec = warmup.inputs[name]
        assert list(spec.dims) == [tables]
        data = (folder / "warmup" / spec.input_data_file).read_bytes()
        assert len(data) == tables * np.dtype(dtype).itemsize
    counts = np.frombuffer((folder / "warmup" / "numkeys").read_bytes(), "<i4")
    assert counts.tolist() == [1] * tables


def test_written_ps_json_serves_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shm_path: Path
) -> None:
    ps, data = write_model(tmp_path / "src")
    assert run_repo(capsys, str(ps), str(tmp_path / "repo"))[0] == 0
    folder = tmp_path / "repo" / "wdl"
    original, written = load_ps_config(ps), load_ps_config(folder / "ps.json")
    assert [t.sparse_file for t in written.models[0].tables] == [
        t.sparse_file for t in original.models[0].tables
    ]
    # What the Triton model would read at initialize, then serve.
    config = json_format.MessageToDict(
        parse_pbtxt(folder / "config.pbtxt"), preserving_proto_field_name=True
    )
    settings = read_settings(
        {
            "model_config": json.dumps(config),
            "model_repository": str(folder),
            "model_name": "wdl",
        }
    )
    assert settings.ps_json == (folder / "ps.json").resolve()
    hps = HPS(settings.ps_json)
    for t, (keys, vectors) in enumerate(data):
        np.testing.assert_array_equal(hps.lookup(keys[:50], settings.hps_model, t), vectors[:50])
    hps.close()
    assert list(shm_path.iterdir()) == []


def test_sparse_paths_inside_the_model_folder_stay_relative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's ps.json already sits in the model folder: regenerating in place keeps the
    repository movable."""
    repo = tmp_path / "repo"
    write_model(repo)  # tables under repo/wdl/..., the original ps.json in repo/
    ps = write_ps(
        repo / "wdl" / "ps.json",
        ps_document(["0_sparse", "1_sparse"], [d for _, _, d in TABLES]),
    )
    assert run_repo(capsys, str(ps), str(repo))[0] == 0
    written = json.loads((repo / "wdl" / "ps.json").read_text())
    assert written["models"][0]["sparse_files"] == ["0_sparse", "1_sparse"]

    moved = tmp_path / "moved"
    shutil.move(repo, moved)
    config = load_ps_config(moved / "wdl" / "ps.json")
    for table, (_, rows, dim) in zip(config.models[0].tables, TABLES, strict=True):
        assert table.sparse_file.is_relative_to(moved / "wdl")
        info = inspect_sparse_table(table.sparse_file, table.dim)
        assert (info.rows, info.dim) == (rows, dim)


def test_serving_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps, _ = write_model(tmp_path / "src")
    code, _, err = run_repo(
        capsys,
        str(ps),
        str(tmp_path / "repo"),
        "--instances", "3", "--kind", "KIND_GPU", "--gpus", "0,1",
        "--max-batch-size", "64", "--no-warmup",
    )  # fmt: skip
    assert code == 0, err
    folder = tmp_path / "repo" / "wdl"
    config = parse_pbtxt(folder / "config.pbtxt")
    assert config.max_batch_size == 64 and not config.model_warmup
    [group] = config.instance_group
    assert (group.count, list(group.gpus)) == (3, [0, 1])
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_GPU"
    assert not (folder / "warmup").exists()
    assert config.parameters["share_gpu_cache"].string_value == "true"


def test_private_gpu_caches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps, _ = write_model(tmp_path / "src")
    args = ["--kind", "KIND_GPU", "--private-gpu-caches"]
    code, _, err = run_repo(capsys, str(ps), str(tmp_path / "repo"), *args)
    assert code == 0, err
    config = parse_pbtxt(tmp_path / "repo" / "wdl" / "config.pbtxt")
    assert config.parameters["share_gpu_cache"].string_value == "false"


def test_one_folder_per_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps, _ = write_model(tmp_path / "src")
    doc = json.loads(ps.read_text())
    second = dict(doc["models"][0], model="wdl_small")
    second.update(
        sparse_files=["wdl/1_sparse"],
        embedding_vecsize_per_table=[1],
        default_value_for_each_table=[0.0],
        maxnum_catfeature_query_per_table_per_sample=[3],
    )
    doc["models"].append(second)
    ps.write_text(json.dumps(doc))
    assert run_repo(capsys, str(ps), str(tmp_path / "repo"))[0] == 0
    small = parse_pbtxt(tmp_path / "repo" / "wdl_small" / "config.pbtxt")
    assert small.name == "wdl_small"
    assert small.parameters["embedding_vecsize_per_table"].string_value == "1"
    assert list(small.model_warmup[0].inputs["KEYS"].dims) == [1]
    assert (tmp_path / "repo" / "wdl" / "config.pbtxt").is_file()


def test_broken_ps_json_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps, _ = write_model(tmp_path / "src")
    shutil.rmtree(tmp_path / "src" / "wdl" / "1_sparse")
    code, out, err = run_repo(capsys, str(ps), str(tmp_path / "repo"))
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.splitlines() == [
        f"models[0].sparse_files[1]: {tmp_path / 'src/wdl/1_sparse'}: "
        "sparse model folder does not exist"
    ]
    assert not (tmp_path / "repo").exists()


def test_table_name_with_a_quote_gives_a_loadable_config_or_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path / "src")
    doc = json.loads(ps.read_text())
    doc["models"][0]["embedding_table_names"] = ['wide"table', "deep"]
    ps.write_text(json.dumps(doc))
    code, _, err = run_repo(capsys, str(ps), str(tmp_path / "repo"))
    if code != 0:  # refusing the name is fine if the message names the field
        assert code == 1 and err.startswith("models[0].embedding_table_names")
        return
    config = parse_pbtxt(tmp_path / "repo" / "wdl" / "config.pbtxt")
    assert config.parameters["table_names"].string_value == 'wide"table,deep'


def test_gpu_instances_default_to_the_deployed_devices() -> None:
    config = parse_ps_config(
        {
            "supportlonglong": True,
            "models": [
                {
                    "model": "m",
                    "sparse_files": ["t"],
                    "embedding_vecsize_per_table": [4],
                    "default_value_for_each_table": [0.0],
                    "maxnum_catfeature_query_per_table_per_sample": [2],
                    "deployed_device_list": [1, 3],
                }
            ],
        },
        base_dir=".",
    )
    groups = (InstanceGroup(2, "KIND_GPU"), InstanceGroup(1, "KIND_GPU", (0,)), InstanceGroup())
    placed = placed_on_deployed_devices(ServingOptions(instances=groups), config.models[0])
    assert [g.gpus for g in placed.instances] == [(1, 3), (0,), ()]
