"""Run one ``tritonserver``: start it, wait until it is ready, stop it with all its stubs.

Triton's Python backend runs each model instance in a stub process that takes its Python
environment from the first ``python3`` on ``PATH``; the launcher therefore puts this
interpreter's ``bin`` folder first. The server runs in a session (process group) of its own,
so stopping it can reach every stub, and a terminal's Ctrl+C reaches only the caller, which
then stops the server in order. A launcher that dies without stopping it (``kill -9``, the OOM
killer) takes it along: the kernel sends the server SIGTERM (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

from hps_core.cache.ipc_files import remove_cuda_event_files
from hps_core.errors import HPSError
from hps_core.load_record import LOAD_RECORDS_ENV, load_marker
from hps_core.server.control import (
    CONTROL_OPTIONS,
    HEADER,
    ControlError,
    VersionState,
    control_args,
    folder_config,
    new_token,
    reload_model,
    unload_model,
    version_states,
)
from hps_core.server.install import TritonInstallation, find_triton, prepend_paths
from hps_core.server.ports import busy_ports, listening_ports, pick_free_ports
from hps_core.server.stub_watchdog import StubWatchdog
from hps_core.tiers.shm_segment import KEEP_ENV, shm_dir
from hps_core.wording import plural

# Options the launcher sets itself; passing them in extra_args would contradict its state.
MANAGED_OPTIONS = (
    "--http-address",
    "--http-port",
    "--grpc-address",
    "--grpc-port",
    "--metrics-address",
    "--metrics-port",
    "--backend-directory",
    "--log-verbose",
    "--log-file",
)
_MANAGED_HINTS = {
    **dict.fromkeys(
        ("--http-address", "--grpc-address", "--metrics-address"),
        "give it as hps serve's --host (TritonServer.host)",
    ),
    "--log-file": "TritonServer.log_file (hps serve logs to its stdout)",
    "--backend-directory": "hps-triton's Python backend runs from its installation's folder",
}
"""What to do instead of passing a managed option, where it is not hps serve's option."""
LOG_TAIL_LINES = 40
# Triton's --exit-timeout-secs bounds the whole shutdown: in-flight requests, model unloading
# *and* idle keep-alive HTTP connections. Its own default, 30 s, makes every stop with a client
# connection still open take 30 s (and then exit with code 1).
DEFAULT_EXIT_TIMEOUT_S = 5
_PORT_ATTEMPTS = 3  # free ports picked by us can be taken by someone else before Triton binds
_POLL_S = 0.1
_GROUP_EXIT_WAIT_S = 5.0
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})
SERVICES = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}
"""The endpoints of a server, by the name of their port option, with the name users know."""
logger = logging.getLogger("hps_core")
_SHM_DIR = Path("/dev/shm")
_REGION_PREFIX = "triton_python_backend_shm_region_hps"
_REGION_OWNER = re.compile(re.escape(_REGION_PREFIX) + r"(\d+)n(\d+)p[0-9a-f]+_")
"""A region of a server launched here: the launcher's pid namespace and pid (containers that
share /dev/shm, ``--ipc=host``, see each other's regions but not each other's processes)."""
_LOAD_RECORDS_PREFIX = "hps-triton-loads-"
_LOAD_RECORDS_OWNER = re.compile(re.escape(_LOAD_RECORDS_PREFIX) + r"(\d+)n(\d+)p")
"""A server's folder of load records (:mod:`~hps_core.load_record`), named as regions."""
_LIVE_STATES = frozenset({"READY", "LOADING", "UNLOADING"})


class ServerError(HPSError):
    """``tritonserver`` could not be started as asked, or the options are invalid."""


class ServerStartError(ServerError):
    """``tritonserver`` exited or timed out before it was ready; the message holds its log tail.

    Args:
        message: what happened, with the last lines of the log.
        port_conflict: the log says one of its ports was already in use.
    """

    def __init__(self, message: str, port_conflict: bool = False) -> None:
        super().__init__(message)
        self.port_conflict = port_conflict


@dataclass(frozen=True)
class ServerPorts:
    """The TCP ports a started server listens on."""

    http: int
    grpc: int
    metrics: int


@dataclass(frozen=True)
class ModelState:
    """A model's state in a running server.

    Args:
        state: Triton's state, e.g. ``READY`` or ``UNAVAILABLE``.
        reason: why it is not ready (a load error), or empty.
    """

    state: str
    reason: str

    @property
    def ready(self) -> bool:
        """Whether the model serves."""
        return self.state == "READY"


@dataclass(eq=False)
class TritonServer:
    """One ``tritonserver`` process and its options.

    The server does not outlive its launcher: when the thread that called :meth:`start` exits,
    even by ``kill -9`` of the process, the kernel sends the server SIGTERM
    (:data:`LAUNCHER_DEATH_SIGNAL`). So start it from a thread that lives as long as the server
    should, such as the main thread.

    Args:
        model_repository: the model repository folder.
        host: address every endpoint binds to (HTTP, gRPC, metrics).
        http_port: HTTP port; 0 picks a free one.
        grpc_port: gRPC port; 0 picks a free one.
        metrics_port: Prometheus metrics port; 0 picks a free one.
        log_verbose: ``--log-verbose`` level (0 = off).
        extra_args: further ``tritonserver`` options, e.g. ``["--model-control-mode=explicit",
            "--exit-timeout-secs=5"]``; options in ``MANAGED_OPTIONS`` are refused.
        env: environment overrides for the server and its stubs; ``None`` removes a variable.
            ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` default to 1
            (one BLAS thread per instance) unless set here or in the environment.
        log_file: where stdout and stderr of the server go; a new temporary file when ``None``.
        log_to_stdout: send the log to this process's stdout instead of a file.
        startup_timeout_s: how long to wait for readiness; ``None`` waits as long as the
            process lives.
        stop_timeout_s: how long ``stop()`` lets the server shut down before killing it.
        installation: the Triton to run; found with :func:`find_triton` when ``None``.
        on_stopped: callbacks run with this server after its processes are gone (e.g. to
            release shared memory the models created).
        stub_watchdog: reload a model when one of its Python stub processes dies
            (:mod:`~hps_core.server.stub_watchdog`; Triton 2.51 does not restart it). Runs the
            server in explicit model-control mode with every model loaded at start and the
            model-repository API closed to clients.
        strict_models: exit when a model fails to load (Triton's default). ``False``: the
            model is UNAVAILABLE with its error (:meth:`model_states`) and the server starts
            with the others (``--exit-on-error=false --strict-readiness=false``), so one bad
            model file does not take every model down.
        model_control: run in explicit model-control mode with every model loaded at start
            and the model-repository API closed to clients (as ``stub_watchdog`` does, which
            implies it), so that :meth:`load_model` can switch a model to a new version.
        keep_host_tiers: at :meth:`stop`, leave the host tiers in shared memory for a restart
            whose files did not change to re-attach (:mod:`hps_core.tiers.shm_segment`);
            segments of versions unloaded while it runs are released either way.

    Example:
        >>> with TritonServer("model_repository") as server:  # doctest: +SKIP
        ...     url = server.http_url.removeprefix("http://")
        ...     client = tritonclient.http.InferenceServerClient(url)
    """

    model_repository: str | os.PathLike[str]
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    log_verbose: int = 0
    extra_args: Sequence[str] = ()
    env: Mapping[str, str | None] = field(default_factory=dict)
    log_file: str | os.PathLike[str] | None = None
    log_to_stdout: bool = False
    startup_timeout_s: float | None = 120.0
    stop_timeout_s: float = 30.0
    installation: TritonInstallation | None = None
    on_stopped: list[Callable[[TritonServer], None]] = field(default_factory=list)
    stub_watchdog: bool = False
    strict_models: bool = True
    model_control: bool = False
    keep_host_tiers: bool = False

    _watchdog: StubWatchdog | None = field(default=None, init=False, repr=False)
    _control_token: str = field(default="", init=False, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _ports: ServerPorts | None = field(default=None, init=False, repr=False)
    _log_path: Path | None = field(default=None, init=False, repr=False)
    _returncode: int | None = field(default=None, init=False, repr=False)
    _pid: int | None = field(default=None, init=False, repr=False)
    _shm_prefix: str | None = field(default=None, init=False, repr=False)
    _command: tuple[str, ...] = field(default=(), init=False, repr=False)
    _load_records: Path | None = field(default=None, init=False, repr=False)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> TritonServer:
        """Launch ``tritonserver`` and wait until it is ready.

        Ready means: ``/v2/health/ready`` answers 200 (every model loaded) and the process
        itself listens on its HTTP, gRPC and metrics ports (Triton logs "Started ..." even for
        a port it then fails to bind, and another server could answer on a stolen port).

        Returns:
            ``self``, running.

        Raises:
            ServerError: invalid options, the server is already running, or one of its
                fixed ports is in use (checked before anything is launched).
            ServerStartError: the server exited or timed out; the message ends with its log.
            TritonInstallError: Triton is not installed.
        """
        if self.is_running:
            raise ServerError(f"tritonserver already running (pid {self._pid})")
        repository = Path(self.model_repository)
        if not repository.is_dir():
            raise ServerError(f"{repository}: model repository is not a directory")
        self._check_options()
        # Triton binds its ports only after loading every model: a busy one would fail late.
        busy = self.busy_ports()
        if busy:
            fields = {name: f"TritonServer.{name}_port" for name in busy}
            raise ServerError(busy_ports_message(busy, self.host, fields))
        installation = self.installation or find_triton()
        picks_ports = 0 in (self.http_port, self.grpc_port, self.metrics_port)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._launch(installation, repository.resolve())
            try:
                self._wait_until_ready()
                if self.stub_watchdog:
                    assert self._process is not None
                    self._watchdog = StubWatchdog(
                        self._process.pid, self.http_url, self._control_token
                    ).start()
                return self
            except ServerStartError as exc:
                self.stop()
                if not (exc.port_conflict and picks_ports and attempt < _PORT_ATTEMPTS):
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def busy_ports(self) -> dict[str, int]:
        """Return the fixed ports of this server's endpoints that are already in use.

        A bind test on ``host`` (:func:`~hps_core.server.ports.busy_ports`) of the HTTP port
        and of the gRPC and metrics ports unless ``extra_args`` turn those endpoints off;
        ports left at 0 are picked free at start and never busy.

        Returns:
            Endpoint (a key of :data:`SERVICES`) -> port, for each port in use.
        """
        wanted = {"http": self.http_port}
        for name in ("grpc", "metrics"):
            if not _disabled(self.extra_args, f"--allow-{name}"):
                wanted[name] = getattr(self, f"{name}_port")
        return busy_ports(wanted, self.host)

    def stop(self) -> int | None:
        """Stop the server and every process of its group; run the ``on_stopped`` callbacks.

        Sends SIGTERM to the server (it unloads models and ends its stubs), waits up to
        ``stop_timeout_s``, then SIGKILLs whatever is left in its process group. Safe to call
        more than once.

        After a stub died under load, Triton 2.51 keeps that model version loaded for good
        (:mod:`~hps_core.server.stub_watchdog` says why), and its own shutdown would wait its
        exit timeout for it and exit 1 ("Exit timeout expired"). With model control, such a
        server is stopped by unloading every model through the control API instead, each
        instance finalised as on a shutdown; once only those versions are left, the server
        is ended (:meth:`_stop_stranded`) and 0 is returned.

        Returns:
            The server's exit code (negative: killed by that signal; 0 also when it was ended
            after every model it could unload was unloaded); ``None`` if never started.
        """
        keep_marker = self._keep_marker() if self.keep_host_tiers else None
        if keep_marker is not None and self._process is not None:
            keep_marker.touch()  # the stubs about to exit keep their host tiers while it is
        stranded: set[int] = set()
        if self._watchdog is not None:  # first: the stubs are about to exit on purpose
            self._watchdog.stop()
            stranded = self._watchdog.stranded_stubs()
            self._watchdog = None
        proc = self._process
        if proc is None:
            return self._returncode
        members = _group_members(proc.pid)
        ended = False
        try:
            if proc.poll() is None:
                ended = self._stop_stranded(proc, stranded)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=self.stop_timeout_s)
        finally:
            _kill_group(proc.pid)
            proc.wait()
            self._process = None
            self._returncode = 0 if ended else proc.returncode
            _RUNNING.discard(self)
            if self._shm_prefix:
                _remove_shared_memory(self._shm_prefix)
            if self._load_records is not None:
                shutil.rmtree(self._load_records, ignore_errors=True)
                self._load_records = None
            # Stubs that shared GPU caches and had to be killed leave CUDA's event files.
            remove_cuda_event_files(members)
            if keep_marker is not None:
                keep_marker.unlink(missing_ok=True)
            self._run_on_stopped()
        return self._returncode

    def _keep_marker(self) -> Path:
        """The file whose presence tells this server's stubs to keep their host tiers."""
        return shm_dir() / f"hps-triton-keep.{os.getpid()}.{id(self):x}"

    def _stop_stranded(self, proc: subprocess.Popen[bytes], stranded: set[int]) -> bool:
        """Stop a server that holds model versions it can never unload, without its exit
        timeout: unload every model through model control, wait until each version is
        unloaded (its instances finalised, its stubs waited for), then end the server, whose
        only work left would be to wait for those versions.

        A server holds such versions when a stub died and Triton never waited for it (a
        zombie child) or the watchdog knows stubs of a version that lost one (``stranded``).

        Args:
            proc: the running server.
            stranded: :meth:`StubWatchdog.stranded_stubs`.

        Returns:
            Whether the server was ended here; ``False`` leaves it to the ordinary stop.
        """
        if not self.controls_models or not (stranded or _zombie_children(proc.pid)):
            return False
        deadline = time.monotonic() + _exit_timeout(self.extra_args)
        try:
            for state in self.version_states():
                if state.state == "READY":
                    unload_model(self.http_url, self._control_token, state.model)
            while any(s.state in _LIVE_STATES for s in self.version_states()):
                if time.monotonic() > deadline:
                    # As long as Triton's own stop would wait for it: a version still loaded
                    # (held by a dead stub, or slow to finalise) is left to that stop.
                    return False
                time.sleep(_POLL_S)
        except (ControlError, ServerError):
            return False  # the ordinary stop says what is wrong
        left = _zombie_children(proc.pid) | (stranded & set(_group_members(proc.pid)))
        if not left:
            return False  # nothing holds the server: its own stop ends in order
        logger.warning(
            "tritonserver: every model is unloaded; %s of model versions whose stub died under "
            "load remain (Triton 2.51 never unloads such a version, nor waits for its stubs: "
            "docs/RELIABILITY.md); ending it instead of letting it wait its exit timeout for "
            "them",
            plural(len(left), "stub"),
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return True

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the server process to exit on its own (call ``stop()`` afterwards).

        Args:
            timeout: seconds; ``None`` waits forever.

        Returns:
            The exit code, or ``None`` if it is still running after ``timeout``.
        """
        if self._process is None:
            return self._returncode
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- model control ---------------------------------------------------------------------

    @property
    def controls_models(self) -> bool:
        """Whether this server holds model control (``model_control`` or ``stub_watchdog``)."""
        return self.model_control or self.stub_watchdog

    @property
    def control_token(self) -> str:
        """The model-control token of the running server (a secret: never print it).

        Raises:
            ServerError: the server does not hold model control or was not started.
        """
        if not (self.controls_models and self._control_token):
            raise ServerError(
                "TritonServer: no model control (start it with model_control=True or "
                "stub_watchdog=True)"
            )
        return self._control_token

    def load_model(self, name: str, timeout: float = 600.0) -> float:
        """Load ``name`` again through the restricted model-repository API, with its folder's
        config.pbtxt (as ``hps reload`` does).

        The newest version folder of the model is loaded while the old instances serve;
        requests go to the new ones when this returns, and Triton unloads the old ones once
        their in-flight requests are answered (see :mod:`~hps_core.server.control`). The new
        instances read again the tables whose files changed, even outside the model folder.

        Args:
            name: the model.
            timeout: seconds to wait for the load.

        Returns:
            Seconds the load took.

        Raises:
            ServerError: no model control here.
            ControlError: Triton failed the load (the old version keeps serving).
            ConfigError: the model's config.pbtxt does not parse.

        Example:
            >>> seconds = server.load_model("hps_embedding")  # doctest: +SKIP
        """
        config = folder_config(Path(self.model_repository).resolve(), name)
        return reload_model(
            self.http_url, self.control_token, name, load_marker(), timeout=timeout, config=config
        )

    def version_states(self) -> list[VersionState]:
        """Every version of every model Triton has loaded or tried to, with its state.

        Returns:
            One entry per model version (``READY``, ``UNLOADING``, ``UNAVAILABLE``, ...).

        Raises:
            ServerError: no model control here.
            ControlError: the index cannot be read.
        """
        return version_states(self.http_url, self.control_token)

    # -- state -----------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id (and process-group id) of the last launch; kept after ``stop()``."""
        return self._pid

    @property
    def stub_reloads(self) -> list[str]:
        """Models the stub watchdog reloaded after a stub exit, in order (none without it)."""
        return list(self._watchdog.reloads) if self._watchdog is not None else []

    @property
    def returncode(self) -> int | None:
        """Exit code after the server ended; ``None`` while running or never started."""
        return self._process.poll() if self._process is not None else self._returncode

    @property
    def ports(self) -> ServerPorts:
        """Ports of the last start (0 options resolved to the picked ports)."""
        if self._ports is None:
            raise ServerError("tritonserver has not been started")
        return self._ports

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP endpoint, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{self._client_host()}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as tritonclient.grpc expects it."""
        return f"{self._client_host()}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        """URL of the Prometheus metrics page."""
        return f"http://{self._client_host()}:{self.ports.metrics}/metrics"

    @property
    def log_path(self) -> Path | None:
        """File holding the server's output (``None`` with ``log_to_stdout``)."""
        return self._log_path

    @property
    def command(self) -> tuple[str, ...]:
        """The argv of the last launch."""
        if not self._control_token:
            return self._command
        # The model-control token stays out of anything that prints the command.
        return tuple(arg.replace(self._control_token, "***") for arg in self._command)

    def model_states(self) -> dict[str, ModelState]:
        """Every model of the repository and its state, from Triton's repository index.

        Returns:
            Model name -> its state (``READY``, ``UNAVAILABLE``, ...) and Triton's reason
            (the load error of a model that failed to load).

        Raises:
            ServerError: the server is not running or does not answer.
        """
        headers = {"Content-Type": "application/json"}
        if self._control_token:  # the watchdog restricts the repository API to its header
            headers[HEADER] = self._control_token
        request = urllib.request.Request(
            f"{self.http_url}/v2/repository/index", data=b"{}", method="POST", headers=headers
        )
        try:
            with _NO_PROXY.open(request, timeout=10.0) as reply:
                entries = json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServerError(f"repository index of {self.http_url} failed: {exc}") from exc
        return {
            str(e["name"]): ModelState(str(e.get("state", "")), str(e.get("reason", "")))
            for e in entries
        }

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Return the last ``lines`` lines of the server log ('' when logging to stdout)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_bytes().decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- internals -------------------------------------------------------------------------

    def _check_options(self) -> None:
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ServerError(f"TritonServer.{name}: {port} is not a TCP port (0..65535)")
        if self.log_verbose < 0:
            raise ServerError(f"TritonServer.log_verbose: {self.log_verbose} is negative")
        if self.startup_timeout_s is not None and self.startup_timeout_s <= 0:
            raise ServerError(f"TritonServer.startup_timeout_s: {self.startup_timeout_s} <= 0")
        if self.stop_timeout_s < 0:
            raise ServerError(f"TritonServer.stop_timeout_s: {self.stop_timeout_s} < 0")
        if self.log_to_stdout and self.log_file is not None:
            raise ServerError("TritonServer: log_file and log_to_stdout exclude each other")
        for option in MANAGED_OPTIONS:
            if _passes(self.extra_args, option):
                field = option.lstrip("-").replace("-", "_")
                hint = f"hps serve's {option}, TritonServer.{field}"
                raise ServerError(
                    f"tritonserver option {option} is set by the launcher: "
                    + _MANAGED_HINTS.get(option, f"give it as {hint}")
                )
        if self.controls_models:
            for option in CONTROL_OPTIONS:
                if _passes(self.extra_args, option):
                    raise ServerError(
                        f"TritonServer.extra_args: {option} is set by the stub watchdog and "
                        "model_control (turn both off to control models yourself)"
                    )
        if _disabled(self.extra_args, "--allow-http"):
            raise ServerError(
                "TritonServer.extra_args: --allow-http must stay on, readiness is checked on it"
            )

    def _launch(self, installation: TritonInstallation, repository: Path) -> None:
        self._ports = self._resolve_ports()
        self._shm_prefix = None
        args = [
            str(installation.tritonserver),
            f"--model-repository={repository}",
            f"--backend-directory={installation.backend_directory}",
        ]
        if installation.cache_directory is not None:
            args.append(f"--cache-directory={installation.cache_directory}")
        for service in ("http", "grpc", "metrics"):
            args.append(f"--{service}-address={self.host}")
            args.append(f"--{service}-port={getattr(self._ports, service)}")
        args.append(f"--log-verbose={self.log_verbose}")
        if not any(arg.startswith("--exit-timeout-secs") for arg in self.extra_args):
            args.append(f"--exit-timeout-secs={DEFAULT_EXIT_TIMEOUT_S}")
        if not any("shm-region-prefix-name" in arg for arg in self.extra_args):
            # A prefix of our own names this server's shared-memory regions, so the ones a
            # killed stub leaves in /dev/shm can be removed without touching other servers'.
            # It carries the launcher's pid: regions of a launcher killed before it could
            # remove them (its tritonserver dies with it) go at the next launch.
            remove_stale_backend_regions()
            self._shm_prefix = (
                f"{_REGION_PREFIX}{_pid_namespace()}n{os.getpid()}p{secrets.token_hex(4)}_"
            )
            args.append(f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}")
        if self.controls_models:
            self._control_token = new_token()
            args.extend(control_args(self._control_token))
        if self._load_records is None:
            remove_stale_load_records()
            self._load_records = Path(
                tempfile.mkdtemp(prefix=f"{_LOAD_RECORDS_PREFIX}{_pid_namespace()}n{os.getpid()}p")
            )
        if not self.strict_models:
            for option in ("--exit-on-error", "--strict-readiness"):
                if not _passes(self.extra_args, option):
                    args.append(f"{option}=false")
        args.extend(self.extra_args)
        self._command = tuple(args)

        if self.log_to_stdout:
            self._log_path = None
            self._process = self._popen(args, installation, stdout=None)
            return
        if self.log_file is not None:
            self._log_path = Path(self.log_file)
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
        else:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        with self._log_path.open("wb") as log:
            self._process = self._popen(args, installation, stdout=log)

    def _popen(
        self, args: list[str], installation: TritonInstallation, stdout: IO[bytes] | None
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PATH"] = prepend_paths([_python_bin_dir()], env.get("PATH"))
        # Each model instance is a process of its own: instances, not BLAS threads, share the
        # cores. Several multi-threaded BLAS pools on the same cores slow small batches down
        # (measured: DLRM, 64 samples, 2 cores: 13.7 ms -> 9.5 ms per request).
        for name in _BLAS_THREAD_VARIABLES:
            env.setdefault(name, "1")
        if self._load_records is not None:  # what each model's last load read (restarts compare)
            env[LOAD_RECORDS_ENV] = str(self._load_records)
        if self.keep_host_tiers:
            env[KEEP_ENV] = str(self._keep_marker())
        if installation.stub_library_dirs:
            env["LD_LIBRARY_PATH"] = prepend_paths(
                list(installation.stub_library_dirs), env.get("LD_LIBRARY_PATH")
            )
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_exit_with_launcher(),
        )
        self._pid = process.pid
        _RUNNING.add(self)
        return process

    def _resolve_ports(self) -> ServerPorts:
        wanted = [self.http_port, self.grpc_port, self.metrics_port]
        free = iter(pick_free_ports(wanted.count(0), self.host))
        http, grpc, metrics = (port or next(free) for port in wanted)
        return ServerPorts(http=http, grpc=grpc, metrics=metrics)

    def _wait_until_ready(self) -> None:
        assert self._process is not None and self._ports is not None
        required = {self._ports.http}
        if not _disabled(self.extra_args, "--allow-grpc"):
            required.add(self._ports.grpc)
        if not _disabled(self.extra_args, "--allow-metrics"):
            required.add(self._ports.metrics)
        ready_url = f"{self.http_url}/v2/health/ready"
        timeout = self.startup_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise ServerStartError(
                    f"tritonserver exited with code {code} before it was ready"
                    + self._log_excerpt(),
                    port_conflict="already in use" in self.log_tail(lines=1000),
                )
            if _http_ok(ready_url) and required <= listening_ports(self._process.pid):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise ServerStartError(
                    f"tritonserver not ready after {timeout:g} s ({ready_url}){self._log_excerpt()}"
                )
            time.sleep(_POLL_S)

    def _log_excerpt(self) -> str:
        if self._log_path is None:
            return " (its log is above)"
        return (
            f"\n--- last {LOG_TAIL_LINES} lines of {self._log_path} ---\n"
            f"{self.log_tail(LOG_TAIL_LINES)}"
        )

    def _client_host(self) -> str:
        # A wildcard bind is reached through loopback; IPv6 literals need brackets in URLs.
        if self.host in ("", "0.0.0.0"):
            return "127.0.0.1"
        if self.host == "::":
            return "[::1]"
        return f"[{self.host}]" if ":" in self.host else self.host

    def _run_on_stopped(self) -> None:
        errors = []
        for callback in self.on_stopped:
            try:
                callback(self)
            except Exception as exc:  # every cleanup runs; the first failure is reported
                errors.append(exc)
        if errors:
            raise errors[0]


def busy_ports_message(busy: Mapping[str, int], host: str, options: Mapping[str, str]) -> str:
    """Describe ports in use, one line each, with the option that chooses another.

    Args:
        busy: endpoint (a key of :data:`SERVICES`) -> port, as
            :meth:`TritonServer.busy_ports` returns it.
        host: the address the server would bind.
        options: endpoint -> how the user sets its port, e.g. ``--http-port PORT``.

    Returns:
        The message, e.g. ``gRPC port 8001 on 127.0.0.1 is already in use (another hps serve
        or tritonserver?); choose another with --grpc-port PORT (0 picks a free one)``.
    """
    return "\n".join(
        f"{SERVICES[name]} port {port} on {host} is already in use (another hps serve or "
        f"tritonserver?); choose another with {options[name]} (0 picks a free one)"
        for name, port in busy.items()
    )


def process_group_members(pgid: int) -> list[int]:
    """Return the live (non-zombie) processes of process group ``pgid``.

    Args:
        pgid: process-group id (a started server's ``pid``).

    Returns:
        Their process ids.
    """
    members = []
    for pid in _group_members(pgid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:  # exited (and was reaped) while we looked
            continue
        except psutil.AccessDenied:  # it exists: a member still alive for all we know
            pass
        members.append(pid)
    return members


def _group_members(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` (the server and its stubs), zombies included."""
    members = []
    # psutil lists the processes but has no process-group accessor; getpgid(2) is one system
    # call per process and answers for a zombie too, until it is reaped.
    for pid in psutil.pids():
        with contextlib.suppress(OSError):  # exited meanwhile (ESRCH), or refused (EPERM)
            if os.getpgid(pid) == pgid:
                members.append(pid)
    return members


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + _GROUP_EXIT_WAIT_S
    while process_group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


# SIGTERM rather than SIGKILL: Triton then shuts down as on stop(), unloading its models (their
# stubs finalize: host-tier segments and update consumers are released) and removing its
# shared-memory regions, within --exit-timeout-secs, after which it exits anyway. SIGKILL would
# leave all of that behind; the stubs would still exit (they poll their parent's pid), unless
# the killed server lingered as a zombie under an init that does not reap. A multi-threaded
# launcher killed outright may send it twice (the kernel hands the child to each exiting thread
# in turn); Triton ignores a second SIGTERM while it shuts down.
LAUNCHER_DEATH_SIGNAL = signal.SIGTERM
"""The signal a server receives when the thread that launched it exits."""
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved once in the launcher (``None`` off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True).prctl


def _exit_with_launcher() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel signal the child when its launcher dies.

    ``start_new_session`` keeps the server out of reach of the terminal's signals and the
    ``atexit`` hook below does not run when the launcher is killed outright, so without this a
    ``kill -9`` of ``hps serve`` left ``tritonserver`` running, holding its ports.

    Caveat: the kernel's "parent" here is the *thread* that forked, not the process. If a
    server is started from a thread that then exits while the process goes on (a worker of a
    thread pool, say), the server receives the signal too. Start servers from a thread that
    lives as long as they do: ``hps serve`` and the tests start them from the main thread.

    Returns:
        The function, or ``None`` where ``prctl`` does not exist.
    """
    prctl = _prctl()  # looked up here: between fork and exec the child only makes the call
    if prctl is None:
        return None
    launcher = os.getpid()

    def set_parent_death_signal() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(LAUNCHER_DEATH_SIGNAL)) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"prctl(PR_SET_PDEATHSIG): {os.strerror(code)}")
        # The launcher may have died between fork and prctl: then no signal will ever come.
        if os.getppid() != launcher:
            os._exit(1)

    return set_parent_death_signal


def remove_stale_backend_regions(directory: Path = _SHM_DIR) -> list[str]:
    """Remove the Python backend's shared-memory regions of servers whose launcher has exited
    (launchers of this pid namespace only: another container's pids are not visible here).

    Args:
        directory: where the regions live.

    Returns:
        The names removed.
    """
    removed = []
    namespace = _pid_namespace()
    for path in sorted(directory.glob(f"{_REGION_PREFIX}*")):
        match = _REGION_OWNER.match(path.name)
        if match is None or int(match.group(1)) != namespace:
            continue  # another container's, or not ours to judge
        if not psutil.pid_exists(int(match.group(2))):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    if removed:
        logger.info(
            "removed %s of exited servers' Python backends: %s",
            plural(len(removed), "shared-memory region"),
            ", ".join(removed),
        )
    return removed


def remove_stale_load_records(directory: Path | None = None) -> list[str]:
    """Remove the load-record folders of servers whose launcher has exited (of this pid
    namespace only, as :func:`remove_stale_backend_regions`).

    Args:
        directory: where the folders live; the temporary folder by default.

    Returns:
        The names removed.
    """
    removed = []
    namespace = _pid_namespace()
    for path in sorted((directory or Path(tempfile.gettempdir())).glob(f"{_LOAD_RECORDS_PREFIX}*")):
        match = _LOAD_RECORDS_OWNER.match(path.name)
        if match is None or int(match.group(1)) != namespace:
            continue
        if not psutil.pid_exists(int(match.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def _zombie_children(pid: int) -> set[int]:
    """Children of ``pid`` that exited and that it has not waited for."""
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return set()
    found = set()
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                found.add(child.pid)
    return found


def _exit_timeout(extra_args: Sequence[str]) -> float:
    """The ``--exit-timeout-secs`` a server runs with: the user's, else the launcher's."""
    value = None
    for i, arg in enumerate(extra_args):
        if arg == "--exit-timeout-secs" and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith("--exit-timeout-secs="):
            value = arg.split("=", 1)[1]
    try:
        return float(value) if value is not None else DEFAULT_EXIT_TIMEOUT_S
    except ValueError:
        return DEFAULT_EXIT_TIMEOUT_S


def _pid_namespace() -> int:
    """This process's pid namespace (its inode), 0 where /proc does not say."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _remove_shared_memory(prefix: str) -> None:
    for region in _SHM_DIR.glob(f"{prefix}*"):
        region.unlink(missing_ok=True)


def _http_ok(url: str) -> bool:
    try:
        with _NO_PROXY.open(url, timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _passes(args: Sequence[str], option: str) -> bool:
    """Whether ``args`` set ``option`` (``--option value`` or ``--option=value``)."""
    return any(arg == option or arg.startswith(option + "=") for arg in args)


def _disabled(args: Sequence[str], option: str) -> bool:
    """Whether ``args`` turn a boolean tritonserver option off (last occurrence wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value is not None and value.strip().lower() in _FALSE_WORDS


def _python_bin_dir() -> Path:
    # The stub runs the first python3 on PATH; make it this interpreter's (the venv's).
    prefix_bin = Path(sys.prefix) / "bin"
    return prefix_bin if (prefix_bin / "python3").exists() else Path(sys.executable).parent


_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# Readiness probes go to loopback: an http_proxy in the environment must not intercept them.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# Servers still running when the interpreter exits (a crashed test run, say) are stopped,
# since their own session keeps them out of reach of the terminal's signals. (A launcher killed
# outright runs no atexit hook: the parent-death signal of _exit_with_launcher covers that.)
_RUNNING: set[TritonServer] = set()


@atexit.register
def _stop_running_servers() -> None:
    for server in list(_RUNNING):
        server.stop()
