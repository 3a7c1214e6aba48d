"""The stub watchdog's parts that need no tritonserver: finding stubs, its options, their
conflicts and the token kept out of the printed command (the recovery itself:
``tests/integration/test_stub_recovery.py``)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from hps_core.server.process import ServerError, TritonServer
from hps_core.server.stub_watchdog import HEADER, control_args, new_token, stub_processes


def test_control_args_load_every_model_and_restrict_model_control_to_the_token() -> None:
    token = new_token()
    args = control_args(token)
    assert "--model-control-mode=explicit" in args and "--load-model=*" in args
    assert f"--http-restricted-api=model-repository:{HEADER}={token}" in args
    assert f"--grpc-restricted-protocol=model-repository:{HEADER}={token}" in args
    assert new_token() != token and len(token) == 32


def test_stub_processes_maps_each_child_stub_to_its_model(tmp_path: Path) -> None:
    stubs = []
    for model in ("dcn", "dcn_samples"):
        script = tmp_path / model / "1" / "model.py"
        script.parent.mkdir(parents=True)
        script.write_text("sleep 30\n")
        # A child whose argv is a stub's: the executable's name, then the model's model.py.
        stubs.append(
            subprocess.Popen(["triton_python_backend_stub", str(script)], executable="/bin/sh")
        )
    other = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while len(found := stub_processes(os.getpid())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found == {stubs[0].pid: "dcn", stubs[1].pid: "dcn_samples"}
        assert stub_processes(other.pid) == {}
    finally:
        for process in (*stubs, other):
            process.kill()
            process.wait()
    assert stub_processes(os.getpid()) == {}


@pytest.mark.parametrize(
    "arg", ["--model-control-mode=poll", "--load-model=dcn", "--http-restricted-api=x:k=v"]
)
def test_the_watchdog_refuses_model_control_options_of_its_own(tmp_path: Path, arg: str) -> None:
    server = TritonServer(tmp_path, stub_watchdog=True, extra_args=[arg])
    with pytest.raises(ServerError, match="stub watchdog"):
        server.start()
