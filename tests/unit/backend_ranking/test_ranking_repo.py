"""``hps repo`` for ranking models: two Triton models per ps.json model, configs Triton's own
schema accepts, warm-up requests the contract accepts, and mismatches reported before any file
is written."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from network_files import OWN
from ranking_testdata import write_ranking_files
from tritonclient.grpc import model_config_pb2

from hps_core.cli.main import main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer import RankingSession
from hps_core.infer.contracts import HugeCTRContract, SamplesContract
from triton_backend.model_settings import read_settings

KIND = model_config_pb2.ModelInstanceGroup.Kind.Name
TYPE = model_config_pb2.DataType.Name


def parse_pbtxt(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def tensors(items) -> list[tuple[str, str, list[int], bool]]:
    return [
        (t.name, TYPE(t.data_type), list(t.dims), getattr(t, "allow_ragged_batch", False))
        for t in items
    ]


def imports(model_py: Path) -> list[tuple[str, str, str]]:
    tree = ast.parse(model_py.read_text())
    return [
        (node.module, alias.name, alias.asname)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]


def settings_of(folder: Path):
    config = json_format.MessageToDict(
        parse_pbtxt(folder / "config.pbtxt"), preserving_proto_field_name=True
    )
    args = {
        "model_config": json.dumps(config),
        "model_repository": str(folder),
        "model_name": folder.name,
    }
    return read_settings(args)


def warmup_inputs(folder: Path, config: model_config_pb2.ModelConfig) -> list[np.ndarray]:
    """The warm-up request's arrays, ``[1, ...]`` like Triton sends them (batch_size 1)."""
    [warmup] = config.model_warmup
    dtypes = {"TYPE_FP32": np.float32, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64}
    arrays = []
    for tensor in config.input:
        spec = warmup.inputs[tensor.name]
        dtype = dtypes[TYPE(spec.data_type)]
        if spec.zero_data:
            data = np.zeros(list(spec.dims), dtype)
        else:
            data = np.frombuffer((folder / "warmup" / spec.input_data_file).read_bytes(), dtype)
        arrays.append(data.reshape([warmup.batch_size, *spec.dims]))
    return arrays


@pytest.fixture
def wdl(tmp_path: Path):
    return write_ranking_files(tmp_path / "src", OWN["wdl"], seed=3, name="wdl", max_batch_size=32)


def test_ranking_model_gets_both_contracts(
    wdl, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    assert main(["repo", str(wdl.ps_json), str(repo)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"wrote {repo.resolve() / 'wdl'}", f"wrote {repo.resolve() / 'wdl_samples'}"]

    main_config = parse_pbtxt(repo / "wdl" / "config.pbtxt")
    assert (main_config.name, main_config.backend, main_config.max_batch_size) == (
        "wdl",
        "python",
        16,
    )
    assert tensors(main_config.input) == [
        ("DES", "TYPE_FP32", [-1], True),
        ("CATCOLUMN", "TYPE_INT64", [-1], True),
        ("ROWINDEX", "TYPE_INT32", [-1], True),
    ]
    assert tensors(main_config.output) == [("OUTPUT0", "TYPE_FP32", [-1], False)]
    params = {k: v.string_value for k, v in main_config.parameters.items()}
    assert params == {
        "ps_json": "ps.json",
        "des_feature_num": "13",
        "slots": "2,26",
        "label_dim": "1",
    }
    assert imports(repo / "wdl" / "1" / "model.py") == [
        ("triton_backend.ranking_model", "HugeCTRRankingModel", "TritonPythonModel")
    ]

    samples = parse_pbtxt(repo / "wdl_samples" / "config.pbtxt")
    assert (samples.name, samples.max_batch_size) == ("wdl_samples", 32)
    assert tensors(samples.input) == [
        ("dense", "TYPE_FP32", [13], False),
        ("sparse", "TYPE_INT64", [28], False),
    ]
    assert tensors(samples.output) == [("score", "TYPE_FP32", [1], False)]
    assert imports(repo / "wdl_samples" / "1" / "model.py") == [
        ("triton_backend.ranking_model", "SamplesRankingModel", "TritonPythonModel")
    ]
    assert sorted(p.name for p in (repo / "wdl_samples").iterdir()) == ["1", "config.pbtxt"]
    for config in (main_config, samples):
        [group] = config.instance_group
        assert (group.count, KIND(group.kind)) == (2, "KIND_CPU")


def test_both_models_read_the_same_ps_json(wdl, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert main(["repo", str(wdl.ps_json), str(repo)]) == 0
    for folder in ("wdl", "wdl_samples"):
        settings = settings_of(repo / folder)
        assert settings.ps_json == (repo / "wdl" / "ps.json").resolve()
        assert settings.hps_model == "wdl"
    written = json.loads((repo / "wdl" / "ps.json").read_text())["models"][0]
    assert Path(written["network_file"]) == wdl.network_file
    assert Path(written["dense_file"]) == wdl.dense_file


def test_warmup_requests_are_valid_samples(wdl, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert main(["repo", str(wdl.ps_json), str(repo)]) == 0
    session = RankingSession.open(repo / "wdl" / "ps.json", "wdl")
    for folder, contract in (("wdl", HugeCTRContract), ("wdl_samples", SamplesContract)):
        config = parse_pbtxt(repo / folder / "config.pbtxt")
        batch = contract(session.layout).parse(*warmup_inputs(repo / folder, config))
        assert batch.batch_size == 1
        assert [k.size for k in batch.keys] == [2, 26]  # one key per slot
        assert session.predict(batch).shape == (1, 1)


def test_no_warmup_and_serving_options(wdl, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    args = ["--instances", "1", "--kind", "KIND_GPU", "--gpus", "0", "--max-batch-size", "8"]
    assert main(["repo", str(wdl.ps_json), str(repo), *args, "--no-warmup"]) == 0
    for folder in ("wdl", "wdl_samples"):
        config = parse_pbtxt(repo / folder / "config.pbtxt")
        assert not config.model_warmup
        [group] = config.instance_group
        assert (group.count, KIND(group.kind), list(group.gpus)) == (1, "KIND_GPU", [0])
    assert parse_pbtxt(repo / "wdl" / "config.pbtxt").max_batch_size == 8
    assert parse_pbtxt(repo / "wdl_samples" / "config.pbtxt").max_batch_size == 32
    assert not (repo / "wdl" / "warmup").exists()


def test_ranking_and_embedding_models_in_one_ps_json(wdl, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    write_sparse_table(
        wdl.ps_json.parent / "lookup_table",
        np.arange(100, dtype=np.int64),
        rng.standard_normal((100, 8), dtype=np.float32),
    )
    doc = json.loads(wdl.ps_json.read_text())
    doc["models"].append(
        {
            "model": "lookup",
            "sparse_files": ["lookup_table"],
            "embedding_vecsize_per_table": [8],
            "maxnum_catfeature_query_per_table_per_sample": [4],
            "default_value_for_each_table": [0.0],
            "deployed_device_list": [0],
        }
    )
    wdl.ps_json.write_text(json.dumps(doc))
    repo = tmp_path / "repo"
    assert main(["repo", str(wdl.ps_json), str(repo)]) == 0
    assert sorted(p.name for p in repo.iterdir()) == ["lookup", "wdl", "wdl_samples"]
    lookup = parse_pbtxt(repo / "lookup" / "config.pbtxt")
    assert [t.name for t in lookup.input] == ["KEYS", "NUMKEYS"]


def test_mismatch_is_reported_and_nothing_written(
    wdl, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(wdl.ps_json.read_text())
    doc["models"][0]["maxnum_catfeature_query_per_table_per_sample"] = [1, 52]
    wdl.ps_json.write_text(json.dumps(doc))
    repo = tmp_path / "repo"
    assert main(["repo", str(wdl.ps_json), str(repo)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    [line] = err.splitlines()
    assert line.startswith(
        "models[0].maxnum_catfeature_query_per_table_per_sample[0]: is 1 but table 0"
    )
    assert not repo.exists()


def test_model_without_network_file_is_an_embedding_model(wdl, tmp_path: Path) -> None:
    doc = json.loads(wdl.ps_json.read_text())
    del doc["models"][0]["network_file"]  # as in HugeCTR's hps-backend samples
    wdl.ps_json.write_text(json.dumps(doc))
    repo = tmp_path / "repo"
    assert main(["repo", str(wdl.ps_json), str(repo)]) == 0
    assert sorted(p.name for p in repo.iterdir()) == ["wdl"]
    assert [t.name for t in parse_pbtxt(repo / "wdl" / "config.pbtxt").input] == [
        "KEYS",
        "NUMKEYS",
    ]
