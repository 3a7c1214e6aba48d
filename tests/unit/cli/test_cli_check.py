"""``hps check``: a summary for a good ps.json, one stderr line per problem for a broken one."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
from cli_testdata import TABLES, edit_ps, write_model

from hps_core.cli.main import main
from hps_core.model_check import check_model_files


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def test_good_ps_json_prints_rows_dims_and_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path)
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "model 'wdl': 2 tables"
    sizes = [rows * (8 + 4 * dim) for _, rows, dim in TABLES]
    for i, ((folder, rows, dim), size) in enumerate(zip(TABLES, sizes, strict=True)):
        assert lines[1 + i] == (
            f"  [{i}] sparse_embedding{i}: {rows} rows x dim {dim}, {mib(size)} "
            f"({tmp_path / folder})"
        )
    assert lines[-1] == f"ok: 1 model, {mib(sum(sizes))} of sparse files"
    assert mib(sum(sizes)) != "0.0 MiB"  # the data is large enough for the size to show


def host_bytes(rows: int, dim: int) -> int:
    """The shared segment (hps_core.tiers.hash_layout), written out: 8-byte hashes (one
    padding entry), int32 bucket starts (a bucket per 2 to 4 rows), the int32 row of each
    entry, float32 rows, each array 64-byte aligned."""
    align = lambda n: -(-n // 64) * 64  # noqa: E731
    buckets = 1 << max(1, (rows // 2).bit_length() - 1)
    index = align(8 * (rows + 1)) + align(4 * (buckets + 1)) + align(4 * rows)
    return index + align(4 * rows * dim)


def cache_bytes(rows: int, dim: int, gpucacheper: float = 0.2) -> tuple[int, int]:
    """A dynamic cache of ceil(gpucacheper * rows) rows in sets of 64 slots, each an 8-byte
    key, an 8-byte stamp and a row: (bytes, slots)."""
    slots = 64 * max(1, -(-math.ceil(gpucacheper * rows) // 64))
    return slots * (16 + 4 * dim), slots


def test_tier_bytes_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After the table lines: one line per table with the bytes of each tier, then the
    model's totals; the sparse lines and the last line stay as they were."""
    ps, _ = write_model(tmp_path)
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    lines = out.splitlines()
    host = [host_bytes(rows, dim) for _, rows, dim in TABLES]
    cache = [cache_bytes(rows, dim) for _, rows, dim in TABLES]
    assert host == [1_552_896, 52_288]  # (20000 x 16, 3000 x 1)
    assert cache == [(322_560, 4032), (12_800, 640)]
    assert lines[3:6] == [
        "  [0] sparse_embedding0 bytes (fp32): host 1.48 MiB | per GPU instance: "
        "cache 0.31 MiB (4,032 rows)",
        "  [1] sparse_embedding1 bytes (fp32): host 0.05 MiB | per GPU instance: "
        "cache 0.01 MiB (640 rows)",
        "  total bytes (fp32): host 1.53 MiB per machine | 0.32 MiB per GPU instance, 1 GPU",
    ]
    assert lines[-1].startswith("ok: 1 model, ")
    # --json: the exact counts.
    code, out, err = run_check(capsys, str(ps), "--json")
    assert code == 0, err
    (model,) = json.loads(out)["models"]
    assert model["model"] == "wdl" and model["precision"] == "fp32" and model["gpus"] == 1
    assert model["bytes"] == {"host": sum(host), "gpu_cache": sum(b for b, _ in cache)}
    for table, (folder, rows, dim), h, (c, slots) in zip(
        model["tables"], TABLES, host, cache, strict=True
    ):
        assert table["bytes"] == {"host": h, "gpu_cache": c}
        assert (table["rows"], table["dim"], table["gpu_cache_rows"]) == (rows, dim, slots)
        assert table["host_rows"] == rows and table["precision"] == "fp32"
        assert table["sparse_file"] == str(tmp_path / folder)
        assert table["sparse_file_bytes"] == rows * (8 + 4 * dim)


def test_tier_bytes_of_static_tables_row_index_and_lower_tiers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ranking model (network_file) with static tables, RocksDB below the host tier: the
    static tables replace the cache and row index, RocksDB is reported outside the process."""
    ps, _ = write_model(tmp_path)
    (tmp_path / "net.json").write_text("{}")
    edit_ps(ps, network_file="net.json", use_static_table=True, deployed_device_list=[0, 1])
    doc = json.loads(ps.read_text())
    doc["persistent_db"] = {"type": "rocks_db", "path": str(tmp_path / "rocksdb")}
    ps.write_text(json.dumps(doc))
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[3] == (
        "  [0] sparse_embedding0 bytes (fp32): host 1.48 MiB | per GPU instance: "
        "static table 1.44 MiB | outside this process: RocksDB 1.37 MiB"
    )
    assert lines[5] == (
        "  total bytes (fp32): host 1.53 MiB per machine | 1.48 MiB per GPU instance, 2 GPUs"
        " | outside this process: RocksDB 1.41 MiB"
    )
    # Dynamic caches instead: the GPU pipeline also copies each host tier's row index.
    edit_ps(ps, use_static_table=False, gpucacheper=0.5)
    code, out, err = run_check(capsys, str(ps), "--json")
    assert code == 0, err
    table = json.loads(out)["models"][0]["tables"][0]
    # Hashes, bucket starts and the row of each entry (int32).
    assert table["bytes"]["gpu_index"] == 8 * 20_001 + 4 * (2**13 + 1) + 4 * 20_000
    assert table["bytes"]["gpu_cache"] == 10_048 * (16 + 4 * 16)
    assert table["bytes"]["rocks_db"] == 20_000 * (8 + 4 * 16)


def test_databases_holding_another_precision_than_the_table_say_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An fp16 table (the dim-16 one; the dim-1 table stays fp32): RocksDB with
    store_compressed holds fp16 rows (unlabelled, as the table), the Redis cluster HugeCTR's
    FP32 layout (labelled)."""
    ps, _ = write_model(tmp_path)
    edit_ps(ps, storage_precision_per_table=["fp16", "fp32"])
    doc = json.loads(ps.read_text())
    doc["volatile_db"] = {"type": "redis_cluster", "address": "127.0.0.1:7000"}
    doc["persistent_db"] = {
        "type": "rocks_db", "path": str(tmp_path / "rocksdb"), "store_compressed": True,
    }  # fmt: skip
    ps.write_text(json.dumps(doc))
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    assert out.splitlines()[3].endswith(
        "outside this process: Redis cluster 1.37 MiB (fp32), RocksDB 0.76 MiB"
    )
    code, out, err = run_check(capsys, str(ps), "--json")
    table = json.loads(out)["models"][0]["tables"][0]
    assert table["outside_precision"] == {"redis_cluster": "fp32", "rocks_db": "fp16"}
    assert table["bytes"]["rocks_db"] == 20_000 * (8 + 2 * 16)
    assert table["bytes"]["redis_cluster"] == 20_000 * (8 + 4 * 16)


def test_model_option_and_dense_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps = _ranking_copy(tmp_path)
    code, out, err = run_check(capsys, str(ps), "--model", "wdl")
    assert code == 0, err
    assert "warning" not in err
    assert f"  dense: {tmp_path / 'wdl' / 'data' / 'wdl_dense.model'}" in out.splitlines()
    assert f"  network: {tmp_path / 'wdl' / 'data' / 'wdl.json'}" in out.splitlines()


def _ranking_copy(tmp_path: Path, **model: object) -> Path:
    """The default repository's WDL as ``hps prepare`` writes it, its ps.json model edited
    with ``model``."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["prepare", str(tmp_path), "--model", "wdl"]) == 0
    return edit_ps(tmp_path / "wdl" / "ps.json", **model)


def test_ps_json_sizes_that_disagree_with_the_network_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps = _ranking_copy(tmp_path, label_dim=2, slot_num=10, maxnum_des_feature_per_sample=4)
    code, _, err = run_check(capsys, str(ps))
    assert code == 0
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert lines[0].startswith("warning: models[0].label_dim = 2 (model 'wdl'): the network's")
    assert "output has 1 per sample" in lines[0]
    assert lines[1].startswith("warning: models[0].slot_num = 10 (model 'wdl'): the network")
    assert "takes 28 slots per sample" in lines[1]
    assert lines[2].startswith("warning: models[0].maxnum_des_feature_per_sample = 4")
    assert "takes 13 dense features" in lines[2]


def test_a_network_that_does_not_fit_the_tables_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps = _ranking_copy(tmp_path, maxnum_catfeature_query_per_table_per_sample=[2, 1])
    code, out, err = run_check(capsys, str(ps))
    pattern = r"models\[0\]\.maxnum_catfeature_query_per_table_per_sample\[1\]: is 1 .*26 slots"
    assert_problem_lines(code, out, err, [pattern])
    (tmp_path / "wdl" / "data" / "wdl.json").write_text("{}")
    ps = edit_ps(ps, maxnum_catfeature_query_per_table_per_sample=[2, 26])
    code, out, err = run_check(capsys, str(ps))
    assert_problem_lines(code, out, err, [r".*wdl\.json layers: 'layers' must be a non-empty"])


def test_a_network_layer_this_engine_cannot_run_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hps repo serves a ps.json model with a network as a ranking model, which would not
    load: a mistyped layer type fails the check, with the type it resembles."""
    ps = _ranking_copy(tmp_path)
    network = tmp_path / "wdl" / "data" / "wdl.json"
    text = network.read_text()
    assert text.count('"InnerProduct"') > 0
    network.write_text(text.replace('"InnerProduct"', '"InnerProdcut"', 1))
    code, out, err = run_check(capsys, str(ps))
    pattern = (
        rf"{re.escape(str(network))}:\d+ layers\[\d+\] '\w+'\.type: unknown layer type "
        r"'InnerProdcut' \(did you mean \"InnerProduct\"\?\)"
    )
    assert_problem_lines(code, out, err, [pattern])


def test_a_key_file_that_repeats_a_key_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host tier refuses such a table when it loads; hps check reads the keys to say so
    before anything is served."""
    ps = _ranking_copy(tmp_path)
    key_file = next((tmp_path / "wdl" / "data").glob("*/key"))
    keys = np.fromfile(key_file, np.int64)
    keys[3] = keys[2]
    keys.tofile(key_file)
    code, out, err = run_check(capsys, str(ps))
    pattern = (
        rf"models\[0\]\.sparse_files\[\d\]: {re.escape(str(key_file))}: 1 key appears more "
        rf"than once \(1 extra row\): {keys[2]}$"
    )
    assert_problem_lines(code, out, err, [pattern])


def test_json_prints_only_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Problems and warnings are in the document on stdout; stderr stays empty.
    ps = _ranking_copy(tmp_path, embedding_vecsize_per_table=[1, 8], thread_pool_size=4)
    code, text_out, text_err = run_check(capsys, str(ps))
    code_json, out, err = run_check(capsys, str(ps), "--json")
    doc = json.loads(out)
    assert code == code_json == 1 and doc["ok"] is False and err == ""
    problems = [line for line in text_err.splitlines() if not line.startswith("warning: ")]
    assert [f"{p['where']}: {p['message']}" for p in doc["problems"]] == problems
    assert [f"warning: {w}" for w in doc["warnings"]] == [
        line for line in text_err.splitlines() if line.startswith("warning: ")
    ]
    assert any("thread_pool_size = 4" in w for w in doc["warnings"]) and text_out == ""
    clean = _ranking_copy(tmp_path / "clean", thread_pool_size=4)
    code, out, err = run_check(capsys, str(clean), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and err == ""
    assert any("thread_pool_size = 4" in w for w in doc["warnings"])


def assert_problem_lines(code: int, out: str, err: str, expected: list[str]) -> None:
    """Exit 1, nothing on stdout, exactly one stderr line per problem, no traceback."""
    assert code == 1
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == len(expected), err
    for line, pattern in zip(lines, expected, strict=True):
        assert re.match(pattern, line), (line, pattern)


def test_dim_mismatch_and_missing_folder_each_get_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path)
    edit_ps(
        ps,
        embedding_vecsize_per_table=[8, 1, 4],
        sparse_files=["wdl/0_sparse", "wdl/1_sparse", "wdl/nowhere"],
        default_value_for_each_table=[0.0, 0.0, 0.0],
        maxnum_catfeature_query_per_table_per_sample=[1, 1, 1],
    )
    code, out, err = run_check(capsys, str(ps))
    vec = re.escape(str(tmp_path / "wdl/0_sparse/emb_vector"))
    missing = re.escape(str(tmp_path / "wdl/nowhere"))
    assert_problem_lines(
        code,
        out,
        err,
        [
            rf"models\[0\]\.sparse_files\[0\]: {vec}: dim 8 does not match",
            rf"models\[0\]\.sparse_files\[2\]: {missing}: sparse model folder does not exist",
        ],
    )


def test_missing_dense_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps, _ = write_model(tmp_path)
    edit_ps(ps, dense_file="gone.model")
    code, out, err = run_check(capsys, str(ps))
    where = re.escape(str(tmp_path / "gone.model"))
    assert_problem_lines(code, out, err, [rf"models\[0\]\.dense_file: file not found: {where}$"])


def test_unknown_keys_are_reported_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path)
    edit_ps(ps, gpucacheperr=0.5, max_batch_sise=4)
    code, out, err = run_check(capsys, str(ps))
    assert_problem_lines(
        code,
        out,
        err,
        [
            r'models\[0\]\.gpucacheperr: unknown key \(did you mean "gpucacheper"\?\)',
            r'models\[0\]\.max_batch_sise: unknown key \(did you mean "max_batch_size"\?\)',
        ],
    )


def test_wrong_list_length_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path)
    edit_ps(ps, embedding_vecsize_per_table=[16])
    code, out, err = run_check(capsys, str(ps))
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.splitlines() and all(
        line.startswith("models[0].embedding_vecsize_per_table") for line in err.splitlines()
    )


def test_unknown_model_with_lower_tiers_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Redis cluster and RocksDB tiers are accepted (nothing connects to them at check time);
    the unknown model is the one problem."""
    ps, _ = write_model(tmp_path)
    doc = json.loads(ps.read_text())
    doc["volatile_db"] = {"type": "redis_cluster", "address": "127.0.0.1:7000"}
    doc["persistent_db"] = {"type": "rocks_db", "path": str(tmp_path / "rocksdb")}
    ps.write_text(json.dumps(doc))
    code, out, err = run_check(capsys, str(ps), "--model", "dcn")
    assert_problem_lines(code, out, err, [r"models: no model named"])
    assert "'wdl'" in err


@pytest.mark.parametrize("text", [None, "{", '{"supportlonglong": true} // note'])
def test_unreadable_ps_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], text) -> None:
    ps = tmp_path / "ps.json"
    if text is not None:
        ps.write_text(text)
    code, out, err = run_check(capsys, str(ps))
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.splitlines() and all(str(ps) in line for line in err.splitlines())


def test_fields_without_effect_are_warned_about_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HugeCTR fields accepted without effect, set to a value other than HugeCTR's default,
    get one warning line each saying what HugeCTR would do; defaults and fields that act
    here (init_ec, the databases' update_filters) get none, and the check still passes."""
    ps, _ = write_model(tmp_path)
    edit_ps(
        ps, fp8_quant=True, thread_pool_size=32, use_hctr_cache_implementation=True,
        init_ec=False, use_context_stream=False,
    )  # fmt: skip
    doc = json.loads(ps.read_text())
    doc["fuse_embedding_table"] = True
    doc["volatile_db"] = {"type": "hash_map", "update_filters": ["^hps_et\\.wdl\\..+$"]}
    ps.write_text(json.dumps(doc))
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert [w.split(":")[1].split(" = ")[0].strip() for w in warnings] == [
        "fuse_embedding_table", "models[0].fp8_quant", "models[0].thread_pool_size",
        "models[0].use_context_stream",
    ]  # fmt: skip
    assert warnings[1] == (
        "warning: models[0].fp8_quant = true (model 'wdl'): accepted without effect: it applies "
        'to static tables only (embedding_cache_type "static" or use_static_table, with '
        "gpucache), as in HugeCTR, which quantises them to FP8 with per-row scales; this model "
        'has none. "storage_precision" is this project\'s way to compress the tables of a '
        "dynamic cache"
    )
    assert out.splitlines()[-1].startswith("ok: 1 model")


def test_a_models_load_logs_each_warning_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``hps check`` warns about, the Triton models' load check logs (one line each)."""
    ps = _ranking_copy(tmp_path, thread_pool_size=4, slot_num=10)
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        report = check_model_files(ps, "wdl")
    assert report.model.name == "wdl"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{ps}: models[0].thread_pool_size = 4 (model 'wdl'): accepted")
    assert lines[1].startswith(f"{ps}: models[0].slot_num = 10 (model 'wdl'): the network")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        check_model_files(ps, "wdl", network=False)  # an embedding model never reads it
    assert [r.getMessage() for r in caplog.records] == [lines[0]]


def test_a_relative_path_found_from_the_current_folder_only_is_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HugeCTR reads a relative path from the server's folder, hps-triton from the ps.json's:
    a path that exists only the HugeCTR way says so."""
    ps, _ = write_model(tmp_path)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "ps.json").write_text(ps.read_text())
    monkeypatch.chdir(tmp_path)
    code, out, err = run_check(capsys, str(conf / "ps.json"))
    assert code == 1 and out == ""
    assert (
        f"sparse model folder does not exist (a relative path in a ps.json is read from its "
        f"folder, {conf}; wdl/0_sparse exists from the current folder" in err
    ), err
