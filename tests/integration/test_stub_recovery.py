"""A Python stub killed under load comes back: the stub watchdog reloads its model.

Triton 2.51 does not restart a dead stub: without the watchdog, the requests routed to the
dead instance fail for as long as the server runs. With it (``hps serve``'s default), the
model is reloaded within seconds, good requests are answered correctly again, clients still
cannot load or unload models, the old version's surviving stub (which Triton 2.51 never ends)
is released once idle, and no process or ``/dev/shm`` entry is left after the server stops.
Checked on CPU instances and, where CUDA is usable, on GPU instances (the GPU pipeline, its
CUDA IPC cache files and mapped host tier), on a repository served before (nothing written in
its folder by the load: Triton skips a load of an unchanged folder, so the watchdog's reload
must not rely on one). A reload that fails because a model file was damaged meanwhile is
logged with its reason and tried again until the file is mended.
"""

from __future__ import annotations

import compileall
import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from hps_core.demo import DEMO_MODELS
from hps_core.server.stub_watchdog import stub_processes
from hps_core.tiers.shm_segment import remove_stale_segments
from hps_core.triton_repo import InstanceGroup, ServingOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from instance_kinds import INSTANCE_KINDS
from private_shm import private_shm_dir, python_backend_regions
from ranking_reference import encode_hugectr
from test_ranking_models import Model

pytestmark = pytest.mark.integration

NAME = "dcn"
RECOVERY_S = 20.0
RELEASE_S = 45.0  # recovery to the old stub's release: at most max_wait_s (30 s) after the reload


def infer(client, model: Model, rng: np.random.Generator) -> None:
    dense, keys = model.samples(rng, 4)
    inputs = []
    for name, array, kind in zip(
        ("DES", "CATCOLUMN", "ROWINDEX"), encode_hugectr(dense, keys), ("FP32", "INT64", "INT32"),
        strict=True,
    ):  # fmt: skip
        tensor = grpcclient.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    got = client.infer(NAME, inputs).as_numpy("OUTPUT0")
    model.check(got.reshape(-1, 1), dense, keys)


def served_before(tmp_path: Path, kind: str) -> Path:
    """The model's repository as a server leaves it: the model's bytecode compiled already
    (the first load of a fresh folder writes it, which Triton takes for a change)."""
    repo = tmp_path / "repo"
    DEMO_MODELS[NAME](repo, ServingOptions(instances=(InstanceGroup(count=2, kind=kind),)))
    assert compileall.compile_dir(repo, quiet=1)
    return repo


def watched(module_triton_server, tmp_path: Path, monkeypatch, kind: str = "KIND_CPU"):
    """``(repository, shared-memory folder, server)``, served as hps serve runs it: the
    watchdog on, and host-tier segments whose users all died (the stubs the watchdog killed)
    removed once the server is gone."""
    repo = served_before(tmp_path, kind)
    shm = private_shm_dir(tmp_path, monkeypatch)  # the server's host-tier segments
    server = module_triton_server(
        repo, startup_timeout_s=180, stub_watchdog=True,
        on_stopped=[lambda _: remove_stale_segments()],
    )  # fmt: skip
    return repo, shm, server


@pytest.mark.parametrize("kind", INSTANCE_KINDS)
def test_a_killed_stub_is_replaced_and_the_model_serves_again(
    module_triton_server, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, shm, server = watched(module_triton_server, tmp_path, monkeypatch, kind)
    regions = server._shm_prefix
    client = grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])
    model = Model(repo, NAME)
    rng = np.random.default_rng(5)
    for _ in range(4):
        infer(client, model, rng)

    # Clients cannot use model control; its token is not in the command anyone may print.
    command = " ".join(server.command)
    assert "--model-control-mode=explicit" in command and "***" in command
    assert server._control_token not in command
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            urllib.request.Request(
                f"{server.http_url}/v2/repository/models/{NAME}/unload", data=b"{}",
                method="POST",
            ),
            timeout=10,
        )  # fmt: skip
    assert refused.value.code == 403
    with pytest.raises(InferenceServerException):
        client.unload_model(NAME)

    # Load from two client threads while one of the model's stubs is killed.
    stubs = [pid for pid, name in stub_processes(server.pid).items() if name == NAME]
    assert len(stubs) == 2
    failures: list[str] = []
    done = threading.Event()

    def load() -> None:
        own = np.random.default_rng(threading.get_ident() % 2**32)
        while not done.is_set():
            try:
                infer(client, model, own)
            except InferenceServerException as exc:
                failures.append(str(exc))

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(0.5)
    os.kill(stubs[0], signal.SIGKILL)
    killed = time.monotonic()
    recovered = None
    while time.monotonic() - killed < RECOVERY_S:
        try:
            for _ in range(10):
                infer(client, model, rng)
        except InferenceServerException:
            time.sleep(0.1)
            continue
        if server._watchdog is not None and server._watchdog.reloads:
            recovered = time.monotonic() - killed
            break
    done.set()
    for worker in workers:
        worker.join()
    assert recovered is not None, f"not serving {RECOVERY_S} s after the kill: {failures[-3:]}"
    assert server.stub_reloads == [NAME]
    assert all("not healthy" in f or "unavailable" in f.lower() for f in failures), failures[:3]
    # Two new stubs serve the model. The old version's surviving stub, which Triton 2.51 never
    # ends (it never finishes unloading a version whose stub died mid-request), is released by
    # the watchdog once idle; every request keeps being answered meanwhile and afterwards.
    new = {pid for pid, name in stub_processes(server.pid).items() if name == NAME} - set(stubs)
    assert len(new) == 2, (stubs, new)
    released = None
    while time.monotonic() - killed < recovered + RELEASE_S:
        infer(client, model, rng)
        current = {pid for pid, name in stub_processes(server.pid).items() if name == NAME}
        if current == new:
            released = time.monotonic() - killed - recovered
            break
        time.sleep(0.1)
    assert released is not None, f"old stub not released in {RELEASE_S} s: {stubs} -> {current}"
    assert server._watchdog.released == [stubs[1]]
    for _ in range(20):  # every instance answers again
        infer(client, model, rng)
    print(
        f"\nrecovered {recovered:.1f} s after kill -9; {len(failures)} requests failed meanwhile;"
        f" old stub released {released:.1f} s after recovery"
    )

    started = time.monotonic()
    server.stop()
    print(f"stop took {time.monotonic() - started:.1f} s")
    assert not stub_processes(server.pid)
    assert list(shm.iterdir()) == [] and python_backend_regions(regions) == []


def test_a_failed_reload_is_said_with_its_reason_and_tried_again_until_the_files_are_mended(
    module_triton_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    repo, _, server = watched(module_triton_server, tmp_path, monkeypatch)
    assert server._watchdog is not None
    server._watchdog.retry_s = 1.0
    client = grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])
    model = Model(repo, NAME)
    rng = np.random.default_rng(6)
    infer(client, model, rng)

    # A table file cut short while the model serves: no effect until the model loads again.
    vectors = next((repo / NAME).glob("data/*/emb_vector"))
    shutil.copy(vectors, tmp_path / "emb_vector")
    os.truncate(vectors, vectors.stat().st_size - 100)
    stubs = sorted(pid for pid, name in stub_processes(server.pid).items() if name == NAME)
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        os.kill(stubs[0], signal.SIGKILL)
        deadline = time.monotonic() + RECOVERY_S
        while time.monotonic() < deadline and not failed_reloads(caplog):
            time.sleep(0.2)
        [said] = failed_reloads(caplog)
        assert vectors.parent.name in said and "100 bytes" in said, said
        assert "At:" not in said  # Triton's reason without the Python backend's frames
        time.sleep(3)  # tried again, said once
        assert len(failed_reloads(caplog)) == 1 and server._watchdog.reloads == []
        for _ in range(4):  # the surviving instance serves
            with contextlib.suppress(InferenceServerException):
                infer(client, model, rng)

        shutil.copy(tmp_path / "emb_vector", vectors)  # mended: the next attempt loads it
        while time.monotonic() < deadline + 10 and not server._watchdog.reloads:
            time.sleep(0.2)
    assert server._watchdog.reloads == [NAME]
    for _ in range(10):
        infer(client, model, rng)


def failed_reloads(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "reload after a stub exit failed" in r.getMessage()
    ]


def test_a_reload_brings_back_the_version_that_served_not_a_newer_broken_one(
    module_triton_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version added to the folder but not switched to (hps reload) may be broken: the
    watchdog reloads the versions that served, so killing a stub never turns into a failed
    switch to it."""
    repo, _, server = watched(module_triton_server, tmp_path, monkeypatch)
    client = grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])
    model = Model(repo, NAME)
    rng = np.random.default_rng(7)
    infer(client, model, rng)
    shutil.copytree(repo / NAME / "1", repo / NAME / "2")
    (repo / NAME / "2" / "ps.json").write_text("{")  # version 2: broken, not switched to
    stubs = sorted(pid for pid, name in stub_processes(server.pid).items() if name == NAME)
    os.kill(stubs[0], signal.SIGKILL)
    deadline = time.monotonic() + RECOVERY_S
    while time.monotonic() < deadline and not server.stub_reloads:
        time.sleep(0.2)
    assert server.stub_reloads == [NAME]
    for _ in range(10):  # both instances of version 1 answer
        infer(client, model, rng)
    ready = [s for s in server.version_states() if s.model == NAME and s.state == "READY"]
    assert [s.version for s in ready] == [1]
