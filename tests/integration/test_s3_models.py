"""A model whose files are on S3 (an S3-compatible server on a loopback port), served by a
real Triton server: every key equals the local files, and the credentials never reach the
server's log."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from private_shm import private_shm_dir
from s3_server import SECRET, s3_server, upload

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table

pytestmark = pytest.mark.integration

DIMS = (8, 16)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    yield from s3_server(monkeypatch)


def test_tables_on_s3_are_served_as_the_files_are(
    triton_server, s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = private_shm_dir(tmp_path, monkeypatch)  # the server's host-tier segments
    rng = np.random.default_rng(11)
    tables = []
    for t, dim in enumerate(DIMS):
        keys = rng.choice(10**9, 499, replace=False).astype(np.int64)
        vectors = rng.standard_normal((499, dim)).astype(np.float32)
        write_sparse_table(tmp_path / "data" / f"t{t}", keys, vectors)
        tables.append((keys, vectors))
    s3.create_dir("hps")
    upload(s3, tmp_path / "data", "hps/emb")
    ps = {
        "supportlonglong": True,
        "models": [{
            "model": "emb", "sparse_files": ["s3://hps/emb/t0", "s3://hps/emb/t1"],
            "embedding_vecsize_per_table": list(DIMS),
            "default_value_for_each_table": [0.5, -0.5],
            "maxnum_catfeature_query_per_table_per_sample": [500, 500], "max_batch_size": 1,
            "deployed_device_list": [0],
        }],
    }  # fmt: skip
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    assert hps_main(["repo", str(tmp_path / "ps.json"), str(tmp_path / "repo")]) == 0
    log = tmp_path / "server.log"
    server = triton_server(tmp_path / "repo", log_file=log)
    client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
    # Every key of both tables in one request, and one unknown key per table.
    picks = [np.append(tables[0][0][:499], 7), np.append(tables[1][0][:499], 12345)]
    keys = np.concatenate(picks)[None, :]
    inputs = [httpclient.InferInput("KEYS", list(keys.shape), "INT64"),
              httpclient.InferInput("NUMKEYS", [1, 2], "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(keys)
    inputs[1].set_data_from_numpy(np.array([[500, 500]], np.int32))
    got = client.infer("emb", inputs).as_numpy("OUTPUT0").ravel()
    want = np.concatenate([
        tables[0][1][:499].ravel(), np.full(DIMS[0], 0.5), tables[1][1][:499].ravel(),
        np.full(DIMS[1], -0.5),
    ]).astype(np.float32)  # fmt: skip
    np.testing.assert_array_equal(got, want)
    # An open keep-alive connection makes Triton spend its whole exit timeout and then exit
    # without unloading the model: the stubs never detach from the host-tier segments.
    client.close()
    server.stop()
    assert list(shm.iterdir()) == []
    assert SECRET not in log.read_text(errors="replace")
    assert "s3://hps/emb/t0" in log.read_text(errors="replace")  # the host tier says so
