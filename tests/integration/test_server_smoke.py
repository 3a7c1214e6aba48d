"""A real tritonserver with a trivial Python model: HTTP and gRPC answers, the served models
listed to clients and operators, clean stop, no server left behind by a launcher killed with
``kill -9``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hps_core.cli.main import main as hps_main
from hps_core.server.control import HEADER, ControlInfo, write_control_file
from hps_core.server.process import DEFAULT_EXIT_TIMEOUT_S, process_group_members

pytestmark = pytest.mark.integration

MODEL = "affine"
WIDTH = 8
MAX_BATCH = 64

# DLPack both ways: with NumPy 2, as_numpy() and pb_utils.Tensor(name, ndarray) corrupt data in
# Triton 2.51's stub (see TRITON_NOTES.md).
MODEL_PY = """
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        with open(params["probe_file"]["string_value"], "w") as f:
            json.dump({"prefix": sys.prefix, "numpy": np.__version__}, f)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "X"))
            keys = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "KEYS"))
            y = np.ascontiguousarray(x * np.float32(2) + np.float32(1))
            keys3 = np.ascontiguousarray(keys * 3)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("Y", y),
                pb_utils.Tensor.from_dlpack("KEYS3", keys3),
            ]))
        return responses
"""


def _write_repository(root: Path) -> tuple[Path, Path]:
    probe = root / "probe.json"
    model = root / "repo" / MODEL
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL_PY)
    (model / "config.pbtxt").write_text(
        f"""
backend: "python"
max_batch_size: {MAX_BATCH}
input [
  {{ name: "X", data_type: TYPE_FP32, dims: [ {WIDTH} ] }},
  {{ name: "KEYS", data_type: TYPE_INT64, dims: [ -1 ] }}
]
output [
  {{ name: "Y", data_type: TYPE_FP32, dims: [ {WIDTH} ] }},
  {{ name: "KEYS3", data_type: TYPE_INT64, dims: [ -1 ] }}
]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
parameters {{ key: "probe_file" value {{ string_value: "{probe}" }} }}
"""
    )
    return root / "repo", probe


@pytest.fixture(scope="module")
def served(module_triton_server, tmp_path_factory):
    repo, probe = _write_repository(tmp_path_factory.mktemp("smoke"))
    return module_triton_server(repo), probe


def _infer(module, client, x: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    inputs = [
        module.InferInput("X", list(x.shape), "FP32"),
        module.InferInput("KEYS", list(keys.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(keys)
    result = client.infer(MODEL, inputs)
    return result.as_numpy("Y"), result.as_numpy("KEYS3")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_element_matches_the_reference(served, protocol):
    server, _ = served
    rng = np.random.default_rng(11 if protocol == "http" else 12)
    if protocol == "http":
        module, client = (
            httpclient,
            httpclient.InferenceServerClient(server.http_url.removeprefix("http://")),
        )
    else:
        module, client = grpcclient, grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        for batch, n_keys in [(1, 1), (5, 7), (MAX_BATCH, 33)]:
            x = rng.standard_normal((batch, WIDTH)).astype(np.float32)
            keys = rng.integers(-(2**61), 2**61, size=(batch, n_keys), dtype=np.int64)
            y, keys3 = _infer(module, client, x, keys)
            # 2x is exact and +1 rounds once, so float64 rounded to float32 is the exact answer.
            np.testing.assert_array_equal(y, (x.astype(np.float64) * 2 + 1).astype(np.float32))
            assert keys3.dtype == np.int64
            assert keys3.tolist() == [[int(k) * 3 for k in row] for row in keys.tolist()]
    finally:
        client.close()


def test_models_run_in_this_environment(served):
    _, probe = served
    seen = json.loads(probe.read_text())
    assert Path(seen["prefix"]).resolve() == Path(sys.prefix).resolve()
    assert seen["numpy"] == np.__version__


def test_clients_list_the_served_models_through_statistics(
    triton_server, tmp_path, monkeypatch, capsys
):
    repo, _ = _write_repository(tmp_path)
    broken = repo / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.py").write_text("import nothere\n")
    (broken / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )
    # As hps serve runs it: the model-repository API kept to the operator, a broken model
    # unavailable while the others serve.
    server = triton_server(repo, model_control=True, strict_models=False)
    http = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for client in (http, grpc):
            # Index, load and unload are one category for Triton: all refused to clients, with
            # a message that names the way to list models.
            refused = f"expecting header '(triton-grpc-protocol-)?{HEADER}'"
            assert "to-list-models-use-model-statistics" in HEADER
            with pytest.raises(InferenceServerException, match=refused):
                client.get_model_repository_index()
            with pytest.raises(InferenceServerException, match=refused):
                client.unload_model(MODEL)
        # The statistics API is open to them and lists the models that serve.
        listed = [
            http.get_inference_statistics()["model_stats"],
            grpc.get_inference_statistics(as_json=True)["model_stats"],
        ]
        for stats in listed:
            assert [(m["name"], m["version"]) for m in stats] == [(MODEL, "1")]
        assert http.is_model_ready(MODEL) and not http.is_model_ready("broken")
    finally:
        http.close()
        grpc.close()
    # The operator (hps models, through hps serve's control file) sees every model and why one
    # does not serve.
    monkeypatch.setenv("HPS_RUNTIME_DIR", str(tmp_path / "run"))
    info = ControlInfo(os.getpid(), server.http_url, server.control_token)
    write_control_file(server.ports.http, info)
    assert hps_main(["models", "--http-port", str(server.ports.http)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{MODEL}  1  READY",
        "broken  1  UNAVAILABLE: Internal: ModuleNotFoundError: No module named 'nothere'",
    ]


def test_stop_leaves_no_process_of_the_group(triton_server, tmp_path):
    repo, _ = _write_repository(tmp_path)
    server = triton_server(repo)
    pgid = server.pid
    group = [p for p in psutil.process_iter(["cmdline"]) if _pgid(p) == pgid]
    cmdlines = [" ".join(p.info["cmdline"] or []) for p in group]
    assert any("triton_python_backend_stub" in c for c in cmdlines), cmdlines
    assert server.stop() == 0
    leftovers = [p.pid for p in psutil.process_iter() if _pgid(p) == pgid and _alive(p)]
    assert leftovers == []


def test_the_server_dies_with_a_killed_launcher(triton_installation, tmp_path):
    repo, _ = _write_repository(tmp_path)
    log = tmp_path / "hps-serve.log"
    # The control file of the killed hps serve stays behind: keep it out of the user's folder.
    env = {**os.environ, "HPS_RUNTIME_DIR": str(tmp_path / "run")}
    ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    with log.open("wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "hps_core.cli.main", "serve", "--no-keep-host-tiers",
             "--model-repository", str(repo), *ports],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    server_pid = None
    try:
        deadline = time.monotonic() + 120
        while b"hps serve: ready" not in log.read_bytes():
            assert launcher.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        (server,) = psutil.Process(launcher.pid).children()
        server_pid = server.pid
        option = next(a for a in server.cmdline() if "shm-region-prefix-name=" in a)
        shm_prefix = option.split("shm-region-prefix-name=")[1]
        assert list(Path("/dev/shm").glob(f"{shm_prefix}*"))  # the stub's region
        assert len(process_group_members(server_pid)) >= 2  # tritonserver and the model's stub
        launcher.kill()  # SIGKILL: hps serve stops nothing, runs no atexit hook
        launcher.wait()
        killed = time.monotonic()
        # SIGTERM from the kernel: Triton unloads the model (its stub exits) and exits within
        # its exit timeout.
        while process_group_members(server_pid) and time.monotonic() - killed < (
            DEFAULT_EXIT_TIMEOUT_S + 10
        ):
            time.sleep(0.1)
        assert process_group_members(server_pid) == [], log.read_text()[-3000:]
        # SIGTERM, so Triton shut down in order: it removed its shared-memory regions itself.
        assert "Signal (15) received" in log.read_text()
        assert list(Path("/dev/shm").glob(f"{shm_prefix}*")) == []
    finally:
        launcher.kill()
        launcher.wait()
        if server_pid is not None:  # whatever is left of the server's group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server_pid, signal.SIGKILL)


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
