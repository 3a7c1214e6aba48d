"""A model whose files are broken while a server loads: a clear load error for that model,
the other models keep serving (``TritonServer(strict_models=False)``, what ``hps serve``
runs), and with Triton's strict default the start fails naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.process import ServerStartError

pytestmark = pytest.mark.integration

DIM = 8


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A repository with embedding models 'good' and 'bad' (one table each)."""
    rng = np.random.default_rng(3)
    models, vectors = [], {}
    for name in ("good", "bad"):
        keys = np.arange(1000, dtype=np.int64)
        vectors[name] = rng.standard_normal((1000, DIM)).astype(np.float32)
        write_sparse_table(tmp_path / "data" / name, keys, vectors[name])
        models.append({
            "model": name, "sparse_files": [f"data/{name}"], "embedding_vecsize_per_table": [DIM],
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [4], "max_batch_size": 4,
            "deployed_device_list": [0],
        })  # fmt: skip
    (tmp_path / "ps.json").write_text(json.dumps({"supportlonglong": True, "models": models}))
    assert hps_main(["repo", str(tmp_path / "ps.json"), str(tmp_path / "repo")]) == 0
    # The 'bad' table loses its last three vectors after the repository was written.
    emb = tmp_path / "data" / "bad" / "emb_vector"
    with emb.open("r+b") as f:
        f.truncate(emb.stat().st_size - 3 * DIM * 4)
    return tmp_path / "repo", vectors


def lookup(url: str, model: str, keys: list[int]) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    inputs = [httpclient.InferInput("KEYS", [1, len(keys)], "INT64"),
              httpclient.InferInput("NUMKEYS", [1, 1], "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([keys], np.int64))
    inputs[1].set_data_from_numpy(np.array([[len(keys)]], np.int32))
    return client.infer(model, inputs).as_numpy("OUTPUT0").reshape(len(keys), DIM)


@pytest.mark.parametrize("stub_watchdog", [False, True], ids=["plain", "watchdog"])
def test_a_broken_model_fails_alone(triton_server, repo, stub_watchdog) -> None:
    folder, vectors = repo
    server = triton_server(folder, strict_models=False, stub_watchdog=stub_watchdog)
    url = server.http_url.removeprefix("http://")
    np.testing.assert_array_equal(lookup(url, "good", [3, 999]), vectors["good"][[3, 999]])
    states = server.model_states()
    assert states["good"].ready and not states["bad"].ready
    assert states["bad"].state == "UNAVAILABLE"
    reason = states["bad"].reason
    assert "emb_vector" in reason and "looks truncated, 3 vectors" in reason, reason
    with pytest.raises(InferenceServerException, match="bad"):
        lookup(url, "bad", [1])
    # The server still answers the good model afterwards.
    np.testing.assert_array_equal(lookup(url, "good", [5]), vectors["good"][[5]])


def test_a_model_whose_database_does_not_answer_fails_alone_at_initialize(
    triton_server, repo
) -> None:
    """Its tables open in initialize (the model has a warm-up): a failed warm-up request
    crashed Triton 2.51 now and then, taking the good model down with it."""
    folder, vectors = repo
    ps = folder / "bad" / "ps.json"
    doc = json.loads(ps.read_text())
    doc["volatile_db"] = {"type": "redis_cluster", "address": "127.0.0.1:1"}
    ps.write_text(json.dumps(doc))
    (folder.parent / "data" / "bad").rename(folder.parent / "data" / "bad_cut")
    shutil.copytree(folder.parent / "data" / "good", folder.parent / "data" / "bad")
    server = triton_server(folder, strict_models=False)
    url = server.http_url.removeprefix("http://")
    np.testing.assert_array_equal(lookup(url, "good", [3, 999]), vectors["good"][[3, 999]])
    states = server.model_states()
    reason = states["bad"].reason
    assert not states["bad"].ready and "volatile_db.address '127.0.0.1:1'" in reason, reason
    assert "warmup" not in reason  # refused by initialize, not by the warm-up request


def test_strict_models_keep_tritons_exit_naming_the_file(triton_server, repo) -> None:
    folder, _ = repo
    with pytest.raises(ServerStartError, match="failed to load all models") as info:
        triton_server(folder, startup_timeout_s=60)
    assert "emb_vector" in str(info.value)


def test_hps_serve_exits_with_the_reasons_when_no_model_loads(repo, capsys) -> None:
    """``hps serve`` never says "ready" when nothing serves: with 0 of N models loaded it
    prints each model's reason and exits non-zero (the server stopped)."""
    folder, _ = repo
    for stray in folder.iterdir():
        if stray.is_dir() and stray.name != "bad":
            shutil.rmtree(stray)
    ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
    code = hps_main(
        [
            "serve",
            "--no-keep-host-tiers",
            "--model-repository",
            str(folder),
            "--no-stub-watchdog",
            *ports,
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "hps serve: model 'bad' is UNAVAILABLE" in captured.err
    assert "none of the 1 model loaded" in captured.err
    assert "ready on HTTP" not in captured.out


def test_hps_serve_says_a_vector_file_cut_at_half_is_truncated(repo, capsys) -> None:
    """Issue 47: cut at exactly half, a vector file of dim 8 holds whole rows of dim 4; the
    ps.json's dim 8 is trusted, so the file is said truncated, with the numbers."""
    folder, _ = repo
    for stray in folder.iterdir():
        if stray.is_dir() and stray.name != "bad":
            shutil.rmtree(stray)
    emb = folder.parent / "data" / "bad" / "emb_vector"
    with emb.open("r+b") as f:
        f.truncate(1000 * DIM * 4 // 2)
    ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
    code = hps_main(
        [
            "serve",
            "--no-keep-host-tiers",
            "--model-repository",
            str(folder),
            "--no-stub-watchdog",
            *ports,
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert (
        f"hps serve: model 'bad' is UNAVAILABLE: Internal: ConfigError: models[1].sparse_files"
        f"[0]: {emb} looks truncated, 500 vectors (16,000 bytes) short: key holds 1,000 keys of "
        f"dim 8, which need 32,000 bytes; emb_vector holds 16,000 (50%), 500 vectors; or dim 8 "
        f"is wrong: both files agree on dim 4\n"
    ) in err, err
    assert "hps serve: 0 of 1 model serve; fix the files and restart" in err
