"""make_perf_input.py prints a perf_analyzer command that runs without an activated venv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def _program(path: Path, executable: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755 if executable else 0o644)
    return path


def test_next_to_the_interpreter_relative_to_the_checkout(perf_input, tmp_path: Path) -> None:
    _program(tmp_path / ".venv" / "bin" / "perf_analyzer")
    python = str(tmp_path / ".venv" / "bin" / "python")
    found = perf_input.find_perf_analyzer(python, repo_root=tmp_path / "elsewhere", cwd=tmp_path)
    assert found == ".venv/bin/perf_analyzer"
    # From another folder the path is absolute.
    other = tmp_path / "other"
    other.mkdir()
    absolute = str(tmp_path / ".venv" / "bin" / "perf_analyzer")
    assert perf_input.find_perf_analyzer(python, repo_root=other, cwd=other) == absolute


def test_the_checkout_venv_when_another_python_runs(perf_input, tmp_path: Path) -> None:
    root = tmp_path / "my checkout"  # a space: the printed path is quoted for the shell
    _program(root / ".venv" / "bin" / "perf_analyzer")
    _program(tmp_path / "py" / "perf_analyzer", executable=False)  # not runnable: skipped
    python = str(tmp_path / "py" / "python3")
    found = perf_input.find_perf_analyzer(python, repo_root=root, cwd=tmp_path)
    assert found == "'my checkout/.venv/bin/perf_analyzer'"


def test_plain_name_when_none_is_installed(perf_input, tmp_path: Path) -> None:
    python = str(tmp_path / "bin" / "python3")
    assert perf_input.find_perf_analyzer(python, repo_root=tmp_path, cwd=tmp_path) == (
        "perf_analyzer"
    )


def test_main_prints_the_runnable_command(
    perf_input, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _program(tmp_path / ".venv" / "bin" / "perf_analyzer")
    monkeypatch.setattr(sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    monkeypatch.chdir(tmp_path)
    assert perf_input.main(["--samples", "2", "--out", "in put.json"]) == 0
    use = capsys.readouterr().out.splitlines()[-1]
    assert use == (
        "use: .venv/bin/perf_analyzer -m hps_embedding -i grpc -u localhost:8001 "
        "--input-data 'in put.json' --concurrency-range 2 --request-count 2000"
    )


def test_a_python_without_the_packages_is_told_which_to_use(tmp_path: Path) -> None:
    """A plain ``python`` (here: the venv's without its site-packages, so neither NumPy nor
    hps_core) stops with one line naming the checkout's venv Python and the same arguments,
    instead of a traceback."""
    import subprocess

    script = Path(__file__).resolve().parents[3] / "client_examples" / "make_perf_input.py"
    done = subprocess.run(
        [sys.executable, "-S", str(script), "--samples", "2", "--out", str(tmp_path / "p.json")],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: make_perf_input.py needs this checkout's packages"), line
    venv_python = str(script.parents[1] / ".venv" / "bin" / "python")
    assert "run it with the checkout's venv" in line and venv_python in line, line
    assert line.endswith(f"--samples 2 --out {tmp_path / 'p.json'}"), line
    assert not (tmp_path / "p.json").exists()
