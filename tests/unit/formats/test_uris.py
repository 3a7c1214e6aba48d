"""Files named by URI: which strings are URIs, HugeCTR's S3 HTTPS forms, and the message for
HDFS where libhdfs and Java are missing (as on this project's machines)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from hps_core.errors import ModelFileError, NotAvailableError
from hps_core.formats.uris import is_uri, open_uri
from hps_core.model_check import check_ps_json


def test_naming_an_s3_object_connects_to_nothing() -> None:
    # No endpoint, no credentials: parsing a ps.json that names it must still work.
    target = open_uri("s3://some-bucket/models/0_sparse_model")
    assert target.path == "some-bucket/models/0_sparse_model"
    assert (target / "key").path == "some-bucket/models/0_sparse_model/key"
    assert str(target.parent) == "s3://some-bucket/models"


@pytest.mark.parametrize(
    ("text", "uri"),
    [
        ("s3://bucket/key", True),
        ("hdfs://namenode:9000/models/dlrm", True),
        ("https://bucket.s3.us-west-2.amazonaws.com/models/x", True),
        ("https://s3.eu-central-1.amazonaws.com/bucket/models/x", True),
        ("https://example.com/models/x", False),
        ("/models/dlrm", False),
        ("models/s3://odd", False),
    ],
)
def test_which_strings_are_uris(text: str, uri: bool) -> None:
    assert is_uri(text) is uri


@pytest.mark.parametrize(
    ("url", "path", "region"),
    [
        ("https://bucket.s3.us-west-2.amazonaws.com/models/x", "bucket/models/x", "us-west-2"),
        ("https://s3.eu-central-1.amazonaws.com/bkt/a/b", "bkt/a/b", "eu-central-1"),
    ],
)
def test_hugectrs_s3_https_forms(url: str, path: str, region: str) -> None:
    target = open_uri(url)
    assert isinstance(target.filesystem, pafs.S3FileSystem)
    assert target.filesystem.region == region
    assert target.path == path and str(target) == url


def test_hdfs_without_libhdfs_says_what_to_install() -> None:
    try:
        pafs.HadoopFileSystem("localhost", 1)
    except OSError:
        pass
    else:  # pragma: no cover - a machine with Hadoop
        pytest.skip("libhdfs and Java are installed here")
    target = open_uri("hdfs://localhost:1/m")  # naming it connects to nothing
    assert target.path == "/m"
    with pytest.raises(NotAvailableError, match=r"hdfs://localhost:1/m: reading hdfs:// needs"):
        target.exists()


def test_file_uris(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    local = open_uri(f"file://{tmp_path}/a.txt")
    assert local.is_file() and local.read_text() == "hello" and local.name == "a.txt"
    assert local.stat().st_size == 5 and local.parent.is_dir()
    assert [f.name for f in open_uri(f"file://{tmp_path}").files_below()] == ["a.txt"]
    with pytest.raises(ModelFileError, match="cannot read"):
        open_uri(f"file://{tmp_path}/missing.txt").read_text()


def test_hps_check_of_an_hdfs_model_says_what_to_install(tmp_path: Path) -> None:
    try:
        pafs.HadoopFileSystem("localhost", 1)
    except OSError:
        pass
    else:  # pragma: no cover - a machine with Hadoop
        pytest.skip("libhdfs and Java are installed here")
    ps = {
        "supportlonglong": True,
        "models": [{
            "model": "m", "sparse_files": ["hdfs://namenode:9000/models/t0"],
            "embedding_vecsize_per_table": [8], "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [2], "max_batch_size": 4,
            "deployed_device_list": [0],
        }],
    }  # fmt: skip
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    [problem] = check_ps_json(tmp_path / "ps.json").problems
    assert problem.where == "models[0].sparse_files[0]"
    assert "hdfs://namenode:9000/models/t0: reading hdfs:// needs Hadoop's libhdfs" in str(problem)
