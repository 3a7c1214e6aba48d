"""Finding Triton and perf_analyzer: environment variables, the pytriton wheel, errors."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

from hps_core.server.install import (
    BACKEND_FILES,
    STUB_NAME,
    TritonInstallError,
    find_perf_analyzer,
    find_triton,
    python_version,
)

THIS = python_version()


def _executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake_wheel(site: Path, stub_versions: tuple[str, ...] = (THIS,)) -> Path:
    """Lay out site-packages/pytriton like nvidia-pytriton 0.7.0; importing it would fail."""
    package = site / "pytriton"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('pytriton must not be imported')\n")
    server_root = package / "tritonserver"
    _executable(server_root / "bin" / "tritonserver")
    python_dir = server_root / "backends" / "python"
    python_dir.mkdir(parents=True)
    for name in BACKEND_FILES:
        (python_dir / name).write_text(name)
    for version in stub_versions:
        _executable(server_root / "python_backend_stubs" / version / STUB_NAME, version)
    (server_root / "caches" / "local").mkdir(parents=True)
    return server_root


@pytest.fixture
def wheel_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    return site


def test_wheel_backend_is_assembled_for_this_python(wheel_site, tmp_path):
    server_root = _fake_wheel(wheel_site, stub_versions=("3.8", THIS, "3.13"))
    inst = find_triton(environ={}, cache_root=tmp_path / "cache")
    assert "pytriton" not in sys.modules
    assert inst.tritonserver == server_root / "bin" / "tritonserver"
    assert inst.cache_directory == server_root / "caches"
    assert inst.backend_directory.parent == tmp_path / "cache"
    python_dir = inst.backend_directory / "python"
    assert sorted(p.name for p in python_dir.iterdir()) == sorted([*BACKEND_FILES, STUB_NAME])
    for name in BACKEND_FILES:
        assert (python_dir / name).resolve() == (server_root / "backends" / "python" / name)
    stub = python_dir / STUB_NAME
    assert stub.resolve() == server_root / "python_backend_stubs" / THIS / STUB_NAME
    assert stub.read_text() == THIS
    assert "nvidia-pytriton" in inst.source


def test_wheel_backend_is_reused_and_repaired(wheel_site, tmp_path):
    server_root = _fake_wheel(wheel_site)
    first = find_triton(environ={}, cache_root=tmp_path / "cache")
    inode = (first.backend_directory / "python").stat().st_ino
    again = find_triton(environ={}, cache_root=tmp_path / "cache")
    assert again.backend_directory == first.backend_directory
    assert (again.backend_directory / "python").stat().st_ino == inode  # not rebuilt
    broken = first.backend_directory / "python" / STUB_NAME
    broken.unlink()
    broken.symlink_to(tmp_path)
    repaired = find_triton(environ={}, cache_root=tmp_path / "cache")
    stub = repaired.backend_directory / "python" / STUB_NAME
    assert stub.resolve() == server_root / "python_backend_stubs" / THIS / STUB_NAME
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.backend_directory.name]


def test_wheel_without_stub_for_this_python(wheel_site, tmp_path):
    _fake_wheel(wheel_site, stub_versions=("3.8", "3.9"))
    with pytest.raises(TritonInstallError) as info:
        find_triton(environ={}, cache_root=tmp_path / "cache")
    message = str(info.value)
    assert f"no Python-backend stub for Python {THIS}" in message
    assert "available: 3.8, 3.9" in message


def test_wheel_missing_backend_file(wheel_site, tmp_path):
    server_root = _fake_wheel(wheel_site)
    (server_root / "backends" / "python" / "libtriton_python.so").unlink()
    with pytest.raises(TritonInstallError, match=r"libtriton_python\.so: missing"):
        find_triton(environ={}, cache_root=tmp_path / "cache")


def test_nothing_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    importlib.invalidate_caches()
    assert importlib.util.find_spec("pytriton") is None
    with pytest.raises(TritonInstallError) as info:
        find_triton(environ={}, cache_root=tmp_path / "cache")
    assert "TRITONSERVER" in str(info.value)
    assert "nvidia-pytriton==0.7.0" in str(info.value)


def _fake_ngc(root: Path, stub_python: str = THIS) -> Path:
    """Lay out /opt/tritonserver like an NGC image."""
    server = _executable(root / "bin" / "tritonserver")
    python_dir = root / "backends" / "python"
    python_dir.mkdir(parents=True)
    for name in BACKEND_FILES:
        (python_dir / name).write_text("")
    (python_dir / STUB_NAME).write_bytes(
        b"\x7fELF\0libpython" + stub_python.encode() + b".so.1.0\0"
    )
    return server


def test_environment_installation(tmp_path):
    server = _fake_ngc(tmp_path / "opt" / "tritonserver")
    backends = tmp_path / "opt" / "tritonserver" / "backends"
    inst = find_triton(environ={"TRITONSERVER": str(server), "TRITON_BACKEND_DIR": str(backends)})
    assert inst.tritonserver == server
    assert inst.backend_directory == backends
    assert inst.cache_directory is None
    assert inst.source == f"TRITONSERVER={server}"


def test_environment_backend_dir_defaults_beside_bin(tmp_path):
    server = _fake_ngc(tmp_path / "opt" / "tritonserver")
    (tmp_path / "opt" / "tritonserver" / "caches").mkdir()
    inst = find_triton(environ={"TRITONSERVER": str(server)})
    assert inst.backend_directory == tmp_path / "opt" / "tritonserver" / "backends"
    assert inst.cache_directory == tmp_path / "opt" / "tritonserver" / "caches"


def test_environment_server_not_executable(tmp_path):
    with pytest.raises(TritonInstallError) as info:
        find_triton(environ={"TRITONSERVER": str(tmp_path / "nope")})
    assert str(tmp_path / "nope") in str(info.value)
    assert "TRITONSERVER" in str(info.value)


def test_environment_backend_incomplete(tmp_path):
    server = _fake_ngc(tmp_path / "t")
    (tmp_path / "t" / "backends" / "python" / STUB_NAME).unlink()
    with pytest.raises(TritonInstallError) as info:
        find_triton(environ={"TRITONSERVER": str(server)})
    assert f"missing {STUB_NAME}" in str(info.value)
    assert str(tmp_path / "t" / "backends" / "python") in str(info.value)


def test_environment_stub_for_another_python(tmp_path):
    server = _fake_ngc(tmp_path / "t", stub_python="3.9")
    with pytest.raises(
        TritonInstallError, match=rf"built for Python 3\.9, but this is Python {THIS}"
    ):
        find_triton(environ={"TRITONSERVER": str(server)})


def test_real_wheel_if_installed(tmp_path):
    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("nvidia-pytriton not installed in this environment")
    inst = find_triton(environ={}, cache_root=tmp_path / "cache")
    assert os.access(inst.tritonserver, os.X_OK)
    for name in (*BACKEND_FILES, STUB_NAME):
        assert (inst.backend_directory / "python" / name).resolve().is_file()


def test_perf_analyzer_from_environment(tmp_path):
    binary = _executable(tmp_path / "pa")
    found = find_perf_analyzer(environ={"PERF_ANALYZER": str(binary), "X": "1"})
    assert found.executable == binary
    assert found.env == {"PERF_ANALYZER": str(binary), "X": "1"}
    assert found.command("-m", "m") == [str(binary), "-m", "m"]


def test_perf_analyzer_from_venv_layout(tmp_path):
    binary = _executable(tmp_path / "venv" / "opt" / "perf_analyzer" / "bin" / "perf_analyzer")
    found = find_perf_analyzer(environ={"LD_LIBRARY_PATH": "/other"}, prefix=tmp_path / "venv")
    assert found.executable == binary
    lib = tmp_path / "venv" / "opt" / "perf_analyzer" / "lib"
    assert found.env["LD_LIBRARY_PATH"] == f"{lib}:/other"


def test_perf_analyzer_from_path(tmp_path):
    binary = _executable(tmp_path / "bin" / "perf_analyzer")
    found = find_perf_analyzer(environ={"PATH": str(tmp_path / "bin")}, prefix=tmp_path / "venv")
    assert found.executable == binary
    assert "LD_LIBRARY_PATH" not in found.env


def test_perf_analyzer_missing(tmp_path):
    with pytest.raises(TritonInstallError, match=r"perf_analyzer not found.*scripts/setup\.sh"):
        find_perf_analyzer(environ={"PATH": str(tmp_path)}, prefix=tmp_path / "venv")
