"""HugeCTR's Python inference API as HugeCTR v24.06 spells it: ``InferenceParams`` (fields,
order, defaults, refusals naming the field, inert fields warned about),
``InferenceModel(model_config_path, inference_params)``, ``CreateInferenceSession`` and
``predict``'s two forms, ``hps.init``; the README's HugeCTR script run as a user runs it; no
temporary file left by ``InferenceModel.from_files``."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from network_files import OWN
from ranking_reference import encode_hugectr, predict_reference, random_keys
from ranking_testdata import write_ranking_files
from s3_server import upload
from test_offline_model import write_dataset

import hps_core.offline as hugectr
from hps_core import hps as hps_module
from hps_core.cli.main import main as hps_main
from hps_core.errors import ConfigError, NotAvailableError, RequestError
from hps_core.offline import (
    CreateInferenceSession,
    InferenceModel,
    InferenceParams,
    VolatileDatabaseParams,
    auc,
)

ROOT = Path(__file__).resolve().parents[3]

# HugeCTR v24.06, HugeCTR/include/pybind/hps_wrapper.hpp: InferenceParams' arguments in order.
HUGECTR_FIELDS = [
    "model_name", "max_batchsize", "hit_rate_threshold", "dense_model_file",
    "sparse_model_files", "device_id", "use_gpu_embedding_cache", "cache_size_percentage",
    "i64_input_key", "use_mixed_precision", "scaler", "use_algorithm_search", "use_cuda_graph",
    "number_of_worker_buffers_in_pool", "number_of_refresh_buffers_in_pool",
    "thread_pool_size", "cache_refresh_percentage_per_iteration", "deployed_devices",
    "default_value_for_each_table", "volatile_db", "persistent_db", "update_source",
    "maxnum_des_feature_per_sample", "refresh_delay", "refresh_interval",
    "maxnum_catfeature_query_per_table_per_sample", "embedding_vecsize_per_table",
    "embedding_table_names", "network_file", "label_dim", "slot_num",
    "non_trainable_params_file", "use_static_table", "embedding_cache_type",
    "use_context_stream", "fuse_embedding_table", "use_hctr_cache_implementation", "init_ec",
    "enable_pagelock", "fp8_quant",
]  # fmt: skip


def params_for(files, **fields_) -> InferenceParams:
    doc = json.loads(files.ps_json.read_text())["models"][0]
    base = files.ps_json.parent
    given = {
        "model_name": files.name,
        "max_batchsize": doc["max_batch_size"],
        "hit_rate_threshold": 1.0,
        "dense_model_file": str(files.dense_file),
        "sparse_model_files": [str(base / p) for p in doc["sparse_files"]],
        "device_id": None,
        "use_gpu_embedding_cache": True,
        "cache_size_percentage": 0.5,
        "i64_input_key": True,
        "default_value_for_each_table": files.defaults,
    }
    return InferenceParams(**(given | fields_))


def test_inference_params_has_hugectrs_fields_order_and_defaults() -> None:
    assert [f.name for f in fields(InferenceParams)] == HUGECTR_FIELDS
    p = InferenceParams(
        "m",
        8,
        0.5,
        "d",
        ["s"],
        use_gpu_embedding_cache=False,
        cache_size_percentage=0.1,
        i64_input_key=False,
    )
    assert (p.device_id, p.use_mixed_precision, p.scaler, p.use_cuda_graph) == (0, False, 1.0, True)
    assert p.number_of_worker_buffers_in_pool == 2 and p.thread_pool_size == 16
    assert list(p.deployed_devices) == [0] and list(p.embedding_vecsize_per_table) == [128]
    assert p.embedding_cache_type is hugectr.EmbeddingCacheType_t.Dynamic
    assert p.volatile_db.type is hugectr.DatabaseType_t.parallel_hash_map
    with pytest.raises(ConfigError) as caught:
        InferenceParams("m", 8, 0.5, "d", ["s"])
    assert [p.where for p in caught.value.problems] == [
        "InferenceParams.use_gpu_embedding_cache",
        "InferenceParams.cache_size_percentage",
        "InferenceParams.i64_input_key",
    ]
    with pytest.raises(TypeError, match="max_batch_size"):
        InferenceParams("m", max_batch_size=8)  # the ps.json name is not a field


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cache_size_percentage", 1.5, r"expected a number in \[0, 1\], got 1\.5"),
        ("max_batchsize", 0, r"expected an integer >= 1, got 0"),
        ("use_gpu_embedding_cache", "yes", r"expected True or False, got 'yes'"),
        ("sparse_model_files", "t0", r"expected a list, got 't0'"),
        ("device_id", -1, r"expected a GPU id >= 0 \(or None for the CPU\), got -1"),
        ("embedding_cache_type", "lru", r"expected one of EmbeddingCacheType_t\.Dynamic"),
        ("deployed_devices", [0, "1"], r"entry 1: expected an integer >= 0"),
    ],
)
def test_a_refused_value_names_its_field(field, value, message) -> None:
    given = dict(
        model_name="m",
        max_batchsize=8,
        hit_rate_threshold=0.5,
        dense_model_file="d",
        sparse_model_files=["s"],
        use_gpu_embedding_cache=True,
        cache_size_percentage=0.5,
        i64_input_key=True,
    )
    with pytest.raises(ConfigError, match=rf"^InferenceParams\.{field}: {message}"):
        InferenceParams(**(given | {field: value}))


def test_values_the_ps_json_parser_refuses_name_the_field(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=61, max_batch_size=8)
    bad_db = VolatileDatabaseParams(type="redis_clstr")
    with pytest.raises(ConfigError, match=r"InferenceParams\.volatile_db\.type: .*redis_clstr"):
        InferenceModel(files.network_file, params_for(files, volatile_db=bad_db))
    with pytest.raises(ConfigError, match=r"InferenceParams\.sparse_model_files: .*2 embedding"):
        InferenceModel(files.network_file, params_for(files, sparse_model_files=["x"]))
    with pytest.raises(TypeError, match="must be an InferenceParams, got dict"):
        InferenceModel(files.network_file, {"model_name": "wdl"})


def test_fields_without_effect_warn_and_defaults_do_not(tmp_path: Path, caplog) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=62, max_batch_size=8)
    with caplog.at_level(logging.WARNING, "hps_core.offline"):
        InferenceModel(files.network_file, params_for(files)).close()
    assert caplog.messages == []
    inert = params_for(
        files,
        scaler=128.0,
        use_algorithm_search=False,
        thread_pool_size=4,
        number_of_worker_buffers_in_pool=8,
        embedding_vecsize_per_table=[7, 7],
        fuse_embedding_table=True,
    )
    with caplog.at_level(logging.WARNING, "hps_core.offline"):
        model = InferenceModel(files.network_file, inert)
    lines = caplog.messages
    for field in (
        "scaler = 128.0",
        "use_algorithm_search = False",
        "thread_pool_size = 4",
        "number_of_worker_buffers_in_pool = 8",
        "fuse_embedding_table = true",
    ):
        assert any(line.startswith(f"InferenceParams.{field}") for line in lines), (field, lines)
    assert any(
        re.match(
            r"InferenceParams\.embedding_vecsize_per_table = \[7, 7\]: the network file "
            r"decides it, as in HugeCTR: \[1, 16\]",
            line,
        )
        for line in lines
    ), lines
    assert all("accepted without effect" in line or "decides" in line for line in lines)
    assert model.layout.tables[1].vec_size == 16  # served as the network says
    model.close()


@pytest.mark.parametrize("name", ["wdl", "dlrm"])
def test_a_session_predicts_hugectrs_arrays_as_a_list(tmp_path: Path, name: str) -> None:
    files = write_ranking_files(tmp_path / "m", OWN[name], seed=63, max_batch_size=16)
    session = CreateInferenceSession(str(files.network_file), params_for(files))
    rng = np.random.default_rng(64)
    # As many keys per slot as the network's nnz_per_slot allows (HugeCTR refuses more).
    keys = random_keys(rng, 9, files.slot_nums, files.known_keys(), 1, 0.2, 0.1)
    dense = rng.standard_normal((9, session.model.layout.dense_dim)).astype(np.float32)
    des, catcolumn, rowindex = encode_hugectr(dense, keys)
    # As HugeCTR's scripts build them: Python lists.
    got = session.predict(
        des.ravel().tolist(), catcolumn.ravel().tolist(), rowindex.ravel().tolist()
    )
    assert isinstance(got, list) and len(got) == 9 and isinstance(got[0], float)
    want = predict_reference(
        files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
    )
    np.testing.assert_allclose(got, want[:, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        session.model.predict(des, catcolumn, rowindex), want, rtol=1e-4, atol=1e-5
    )
    session.refresh_embedding_cache()  # nothing to do: updates reach the caches as they come
    session.close()


def test_bad_arrays_are_named_as_the_caller_spelled_them(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=65, max_batch_size=16)
    session = CreateInferenceSession(files.network_file, params_for(files))
    rng = np.random.default_rng(66)
    keys = random_keys(rng, 2, files.slot_nums, files.known_keys())
    des, cat, rows = (
        a.ravel().tolist() for a in encode_hugectr(np.ones((2, 13), np.float32), keys)
    )
    cases = [
        ((des, cat, rows[:-1]), r"^argument 'row_ptrs': expected 28 x batch \+ 2 offsets"),
        ((des, cat, [0.5] * len(rows)), r"^argument 'row_ptrs': expected integers, got float64"),
        (
            (des, cat[:-1], rows),
            r"^argument 'embeddingcolumns': holds \d+ keys, but the offsets "
            r"in 'row_ptrs' end at",
        ),
        ((des[:-1], cat, rows), r"^argument 'dense_feature': 'row_ptrs' describes 2 samples"),
        ((des, cat, [2**40, *rows[1:]]), r"^argument 'row_ptrs': 1099511627776 does not fit int32"),
        (([float("nan"), *des[1:]], cat, rows), r"^argument 'dense_feature': sample 0, dense "),
        ((des, ["a"] * len(cat), rows), r"^argument 'embeddingcolumns': expected integers"),
    ]
    for arrays, message in cases:
        with pytest.raises(RequestError, match=message):
            session.predict(*arrays)
        assert "ROWINDEX" not in message and "CATCOLUMN" not in message
    session.close()


def test_dataset_predictions_repeat_the_dataset_and_shift_slots(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=67, max_batch_size=4)
    model = InferenceModel(files.network_file, params_for(files))
    rng = np.random.default_rng(68)
    n = 10
    keys = random_keys(rng, n, files.slot_nums, files.known_keys(), 1, 0.1, 0.1)
    dense = rng.standard_normal((n, 13)).astype(np.float32)
    labels = (rng.random(n) < 0.5).astype(np.float32)
    data = tmp_path / "data.parquet"
    write_dataset(data, files, dense, keys, labels)
    want = predict_reference(
        files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
    )
    # 3 batches of 4 = 12 rows: the 10 samples, then samples 0 and 1 again (HugeCTR repeats).
    got = model.predict(3, str(data), hugectr.DataReaderType_t.Parquet, hugectr.Check_t.Sum)
    assert got.shape == (12, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.concatenate([want, want[:2]]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        model.predict(num_batches=1, source=data), want[:4], rtol=1e-4, atol=1e-5
    )
    assert model.evaluate(2, data, hugectr.DataReaderType_t.Parquet, hugectr.Check_t.Non) == (
        pytest.approx(auc(labels[:8], want[:8, 0]), abs=1e-6)
    )
    assert model.evaluate(data) == pytest.approx(auc(labels, want[:, 0]), abs=1e-6)
    session = hugectr.InferenceSession(model)
    assert session.predict(
        1, str(data), hugectr.DataReaderType_t.Parquet, hugectr.Check_t.Non
    ).shape == (4,)
    # slot_size_array: HugeCTR's Parquet reader adds the sizes of the slots before each slot.
    sizes = [int(s) for s in rng.integers(1, 1000, sum(files.slot_nums))]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
    first = np.concatenate([[0], np.cumsum(files.slot_nums)[:-1]]).tolist()
    lowered = [
        [
            [[k - starts[first[t] + s] for k in bag] for s, bag in enumerate(table)]
            for t, table in enumerate(sample)
        ]
        for sample in keys
    ]
    write_dataset(tmp_path / "lowered.parquet", files, dense, lowered, labels)
    back = model.predict(
        3,
        tmp_path / "lowered.parquet",
        hugectr.DataReaderType_t.Parquet,
        hugectr.Check_t.Non,
        sizes,
    )
    np.testing.assert_allclose(back, got, rtol=1e-5, atol=1e-6)
    for call, message in [
        ((0, data), r"argument 'num_batches': expected an integer >= 1, got 0"),
        ((1, data, hugectr.DataReaderType_t.Norm), r"argument 'data_reader_type': .*Norm"),
        ((1, data, "Parquet", hugectr.Check_t.Non, [1, 2]), r"'slot_size_array': expected 28"),
    ]:
        with pytest.raises((RequestError, NotAvailableError), match=message):
            model.predict(*call)
    model.close()


def test_device_id_on_a_machine_without_a_gpu_scores_on_the_cpu(tmp_path, caplog) -> None:
    if hugectr.model.first_gpu() is not None:
        pytest.skip("this machine has a GPU")
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=69, max_batch_size=8)
    with caplog.at_level(logging.WARNING, "hps_core.offline"):
        model = InferenceModel(files.network_file, params_for(files, device_id=0))
    assert model.session.device_id is None
    assert caplog.messages == [
        "InferenceParams.device_id = 0: GPU 0 requested, but this machine has no GPU (no "
        "NVIDIA device in /dev); scoring on the CPU (device_id=None asks for the CPU)"
    ]
    model.close()


def test_the_readme_script_runs_as_a_hugectr_script(tmp_path: Path, shm_path: Path) -> None:
    """The README's script, run in a fresh process where ``hps prepare`` wrote its files."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("#### A HugeCTR offline-inference script") :]
    start = section.index("```python\n") + 10
    script = section[start : section.index("\n```\n", start)]
    assert "from hps_core.offline.inference import" in script
    (tmp_path / "offline.py").write_text(script)
    with open(os.devnull, "w") as quiet, _redirect_stdout(quiet):
        assert (
            hps_main(
                [
                    "prepare",
                    str(tmp_path / "model_repository"),
                    "--model",
                    "wdl",
                    "--sample-data",
                    str(tmp_path / "sample_data"),
                ]
            )
            == 0
        )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "offline.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1] == "shape: (256, 1)", run.stdout
    # The same rows through the ps.json hps prepare wrote, as the server scores them.
    served = InferenceModel.from_ps_json(
        tmp_path / "model_repository" / "wdl" / "ps.json", device_id=None
    )
    scores = served.predict_dataset(tmp_path / "sample_data" / "wdl.parquet", progress=False)
    want = [round(float(p), 4) for p in scores.scores[:3, 0]]
    assert lines[0] == f"predictions: {want}"
    want_auc = auc(scores.labels[:256, 0], scores.scores[:256, 0])
    assert lines[2] == f"AUC: {round(want_auc, 4)}"
    assert run.stderr.count("scoring on the CPU") in (0, 2)  # the warning on a CPU machine
    served.close()
    assert list(temp.iterdir()) == [] and list(shm_path.iterdir()) == []


def _redirect_stdout(target):
    import contextlib

    return contextlib.redirect_stdout(target)


def test_from_files_leaves_no_temporary_file(tmp_path: Path, monkeypatch, shm_path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=71, max_batch_size=8)
    doc = json.loads(files.ps_json.read_text())["models"][0]
    sparse = [str(files.ps_json.parent / p) for p in doc["sparse_files"]]
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    model = InferenceModel.from_files(files.network_file, files.dense_file, sparse, device_id=None)
    rng = np.random.default_rng(72)
    keys = random_keys(rng, 3, files.slot_nums, files.known_keys())
    model.predict(*encode_hugectr(np.zeros((3, 13), np.float32), keys))
    assert list(temp.iterdir()) == []
    model.close()
    assert list(temp.iterdir()) == [] and list(shm_path.iterdir()) == []
    # Dropped without close: the tables are released when it is garbage-collected.
    model = InferenceModel.from_files(files.network_file, files.dense_file, sparse, device_id=None)
    model.predict(*encode_hugectr(np.zeros((3, 13), np.float32), keys))
    del model
    gc.collect()
    assert list(temp.iterdir()) == [] and list(shm_path.iterdir()) == []
    # A process that exits normally without closing leaves nothing either.
    code = (
        "from hps_core.offline import InferenceModel\n"
        f"m = InferenceModel.from_files({str(files.network_file)!r}, {str(files.dense_file)!r}, "
        f"{sparse!r}, device_id=None)\n"
        "print(m.layout.model)\n"
    )
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout == "model\n", run.stderr
    assert list(temp.iterdir()) == [] and list(shm_path.iterdir()) == []


def test_hps_init_opens_every_table_and_checks_the_batch(tmp_path: Path, shm_path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=73, max_batch_size=8)
    assert hps_module.Init(global_batch_size=8, ps_config_file=str(files.ps_json)) == "OK"
    instance = hps_module.HPS(files.ps_json)
    lookup = instance.model(files.name)
    assert all(table is not None for table in lookup._tables)
    assert hps_module.init(files.ps_json, 4) == "OK"
    with pytest.raises(
        ConfigError,
        match=r"models\[0\] \(model 'rank'\)\.max_batch_size: 8 is "
        r"less than global_batch_size / devices = 9 / 1 = 9",
    ):
        hps_module.init(files.ps_json, 9)
    with pytest.raises(ConfigError, match=r"global_batch_size: must be > 0, got 0"):
        hps_module.init(files.ps_json, 0)
    with pytest.raises(TypeError, match="missing: ps_config_file"):
        hps_module.Init(global_batch_size=8)
    instance.close()


def test_slot_shift_of_tables_without_offsets() -> None:
    # Two samples; table 0: 2 slots of 2 keys each (no offsets), table 1: CSR over 1 slot.
    from hps_core.infer.inputs.batch import SparseBatch
    from hps_core.offline.model import _shift_slots

    batch = SparseBatch(
        np.zeros((2, 1), np.float32),
        (np.arange(8, dtype=np.int64), np.array([5, 6, 7], dtype=np.int64)),
        (None, np.array([0, 2, 3])),
        hotness=(2, 1),
    )
    shifted = _shift_slots(batch, [np.array([0, 100]), np.array([1000])])
    assert shifted.keys[0].tolist() == [0, 1, 102, 103, 4, 5, 106, 107]
    assert shifted.keys[1].tolist() == [1005, 1006, 1007]


def test_model_files_on_s3_are_read_where_they_are(tmp_path: Path, s3) -> None:
    """InferenceParams' files and the network as s3:// URIs: the local files' predictions."""
    files = write_ranking_files(tmp_path / "m", OWN["dcn"], seed=74, max_batch_size=8)
    s3.create_dir("models")
    upload(s3, files.ps_json.parent, "models/dcn")
    doc = json.loads(files.ps_json.read_text())["models"][0]
    remote = params_for(
        files,
        dense_model_file=f"s3://models/dcn/{files.dense_file.name}",
        sparse_model_files=[f"s3://models/dcn/{p}" for p in doc["sparse_files"]],
    )
    rng = np.random.default_rng(75)
    keys = random_keys(rng, 5, files.slot_nums, files.known_keys(), 1, unknown=0.1)
    batch = encode_hugectr(rng.standard_normal((5, 13)).astype(np.float32), keys)
    local_model = InferenceModel(files.network_file, params_for(files))
    remote_model = InferenceModel(f"s3://models/dcn/{files.network_file.name}", remote)
    np.testing.assert_array_equal(remote_model.predict(*batch), local_model.predict(*batch))
    local_model.close()
    remote_model.close()
