"""tritonserver options a HugeCTR user's command line carries after ``--``: the model
repository, the ports and the verbosity become ``hps serve``'s, ``--backend-directory`` (in
every HugeCTR sample) is dropped with a line saying so, and what cannot be honoured is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps_core.cli.main import build_parser
from hps_core.cli.serve import take_tritonserver_options
from hps_core.errors import HPSError


def parsed(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_a_hugectr_command_line_after_the_dashes_sets_hps_serves_options(capsys) -> None:
    args = parsed("--http-port", "9000")
    rest = take_tritonserver_options(
        args,
        ["--model-repository=/models", "--backend-directory=/usr/local/hugectr/backends",
         "--backend-config=hps,ps=/models/ps.json", "--grpc-port", "9001",
         "--http-port=9100", "--log-verbose=1", "--exit-timeout-secs=9"],
    )  # fmt: skip
    assert rest == ["--backend-config=hps,ps=/models/ps.json", "--exit-timeout-secs=9"]
    assert args.model_repository == Path("/models")
    assert (args.http_port, args.grpc_port, args.metrics_port, args.log_verbose) == (
        9100, 9001, 8002, 1,
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "--backend-directory=/usr/local/hugectr/backends dropped" in err


def test_the_same_repository_twice_is_one_and_two_are_refused(tmp_path: Path) -> None:
    args = parsed("--model-repository", str(tmp_path))
    assert take_tritonserver_options(args, [f"--model-store={tmp_path}/."]) == []
    assert args.model_repository == Path(f"{tmp_path}/.")
    with pytest.raises(HPSError, match="two model repositories"):
        take_tritonserver_options(args, ["--model-repository", "/elsewhere"])
    with pytest.raises(HPSError, match="--grpc-port: 'x' is not an integer"):
        take_tritonserver_options(parsed(), ["--grpc-port=x"])
    with pytest.raises(HPSError, match="--http-port needs a value"):
        take_tritonserver_options(parsed(), ["--http-port"])
