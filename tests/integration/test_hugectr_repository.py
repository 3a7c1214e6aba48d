"""A repository written for HugeCTR's hps and hugectr Triton backends, served as it is:
``hps serve --model-repository REPO -- --backend-config=hps,ps=PS
--backend-config=hugectr,ps=PS`` on a real tritonserver answers HugeCTR's request contracts over
HTTP and gRPC with what the same ps.json answers in process, KIND_GPU instances on a machine
without a GPU included, and leaves the repository's files as they were."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hugectr_repository import digest, write_hugectr_repository
from tritonclient.utils import InferenceServerException

from hps_core import HPS
from hps_core.arrays import first_gpu
from hps_core.formats.sparse import read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer import RankingSession
from hps_core.infer.contracts import HugeCTRContract

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
