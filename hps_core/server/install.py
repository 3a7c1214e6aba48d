"""Where Triton Inference Server and perf_analyzer live on this machine.

Triton comes from one of two places, tried in this order:

1. ``TRITONSERVER`` in the environment (with ``TRITON_BACKEND_DIR``, or ``backends/`` beside
   the binary's ``bin/``): an existing installation such as an NGC image's
   ``/opt/tritonserver`` or the GPU machine's bundle. Its ``python/`` backend must already hold
   a stub built for the running Python.
2. The ``pytriton/tritonserver`` folder of the ``nvidia-pytriton`` wheel installed in this
   environment. The wheel ships one Python-backend stub per Python version, so a backend
   directory for the running Python is assembled from symlinks in a cache folder.

The ``pytriton`` Python package is never imported (it pins ``numpy<2``): only its files are used.

perf_analyzer comes from ``PERF_ANALYZER`` in the environment, else from the copy that
``scripts/setup.sh`` extracts into ``<venv>/opt/perf_analyzer``, else from ``PATH``.
"""

from __future__ import annotations

import ctypes.util
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hps_core.errors import HPSError

ENV_TRITONSERVER = "TRITONSERVER"
ENV_BACKEND_DIR = "TRITON_BACKEND_DIR"
ENV_PERF_ANALYZER = "PERF_ANALYZER"

STUB_NAME = "triton_python_backend_stub"
# Files of the Python backend other than the stub, as the wheel lays them out.
BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")

# Layout written by scripts/setup.sh inside the virtual environment.
PERF_ANALYZER_HOME = Path("opt") / "perf_analyzer"


class TritonInstallError(HPSError):
    """Triton (or perf_analyzer) is missing, incomplete, or unusable with this Python."""


@dataclass(frozen=True)
class TritonInstallation:
    """A Triton server binary plus a backend directory usable by the running Python.

    Args:
        tritonserver: the ``tritonserver`` executable.
        backend_directory: pass as ``--backend-directory``; holds ``python/`` with
            ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the stub.
        cache_directory: pass as ``--cache-directory`` (response-cache plugins), if present.
        stub_library_dirs: folders the stub needs on ``LD_LIBRARY_PATH`` to find this
            Python's ``libpython3.X.so``.
        source: where this installation was found, for messages.
    """

    tritonserver: Path
    backend_directory: Path
    cache_directory: Path | None
    stub_library_dirs: tuple[Path, ...]
    source: str


@dataclass(frozen=True)
class PerfAnalyzer:
    """The perf_analyzer binary and the environment it runs in.

    Args:
        executable: the binary (or a wrapper script).
        env: complete environment for the process (``LD_LIBRARY_PATH`` set for its libraries).
    """

    executable: Path
    env: Mapping[str, str]

    def command(self, *args: str) -> list[str]:
        """Build an argv for :func:`subprocess.run` (pass ``env=self.env`` as well).

        Args:
            *args: perf_analyzer options, e.g. ``"-m", "model", "-i", "grpc"``.

        Returns:
            ``[executable, *args]``.
        """
        return [str(self.executable), *args]


def python_version() -> str:
    """Return the running Python's ``major.minor``, the key of the stub folders."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def find_triton(
    environ: Mapping[str, str] | None = None, cache_root: Path | None = None
) -> TritonInstallation:
    """Locate Triton and a Python backend whose stub matches the running Python.

    Args:
        environ: environment to read ``TRITONSERVER``/``TRITON_BACKEND_DIR`` from;
            ``os.environ`` when ``None``.
        cache_root: where to assemble backend directories for the pytriton wheel;
            ``<sys.prefix>/share/hps-triton/backends`` (or a user cache folder when that is
            not writable) when ``None``.

    Returns:
        The installation to launch.

    Raises:
        TritonInstallError: nothing usable was found; the message says what to install or set.

    Example:
        >>> find_triton().tritonserver.name  # doctest: +SKIP
        'tritonserver'
    """
    environ = os.environ if environ is None else environ
    library_dirs = _python_library_dirs()
    if environ.get(ENV_TRITONSERVER):
        return _from_environment(environ, library_dirs)
    server_root = _pytriton_server_root()
    if server_root is None:
        raise TritonInstallError(
            f"Triton Inference Server not found: set {ENV_TRITONSERVER} (and {ENV_BACKEND_DIR}) "
            "to an installation, or install the server files into this environment with "
            "`pip install --no-deps nvidia-pytriton==0.7.0` (scripts/setup.sh does it)"
        )
    backend_dir = _assemble_backend_dir(server_root, cache_root or _default_cache_root())
    cache_dir = server_root / "caches"
    return TritonInstallation(
        tritonserver=_require_executable(server_root / "bin" / "tritonserver", "nvidia-pytriton"),
        backend_directory=backend_dir,
        cache_directory=cache_dir if cache_dir.is_dir() else None,
        stub_library_dirs=library_dirs,
        source=f"nvidia-pytriton wheel at {server_root}",
    )


def find_perf_analyzer(
    environ: Mapping[str, str] | None = None, prefix: Path | None = None
) -> PerfAnalyzer:
    """Locate perf_analyzer and build the environment it needs.

    Args:
        environ: environment to start from; ``os.environ`` when ``None``.
        prefix: virtual environment holding ``opt/perf_analyzer``; ``sys.prefix`` when ``None``.

    Returns:
        The binary and its environment.

    Raises:
        TritonInstallError: no perf_analyzer was found.
    """
    environ = dict(os.environ if environ is None else environ)
    if environ.get(ENV_PERF_ANALYZER):
        path = _require_executable(Path(environ[ENV_PERF_ANALYZER]), ENV_PERF_ANALYZER)
        return PerfAnalyzer(path, environ)
    home = Path(sys.prefix if prefix is None else prefix) / PERF_ANALYZER_HOME
    binary = home / "bin" / "perf_analyzer"
    if binary.is_file():
        # Its libb64/libcudart links must not leak into other programs: set them here only.
        environ["LD_LIBRARY_PATH"] = prepend_paths([home / "lib"], environ.get("LD_LIBRARY_PATH"))
        return PerfAnalyzer(_require_executable(binary, "scripts/setup.sh"), environ)
    found = shutil.which("perf_analyzer", path=environ.get("PATH"))
    if found:
        return PerfAnalyzer(Path(found), environ)
    raise TritonInstallError(
        f"perf_analyzer not found: set {ENV_PERF_ANALYZER}, or run scripts/setup.sh, which "
        f"extracts it into {home}"
    )


def _from_environment(
    environ: Mapping[str, str], library_dirs: tuple[Path, ...]
) -> TritonInstallation:
    server = _require_executable(Path(environ[ENV_TRITONSERVER]), ENV_TRITONSERVER)
    if environ.get(ENV_BACKEND_DIR):
        backend_dir, origin = Path(environ[ENV_BACKEND_DIR]), ENV_BACKEND_DIR
    else:
        backend_dir = server.resolve().parent.parent / "backends"
        origin = f"{ENV_BACKEND_DIR} (unset, so backends/ beside {ENV_TRITONSERVER}'s bin/)"
    python_dir = backend_dir / "python"
    missing = [n for n in (*BACKEND_FILES, STUB_NAME) if not (python_dir / n).is_file()]
    if missing:
        raise TritonInstallError(
            f"{python_dir}: Python backend incomplete, missing {', '.join(missing)} (from {origin})"
        )
    _check_stub_python(python_dir / STUB_NAME)
    cache_dir = server.resolve().parent.parent / "caches"
    return TritonInstallation(
        tritonserver=server,
        backend_directory=backend_dir,
        cache_directory=cache_dir if cache_dir.is_dir() else None,
        stub_library_dirs=library_dirs,
        source=f"{ENV_TRITONSERVER}={server}",
    )


def _pytriton_server_root() -> Path | None:
    # find_spec on a top-level name locates the package without executing its __init__.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        root = Path(location) / "tritonserver"
        if root.is_dir():
            return root
    return None


def _assemble_backend_dir(server_root: Path, cache_root: Path) -> Path:
    """Build (once) ``<cache_root>/<key>/python/`` with links to the files of this Python."""
    version = python_version()
    stubs = server_root / "python_backend_stubs"
    stub = stubs / version / STUB_NAME
    if not stub.is_file():
        available = sorted(p.parent.name for p in stubs.glob(f"*/{STUB_NAME}"))
        raise TritonInstallError(
            f"{stubs}: no Python-backend stub for Python {version} "
            f"(available: {', '.join(available) or 'none'}); run the server from one of those"
        )
    links = {name: server_root / "backends" / "python" / name for name in BACKEND_FILES}
    links[STUB_NAME] = stub
    for target in links.values():
        if not target.is_file():
            raise TritonInstallError(f"{target}: missing from the nvidia-pytriton installation")
    # Links point into the wheel, so its lib folder stays where the rpaths expect it.
    digest = hashlib.sha256(str(server_root.resolve()).encode()).hexdigest()[:12]
    backend_dir = cache_root / f"py{version}-{digest}"
    if _links_match(backend_dir / "python", links):
        return backend_dir
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{backend_dir.name}.", dir=cache_root))
    try:
        (staging / "python").mkdir()
        for name, target in links.items():
            (staging / "python" / name).symlink_to(target)
        shutil.rmtree(backend_dir, ignore_errors=True)
        try:
            staging.rename(backend_dir)
        except OSError as exc:
            # Another process assembled it at the same moment; fine if its links are ours.
            if not _links_match(backend_dir / "python", links):
                raise TritonInstallError(
                    f"{backend_dir}: could not assemble the backend directory: {exc}"
                ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return backend_dir


def _links_match(python_dir: Path, links: Mapping[str, Path]) -> bool:
    for name, target in links.items():
        link = python_dir / name
        if not link.is_symlink() or Path(os.readlink(link)) != target:
            return False
    return True


def _check_stub_python(stub: Path) -> None:
    """Refuse a stub linked against another Python: it would fail only when a model loads."""
    match = re.search(rb"libpython(\d+\.\d+)", stub.read_bytes())
    if match and match.group(1).decode() != python_version():
        raise TritonInstallError(
            f"{stub}: built for Python {match.group(1).decode()}, but this is Python "
            f"{python_version()}; create the environment with that Python"
        )


def _python_library_dirs() -> tuple[Path, ...]:
    """Folders holding this Python's shared libpython, which the stub links against."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        return (Path(libdir),)
    if ctypes.util.find_library(f"python{python_version()}"):
        return ()
    raise TritonInstallError(
        f"libpython{python_version()}.so not found; Triton's Python stub needs it "
        f"(Debian/Ubuntu: apt-get install libpython{python_version()})"
    )


def _default_cache_root() -> Path:
    preferred = Path(sys.prefix) / "share" / "hps-triton" / "backends"
    existing = next(p for p in (preferred, *preferred.parents) if p.exists())
    if os.access(existing, os.W_OK):
        return preferred
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return user_cache / "hps-triton" / "backends"


def _require_executable(path: Path, origin: str) -> Path:
    if not path.is_file() or not os.access(path, os.X_OK):
        raise TritonInstallError(f"{path}: not an executable file (from {origin})")
    return path


def prepend_paths(first: Sequence[Path], existing: str | None) -> str:
    """Put folders in front of a ``PATH``-style variable.

    Args:
        first: folders to search first, in order.
        existing: the variable's current value, if any.

    Returns:
        The new value, e.g. ``"/venv/bin:/usr/bin"``.
    """
    return os.pathsep.join([*(str(p) for p in first), *([existing] if existing else [])])
