"""A repository written for HugeCTR's hps and hugectr Triton backends, served as it is:
``hps serve --model-repository REPO -- --backend-config=hps,ps=PS
--backend-config=hugectr,ps=PS`` on a real tritonserver answers HugeCTR's request contracts over
HTTP and gRPC with what the same ps.json answers in process, KIND_GPU instances on a machine
without a GPU included, and leaves the repository's files as they were. hugectr_backend's
hps-triton-ensemble sample serves its version folder 0; a model Triton refuses is named with
Triton's error and the user's files."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hugectr_repository import (
    EnsembleSample,
    digest,
    write_ensemble_sample,
    write_hugectr_repository,
)
from tritonclient.utils import InferenceServerException

from hps_core import HPS
from hps_core.arrays import first_gpu
from hps_core.formats.sparse import read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer import RankingSession
from hps_core.infer.contracts import HugeCTRContract
from hps_core.model_check import check_ps_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
from ranking_reference import encode_hugectr, model_tables, random_keys

pytestmark = pytest.mark.integration

_READY = re.compile(r"ready on HTTP http://(\S+), gRPC (\S+),")


@pytest.fixture
def served(request, tmp_path: Path, triton_installation):
    """``hps serve`` on the HugeCTR repository, as a user starts it; its URLs and files
    (``request.param``: edits of the models' config.pbtxt, ``(model, old text, new text)``)."""
    hugectr = write_hugectr_repository(tmp_path)
    for model, old, new in getattr(request, "param", ()):
        config = hugectr.repo / model / "config.pbtxt"
        assert old in config.read_text()
        config.write_text(config.read_text().replace(old, new))
    before = digest(hugectr.repo)
    ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
    command = [
        sys.executable, "-m", "hps_core.cli.main", "serve", "--no-keep-host-tiers",
        "--model-repository", str(hugectr.repo), *ports, "--",
        f"--backend-config=hps,ps={hugectr.hps_ps}", "--backend-config",
        f"hugectr,ps={hugectr.hugectr_ps}",
    ]  # fmt: skip
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    urls = None
    for line in proc.stdout:
        found = _READY.search(line)
        if found:
            urls = found.groups()
            break
    try:
        log.seek(0)
        assert urls is not None, f"hps serve never got ready:\n{log.read()}"
        yield hugectr, urls, tmp_path / "serve.log"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        if request.node.get_closest_marker("edits_repository") is None:
            assert digest(hugectr.repo) == before  # the user's repository is untouched
        HPS.close_all()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_hugectr_repository_answers_what_its_ps_json_answers(served, protocol) -> None:
    hugectr, (http_url, grpc_url), log = served
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(http_url if protocol == "http" else grpc_url)
    assert client.is_model_ready("hps_embedding") and client.is_model_ready("dlrm")
    if first_gpu() is None:  # the repository's KIND_GPU instances run on the CPU, said so
        assert "model 'dlrm' (backend hugectr): no usable GPU here" in log.read_text()

    # backend "hps": KEYS, NUMKEYS -> OUTPUT0, each table's vectors in turn.
    keys = [np.array([0, 5, 99999]), np.array([7, 19999])]
    flat = np.concatenate(keys).astype(np.int64)[None, :]
    counts = np.array([[len(k) for k in keys]], np.int32)
    inputs = [module.InferInput("KEYS", list(flat.shape), "INT64"),
              module.InferInput("NUMKEYS", list(counts.shape), "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(flat)
    inputs[1].set_data_from_numpy(counts)
    got = client.infer("hps_embedding", inputs).as_numpy("OUTPUT0").reshape(-1)
    hps = HPS(hugectr.hps_ps)
    want = np.concatenate(
        [hps.lookup(k, "hps_embedding", t).reshape(-1) for t, k in enumerate(keys)]
    )
    np.testing.assert_array_equal(got, want)

    # backend "hugectr": DES, CATCOLUMN, ROWINDEX -> OUTPUT0, the model's scores.
    session = RankingSession.open(hugectr.reference_ps, "dlrm")
    layout = session.layout
    rng = np.random.default_rng(5)
    dense = rng.random((3, layout.dense_dim), dtype=np.float32)
    known = [np.array(list(table)) for table in model_tables(hugectr.reference_ps, "dlrm")[1]]
    samples = random_keys(rng, 3, layout.slot_nums, known)
    arrays = encode_hugectr(dense, samples)
    inputs = [module.InferInput(name, list(a.shape), dtype)
              for name, a, dtype in zip(("DES", "CATCOLUMN", "ROWINDEX"), arrays,
                                        ("FP32", "INT64", "INT32"), strict=True)]  # fmt: skip
    for entry, array in zip(inputs, arrays, strict=True):
        entry.set_data_from_numpy(array)
    got = client.infer("dlrm", inputs).as_numpy("OUTPUT0").reshape(-1)
    want = session.predict(HugeCTRContract(layout).parse(*arrays)).reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


_LONG_KEYS = 'key: "embeddingkey_long_type" value: { string_value: "%s" }'


@pytest.mark.parametrize(
    "served", [[("dlrm", _LONG_KEYS % "true", _LONG_KEYS % "0")]], indirect=True
)
def test_a_hugectr_model_of_32_bit_keys_takes_uint32_keys(served) -> None:
    """embeddingkey_long_type "0" (false, as HugeCTR reads it): CATCOLUMN is UINT32, as
    HugeCTR's clients of such a model send it, and scores what the same keys score as int64."""
    hugectr, (http_url, _), log = served
    assert "model 'dlrm' (backend hugectr): 32-bit keys: CATCOLUMN is UINT32" in log.read_text()
    client = httpclient.InferenceServerClient(http_url)
    session = RankingSession.open(hugectr.reference_ps, "dlrm")
    layout = session.layout
    rng = np.random.default_rng(6)
    dense = rng.random((4, layout.dense_dim), dtype=np.float32)
    known = [np.array([k for k in table if 0 <= k < 2**32])
             for table in model_tables(hugectr.reference_ps, "dlrm")[1]]  # fmt: skip
    samples = random_keys(rng, 4, layout.slot_nums, known)
    des, catcolumn, rowindex = encode_hugectr(dense, samples)

    def infer(keys: np.ndarray, dtype: str) -> np.ndarray:
        inputs = [httpclient.InferInput(name, list(a.shape), t)
                  for name, a, t in (("DES", des, "FP32"), ("CATCOLUMN", keys, dtype),
                                     ("ROWINDEX", rowindex, "INT32"))]  # fmt: skip
        for entry, array in zip(inputs, (des, keys, rowindex), strict=True):
            entry.set_data_from_numpy(array)
        return client.infer("dlrm", inputs).as_numpy("OUTPUT0").reshape(-1)

    try:
        got = infer(catcolumn.astype(np.uint32), "UINT32")
        want = session.predict(HugeCTRContract(layout).parse(des, catcolumn, rowindex))
        np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-6)
        with pytest.raises(InferenceServerException, match=r"CATCOLUMN.*expects 'UINT32'"):
            infer(catcolumn, "INT64")
    finally:
        client.close()  # an open connection holds tritonserver's exit (exit_timeout)


_UNBATCHED = [
    ("hps_embedding", "max_batch_size: 16", "max_batch_size: 0"),
    ("hps_embedding", "TYPE_INT64 dims: [ -1 ]", "TYPE_INT64 dims: [ -1, -1 ]"),
    ("hps_embedding", "TYPE_INT32 dims: [ -1 ]", "TYPE_INT32 dims: [ -1, -1 ]"),
    ("dlrm", "max_batch_size: 16", "max_batch_size: 0"),
]


@pytest.mark.parametrize("served", [_UNBATCHED], indirect=True)
def test_unbatched_models_take_their_requests_whole(served) -> None:
    """max_batch_size 0, as HugeCTR's HPS ensemble sample configures its hps model (KEYS and
    NUMKEYS [-1, -1]): a [1024, 3] KEYS tensor with NUMKEYS [[3072]] answers the 3072 vectors,
    OUTPUT0 1-D; an unbatched hugectr model takes its three 1-D inputs."""
    hugectr, (http_url, _), _ = served
    client = httpclient.InferenceServerClient(http_url)
    try:
        rng = np.random.default_rng(8)
        keys = rng.integers(0, 120_000, (64, 3))
        counts = np.array([[keys.size - 10, 10]], np.int32)
        inputs = [httpclient.InferInput("KEYS", list(keys.shape), "INT64"),
                  httpclient.InferInput("NUMKEYS", list(counts.shape), "INT32")]  # fmt: skip
        inputs[0].set_data_from_numpy(keys)
        inputs[1].set_data_from_numpy(counts)
        got = client.infer("hps_embedding", inputs).as_numpy("OUTPUT0")
        flat = keys.reshape(-1)
        hps = HPS(hugectr.hps_ps)
        want = np.concatenate([hps.lookup(flat[:-10], "hps_embedding", 0).reshape(-1),
                               hps.lookup(flat[-10:], "hps_embedding", 1).reshape(-1)])  # fmt: skip
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)

        session = RankingSession.open(hugectr.reference_ps, "dlrm")
        layout = session.layout
        dense = rng.random((3, layout.dense_dim), dtype=np.float32)
        known = [np.array(list(t)) for t in model_tables(hugectr.reference_ps, "dlrm")[1]]
        arrays = [a[0] for a in encode_hugectr(dense, random_keys(rng, 3, layout.slot_nums, known))]
        inputs = [httpclient.InferInput(name, list(a.shape), dtype)
                  for name, a, dtype in zip(("DES", "CATCOLUMN", "ROWINDEX"), arrays,
                                            ("FP32", "INT64", "INT32"), strict=True)]  # fmt: skip
        for entry, array in zip(inputs, arrays, strict=True):
            entry.set_data_from_numpy(array)
        got = client.infer("dlrm", inputs).as_numpy("OUTPUT0")
        want = session.predict(HugeCTRContract(layout).parse(*arrays)).reshape(-1)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        client.close()


@pytest.mark.edits_repository
def test_a_model_updated_as_hugectr_users_do_serves_its_new_files_after_a_reload(
    served,
) -> None:
    """HugeCTR's model update: new sparse files, the ps.json pointing at them, a version
    folder and the config's version policy; then a load (here `hps reload`, which waits for
    the translation to have seen the edit). The new version serves the new rows."""
    hugectr, (http_url, _), log = served
    document = json.loads(hugectr.hps_ps.read_text())
    model = document["models"][0]
    folders = []
    for t, old in enumerate(model["sparse_files"]):
        keys, vectors = read_sparse_table(old)
        folder = hugectr.repo.parent / "retrained" / f"table{t}"
        write_sparse_table(folder, keys, vectors + 100)
        folders.append(str(folder))
    model["sparse_files"] = folders
    (hugectr.repo / "hps_embedding" / "2").mkdir()
    hugectr.hps_ps.write_text(json.dumps(document))
    config = hugectr.repo / "hps_embedding" / "config.pbtxt"
    config.write_text(config.read_text().replace("versions: 1", "versions: 2"))

    port = http_url.rsplit(":", 1)[1]
    reload = subprocess.run(
        [sys.executable, "-m", "hps_core.cli.main", "reload", "hps_embedding",
         "--http-port", port, "--timeout", "120"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert reload.returncode == 0, reload.stderr
    assert "serving version 2" in reload.stdout
    assert "model 'hps_embedding' changed in" in log.read_text()

    client = httpclient.InferenceServerClient(http_url)
    try:
        keys = np.array([[0, 5, 7]], np.int64)
        inputs = [httpclient.InferInput("KEYS", [1, 3], "INT64"),
                  httpclient.InferInput("NUMKEYS", [1, 2], "INT32")]  # fmt: skip
        inputs[0].set_data_from_numpy(keys)
        inputs[1].set_data_from_numpy(np.array([[2, 1]], np.int32))
        got = client.infer("hps_embedding", inputs).as_numpy("OUTPUT0").reshape(-1)
    finally:
        client.close()
    hps = HPS(hugectr.hps_ps)  # the edited ps.json: the retrained files
    want = np.concatenate([hps.lookup(keys[0, :2], "hps_embedding", 0).reshape(-1),
                           hps.lookup(keys[0, 2:], "hps_embedding", 1).reshape(-1)])  # fmt: skip
    np.testing.assert_array_equal(got, want)
    assert want.min() > 50  # the new rows, not the old ones


_NOTEBOOKS_CONTROL = ("--load-model=hps_test", "--model-control-mode=explicit")
"""The model control of the sample notebook's tritonserver command line."""


def _serve_sample(sample: EnsembleSample, log: Path, *options: str) -> subprocess.Popen[str]:
    """``hps serve`` on the sample's repository with tritonserver's ``options`` after ``--``,
    its output (server log included) in ``log``."""
    ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
    command = [
        sys.executable, "-m", "hps_core.cli.main", "serve", "--no-keep-host-tiers", *ports,
        "--", f"--model-repository={sample.repo}", *options,
        f"--backend-config=hps,ps={sample.ps_json}",
    ]  # fmt: skip
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)


def _wait_for(proc: subprocess.Popen[str], log: Path, pattern: re.Pattern[str]) -> re.Match[str]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        found = pattern.search(log.read_text())
        if found or proc.poll() is not None:
            break
        time.sleep(0.2)
    assert found, f"hps serve printed no '{pattern.pattern}':\n{log.read_text()}"
    return found


def test_hugectrs_ensemble_sample_serves_its_version_folder_0(
    tmp_path: Path, triton_installation
) -> None:
    """hugectr_backend's hps-triton-ensemble sample as its notebook writes it: files in
    version folder 0, version_policy {specific {versions: 0}}, a ps.json that gives
    num_of_refresher_buffer_in_pool twice (1 then 0). Served as it is: version 0 answers the
    rows of the sparse files; the load log names the user's ps.json, with the warnings
    ``hps check`` prints for it, one each."""
    sample = write_ensemble_sample(tmp_path)
    before = digest(sample.repo)
    log = tmp_path / "serve.log"
    # The notebook's tritonserver command line, after `--`.
    options = (*_NOTEBOOKS_CONTROL, "--backend-directory=/usr/local/hugectr/backends")
    proc = _serve_sample(sample, log, *options)
    try:
        http_url = _wait_for(proc, log, _READY)[1]
        client = httpclient.InferenceServerClient(http_url)
        try:
            assert client.is_model_ready("hps_test", "0")
            # The sample's request: one row of 32 keys below 999, NUMKEYS [[32]]; and a
            # key the table lacks, answered with the default value 0.0.
            keys = np.random.default_rng(0).integers(0, 999, (1, 32))
            keys[0, -1] = 5000
            inputs = [httpclient.InferInput("KEYS", [1, 32], "INT64"),
                      httpclient.InferInput("NUMKEYS", [1, 1], "INT32")]  # fmt: skip
            inputs[0].set_data_from_numpy(keys)
            inputs[1].set_data_from_numpy(np.array([[32]], np.int32))
            got = client.infer("hps_test", inputs).as_numpy("OUTPUT0").reshape(32, 32)
        finally:
            client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()
        HPS.close_all()
    table_keys, rows = read_sparse_table(sample.sparse)
    np.testing.assert_array_equal(table_keys, np.arange(1000))
    np.testing.assert_array_equal(got[:-1], rows[keys[0, :-1]])
    np.testing.assert_array_equal(got[-1], np.zeros(32, np.float32))
    assert digest(sample.repo) == before

    text = log.read_text()
    assert f"model 'hps_test' version 0: ps.json {sample.ps_json}, model 'hps_test'" in text
    warnings = check_ps_json(sample.ps_json, "hps_test").warnings
    assert len(warnings) == 3  # the key given twice; 3 and 0 buffers, which change nothing
    for line in warnings:
        assert text.count(f"hps WARNING {sample.ps_json}: {line}\n") == 1, (line, text)
    ours = [line for line in text.splitlines() if line.startswith(("hps ", "hps serve:"))]
    assert not [line for line in ours if "hps-hugectr-repo-" in line]


@pytest.mark.parametrize(
    ("broken", "options"),
    [
        ("version folder", ()),
        ("version folder", _NOTEBOOKS_CONTROL),
        ("version folder", ("--model-control-mode=none",)),
        ("sparse files", ()),
    ],
)
def test_a_model_triton_refuses_is_named_with_tritons_error_and_the_users_files(
    tmp_path: Path, triton_installation, broken: str, options: tuple[str, ...]
) -> None:
    """A version policy naming no folder (Triton refuses the model before reading a version,
    and its index does not list it), with hps serve's model control or the user's (the
    notebook's explicit mode), or a ps.json naming a missing sparse folder: hps serve prints
    Triton's own load error naming the user's files, and stops. Without explicit model
    control Triton takes no load request: its log alone has the error, and that is said."""
    sample = write_ensemble_sample(tmp_path)
    config = sample.repo / "hps_test" / "config.pbtxt"
    if broken == "version folder":
        config.write_text(config.read_text().replace("versions: 0", "versions: 5"))
    else:
        shutil.rmtree(sample.sparse)
    log = tmp_path / "serve.log"
    proc = _serve_sample(sample, log, *options)
    try:
        assert proc.wait(timeout=180) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        HPS.close_all()
    lines = [line for line in log.read_text().splitlines() if line.startswith("hps serve:")]
    if "--model-control-mode=none" in options:
        reason = (
            "Triton refused it before loading a version (a version_policy naming no version "
            "folder, or a config it cannot use): its log above says why"
        )
    elif broken == "version folder":
        reason = (
            "load failed for model 'hps_test': at least one version must be available under "
            "the version policy of model 'hps_test'"
        )
    else:
        reason = (
            f"Internal: ConfigError: {sample.ps_json}: models[0].sparse_files[0]: "
            f"{sample.sparse}: sparse model folder does not exist"
        )
    assert f"hps serve: model 'hps_test' is UNAVAILABLE: {reason}" in lines, lines
    assert "hps serve: none of the 1 model loaded; stopping the server" in lines
    assert not [line for line in lines if "hps-hugectr-repo-" in line]
