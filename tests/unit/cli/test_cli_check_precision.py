"""Tier bytes in a table's storage precision (:mod:`hps_core.footprint`) and ``hps check``'s
report of them; every expected byte count is written out here from the row layouts of
:mod:`hps_core.quant.rows`, not read from the sizing functions under test."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from cli_testdata import TABLES, edit_ps, write_model

from hps_core.cli.main import main
from hps_core.config import parse_ps_config
from hps_core.footprint import model_footprint, table_footprint

# Bytes of one stored row, by (precision, dim): fp16 2 B a value, int8 1 B a value and a
# 4-byte scale and bias, fp8 1 B a value and a 4-byte scale; values padded to 4 bytes.
ROW_BYTES = {
    ("fp32", 128): 512,
    ("fp16", 128): 256,
    ("int8", 128): 128 + 8,
    ("fp8", 128): 128 + 4,
    ("fp32", 5): 20,
    ("fp16", 5): 12,  # 10 bytes of halves, padded to 12
    ("int8", 5): 8 + 8,  # 5 codes padded to 8, scale, bias
    ("fp8", 5): 8 + 4,  # 5 codes padded to 8, scale
    ("fp32", 16): 64,
    ("fp16", 16): 32,
    ("int8", 16): 24,
    ("fp8", 16): 20,
}


def align(n: int) -> int:
    return -(-n // 64) * 64


def buckets(rows: int) -> int:
    """Buckets of the row index: a power of two, one per 2 to 4 rows (int32 starts)."""
    return 1 << max(1, (rows // 2).bit_length() - 1)


def host_bytes(rows: int, row_bytes: int) -> int:
    """The shared segment: 8-byte hashes (one padding entry), int32 bucket starts, the int32
    row of each entry, the stored rows, each array 64-byte aligned."""
    index = align(8 * (rows + 1)) + align(4 * (buckets(rows) + 1)) + align(4 * rows)
    return index + align(rows * row_bytes)


def cache_bytes(rows: int, row_bytes: int, gpucacheper: float) -> tuple[int, int]:
    """A dynamic cache in whole sets of 64 slots, each an 8-byte key, an 8-byte stamp and a
    stored row: (bytes, slots)."""
    slots = 64 * max(1, -(-math.ceil(gpucacheper * rows) // 64))
    return slots * (16 + row_bytes), slots


def static_bytes(rows: int, row_bytes: int) -> int:
    """A static table: 8-byte hashes (one padding entry), int64 bucket starts, stored rows."""
    return 8 * (rows + 1) + 8 * (buckets(rows) + 1) + rows * row_bytes


def one_table(dim: int, precision: str, tmp_path: Path, **model: Any) -> Any:
    """A parsed ps.json of model ``m`` with one table ``t`` stored in ``precision``, RocksDB
    below the host tier (holding half the rows)."""
    doc = {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": 0.5},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks")},
        "models": [
            {
                "model": "m",
                "sparse_files": ["t"],
                "embedding_table_names": ["t"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [0.0],
                "maxnum_catfeature_query_per_table_per_sample": [1],
                "embedding_vecsize_per_table": [dim],
                "storage_precision": precision,
                **model,
            }
        ],
    }
    return parse_ps_config(doc, tmp_path)


ROWS = 10_001


@pytest.mark.parametrize("dim", [128, 5])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "fp8"])
def test_dynamic_cache_and_host_tier_in_the_precision(
    tmp_path: Path, precision: str, dim: int
) -> None:
    config = one_table(dim, precision, tmp_path, gpucacheper=0.3, network_file="net.json")
    model = config.models[0]
    fp = table_footprint(config, model, model.tables[0], ROWS)
    row = ROW_BYTES[(precision, dim)]
    held = 5_001  # initial_cache_rate 0.5 of 10,001 rows, rounded to nearest
    cache, slots = cache_bytes(ROWS, row, 0.3)
    assert fp.precision == precision
    assert (fp.host_rows, fp.gpu_cache_rows) == (held, slots)
    assert fp.host == host_bytes(held, row)
    assert fp.gpu_cache == cache
    assert fp.gpu_static == 0
    # The row index is hashes, starts and positions alone: the same in every precision.
    assert fp.gpu_index == 8 * (held + 1) + 4 * (buckets(held) + 1) + 4 * held
    # RocksDB keeps HugeCTR's FP32 layout: an 8-byte key and dim float32 per row.
    assert fp.rocks_db == ROWS * (8 + 4 * dim)
    if precision != "fp32":
        fp32 = one_table(dim, "fp32", tmp_path, gpucacheper=0.3, network_file="net.json")
        wide = table_footprint(fp32, fp32.models[0], fp32.models[0].tables[0], ROWS)
        assert fp.host < wide.host and fp.gpu_cache < wide.gpu_cache


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "fp8"])
def test_static_table_in_the_precision(tmp_path: Path, precision: str) -> None:
    config = one_table(128, precision, tmp_path, use_static_table=True)
    model = config.models[0]
    fp = table_footprint(config, model, model.tables[0], ROWS)
    assert fp.precision == precision
    assert fp.gpu_static == static_bytes(ROWS, ROW_BYTES[(precision, 128)])
    assert (fp.gpu_cache, fp.gpu_index) == (0, 0)


def test_fp8_quant_sizes_a_static_model_in_fp8(tmp_path: Path) -> None:
    config = one_table(128, "fp8", tmp_path, use_static_table=True)
    doc = config.to_dict()
    del doc["models"][0]["storage_precision"]
    doc["models"][0]["fp8_quant"] = True
    quantised = parse_ps_config(doc, tmp_path)
    fp = table_footprint(quantised, quantised.models[0], quantised.models[0].tables[0], ROWS)
    assert fp.precision == "fp8"
    assert fp.gpu_static == static_bytes(ROWS, 132)
    assert fp.host == host_bytes(5_001, 132)


def test_model_precision_is_shared_or_mixed(tmp_path: Path) -> None:
    config = one_table(128, "int8", tmp_path)
    model = config.models[0]
    assert model_footprint(config, model, [100]).to_dict()["precision"] == "int8"
    doc = config.to_dict()
    entry = doc["models"][0]
    del entry["storage_precision"]
    entry.update(
        sparse_files=["t", "u"],
        embedding_table_names=["t", "u"],
        default_value_for_each_table=[0.0, 0.0],
        maxnum_catfeature_query_per_table_per_sample=[1, 1],
        embedding_vecsize_per_table=[128, 128],
        storage_precision_per_table=["int8", "fp16"],
    )
    mixed = parse_ps_config(doc, tmp_path)
    out = model_footprint(mixed, mixed.models[0], [100, 100]).to_dict()
    assert out["precision"] == "mixed"
    assert [t["precision"] for t in out["tables"]] == ["int8", "fp16"]  # type: ignore[union-attr]


# ----------------------------------------------------------------------- hps check


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_prints_and_writes_each_tables_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 20,000 x 16 table in int8, the 3,000 x 1 one in fp32: the model is "mixed"."""
    ps, _ = write_model(tmp_path)
    edit_ps(ps, storage_precision_per_table=["int8", "fp32"])
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    lines = out.splitlines()
    (deep_rows, _), (wide_rows, _) = ((r, d) for _, r, d in TABLES)
    host = [host_bytes(deep_rows, 24), host_bytes(wide_rows, 4)]
    cache = [cache_bytes(deep_rows, 24, 0.2), cache_bytes(wide_rows, 4, 0.2)]
    assert host == [752_896, 52_288] and cache == [(161_280, 4032), (12_800, 640)]
    assert lines[3:6] == [
        "  [0] sparse_embedding0 bytes (int8): host 0.72 MiB | per GPU instance: "
        "cache 0.15 MiB (4,032 rows)",
        "  [1] sparse_embedding1 bytes (fp32): host 0.05 MiB | per GPU instance: "
        "cache 0.01 MiB (640 rows)",
        "  total bytes (mixed): host 0.77 MiB per machine | 0.17 MiB per GPU instance, 1 GPU",
    ]
    code, out, err = run_check(capsys, str(ps), "--json")
    assert code == 0, err
    (model,) = json.loads(out)["models"]
    assert model["precision"] == "mixed"
    assert [t["precision"] for t in model["tables"]] == ["int8", "fp32"]
    assert [t["bytes"] for t in model["tables"]] == [
        {"host": h, "gpu_cache": c} for h, (c, _) in zip(host, cache, strict=True)
    ]
    assert model["bytes"] == {"host": sum(host), "gpu_cache": sum(c for c, _ in cache)}


def test_check_of_a_model_in_one_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ps, _ = write_model(tmp_path)
    rows = TABLES[0][1]
    edit_ps(
        ps, sparse_files=[TABLES[0][0]], embedding_vecsize_per_table=[16],
        default_value_for_each_table=[0.0], maxnum_catfeature_query_per_table_per_sample=[2],
        storage_precision="fp16",
    )  # fmt: skip
    code, out, err = run_check(capsys, str(ps), "--json")
    assert code == 0, err
    (model,) = json.loads(out)["models"]
    assert model["precision"] == "fp16"
    (table,) = model["tables"]
    assert table["precision"] == "fp16"
    assert table["bytes"] == {
        "host": host_bytes(rows, 32),
        "gpu_cache": cache_bytes(rows, 32, 0.2)[0],
    }
    code, out, err = run_check(capsys, str(ps))
    assert code == 0, err
    assert out.splitlines()[2].startswith("  [0] sparse_embedding0 bytes (fp16): host ")
    assert out.splitlines()[3].startswith("  total bytes (fp16): host ")


def test_fp8_quant_on_static_tables_in_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HugeCTR's fp8_quant on static tables: the dim-16 table in fp8, the dim-1 table kept in
    FP32 with a warning saying why; the check passes."""
    ps, _ = write_model(tmp_path)
    edit_ps(ps, fp8_quant=True, use_static_table=True)
    code, out, err = run_check(capsys, str(ps), "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["warnings"] == [
        "models[0].fp8_quant = true (model 'wdl'): table 'sparse_embedding1' (dim 1) "
        "stays FP32: its FP8 row would take 8 bytes, its FP32 row takes 4"
    ]
    (model,) = doc["models"]
    assert [t["precision"] for t in model["tables"]] == ["fp8", "fp32"]
    assert [t["bytes"]["gpu_static"] for t in model["tables"]] == [
        static_bytes(TABLES[0][1], 20),
        static_bytes(TABLES[1][1], 4),
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"storage_precision": "int8"},
            r'models\[0\]\.storage_precision: int8 would store table "sparse_embedding1" '
            r"\(dim 1\) in 12 bytes per row, not fewer than its 4 bytes in fp32 ",
        ),
        (
            {"storage_precision_per_table": ["fp16", "fp16"]},
            r"models\[0\]\.storage_precision_per_table\[1\]: fp16 would store table "
            r'"sparse_embedding1" \(dim 1\) in 4 bytes per row, not fewer than its 4 bytes in '
            r'fp32 \(rows are padded to 4 bytes\); write "fp32" for it$',
        ),
        (
            {"storage_precision": "fp8", "use_static_table": True},
            r'models\[0\]\.storage_precision: fp8 would store table "sparse_embedding1" '
            r"\(dim 1\) in 8 bytes per row",
        ),
        (
            {"storage_precision": "half"},
            r'models\[0\]\.storage_precision: unknown value "half"; expected one of "fp32", '
            r'"fp16", "int8", "fp8"$',
        ),
        (
            {
                "fp8_quant": True,
                "use_static_table": True,
                "storage_precision_per_table": ["int8", "fp32"],
            },
            r'models\[0\]\.storage_precision_per_table\[0\]: "int8" contradicts "fp8_quant": '
            r"true",
        ),
    ],
    ids=["int8-dim1", "fp16-dim1", "fp8-dim1", "unknown", "contradiction"],
)
def test_check_refuses_a_precision_that_does_not_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any], expected: str
) -> None:
    ps, _ = write_model(tmp_path)
    edit_ps(ps, **fields)
    code, out, err = run_check(capsys, str(ps))
    assert code == 1 and out == "" and "Traceback" not in err
    problems = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(problems) == 1, err
    assert re.match(expected, problems[0]), (problems[0], expected)
