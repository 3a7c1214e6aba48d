"""Files named by URI: which strings are URIs, HugeCTR's S3 HTTPS forms, and the message for
HDFS where libhdfs and Java are missing (as on this project's machines)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from hps_core.errors import ModelFileError, NotAvailableError
from hps_core.formats.uris import fs_path, is_uri, open_uri


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
    with pytest.raises(NotAvailableError, match=r"hdfs://localhost:1/m: reading hdfs:// needs"):
        open_uri("hdfs://localhost:1/m")


def test_local_paths_and_file_uris(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    local = fs_path(tmp_path / "a.txt")
    assert local.is_file() and local.read_text() == "hello" and local.name == "a.txt"
    assert fs_path(f"file://{tmp_path}/a.txt").read_text() == "hello"
    assert [f.name for f in fs_path(tmp_path).files_below()] == ["a.txt"]
    with pytest.raises(ModelFileError, match="cannot read"):
        fs_path(tmp_path / "missing.txt").read_text()
