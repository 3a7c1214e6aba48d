"""Bring a served model back when one of its Python stub processes dies.

Each instance of a Python-backend model runs in a stub process of its own. When one dies
(``kill -9``, the OOM killer), Triton 2.51 does not start it again: every request routed to
that instance fails with "Stub process '<model>_<i>' is not healthy" while the model still
reports ready, and the server cannot unload it at exit. (HugeCTR's backend runs inside the
server process, so there a crash takes the whole server down instead.)

The watchdog looks at the server's stub processes twice a second; when one that served a model
is gone while the server is ready, it reloads that model through Triton's model-control API
(:func:`~hps_core.server.control.reload_model`: the versions that served, even when the
folder has not changed since they loaded, and never a newer version added to the folder and
not switched to, which may be broken): new stubs start, requests go to them as soon as
the load returns (about 2 s for the demo models on the CPU machine). The reload is marked a
*restart* (:func:`~hps_core.load_record.restart_marker`): its instances should serve what
the model's last load served, and say loudly when the files changed in place since
(``triton_backend.served_files``). A reload that fails (a model file damaged since the server
started) is logged with Triton's reason and tried again every ``retry_s``; meanwhile the
model's other instances serve. Stubs that exit because Triton ended them are not reloaded: a
switch to a new version, or a load of the same version again (``hps reload``,
:mod:`~hps_core.server.control`). Triton waits for a stub it ends at once, so such a stub is
gone from the process table, while one that died on its own stays a zombie of the server
(:func:`died_on_their_own`); and the watchdog reloads a model only while the version of the
vanished stub is still ``READY`` in Triton's repository index (a version being unloaded is
``UNLOADING``, then ``UNAVAILABLE``). This needs ``--model-control-mode=explicit
--load-model=*`` (every model loaded at start, as without model control) and the
model-repository API restricted to requests that carry a header with a token drawn per server
start (:func:`~hps_core.server.control.control_args`), so clients still cannot load or unload
models: model control stays off for them.

When the stub died during a request, Triton 2.51 never finishes unloading the old version, so
its other stubs would stay, idle, holding their memory (on GPU instances a CUDA context too)
until the server stops. The watchdog ends them with ``SIGKILL`` (a Python stub ignores
``SIGTERM``) once they are idle (:func:`idle_stubs`): ``grace_s`` after the reload returned, so
that requests the old version was still executing have finished, and with no CPU time used
between two looks, or at the latest ``max_wait_s`` after the reload (a stub whose own threads
keep working, e.g. an update consumer, is not waited for forever). Only stubs that served the
model before a reload that succeeded are ended, never while the server is not ready. Nothing is
lost: their Python-backend shared memory belongs to the server process and the host-tier
segments count their users with locks that the kernel drops. Triton does not notice: the old
version never shows in the repository index (which lists the new one ``READY``), yet it stays a
live model. Why: Triton 2.51's Python backend makes a response factory for each request it
hands a stub and deletes it when the stub answers; a request routed to a dead stub fails
without that, and each factory left holds the model version, so the version is never
destroyed, and Triton waits for (reaps) a stub only when it destroys its instance. The dead
stub and the released one therefore stay zombies, without memory, as long as the server runs
(only their parent may reap them); the server's own stop would wait its exit timeout for that
version and exit 1 ("Exit timeout expired"), so ``TritonServer.stop`` ends the server once
only such versions are left (:meth:`StubWatchdog.stranded_stubs`).

Example:
    >>> from hps_core.server.control import control_args, new_token
    >>> token = new_token()
    >>> args = control_args(token)  # tritonserver options
    >>> watchdog = StubWatchdog(server_pid, "http://127.0.0.1:8000", token)  # doctest: +SKIP
    >>> watchdog.start()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from hps_core.load_record import restart_marker
from hps_core.server.control import (
    ControlError,
    reload_model,
    server_ready,
    version_states,
)

logger = logging.getLogger("hps_core")

STUB_EXECUTABLE = "triton_python_backend_stub"

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REAP_WAIT_S = 0.2
"""How long a server gets to wait for a stub it ended before the stub counts as dead on its own."""


def stub_processes(server_pid: int) -> dict[int, str]:
    """The Python stub processes of a server: pid -> the model it serves.

    A stub is a child of the server whose command is ``triton_python_backend_stub
    <repository>/<model>/<version>/model.py ...``.

    Args:
        server_pid: the tritonserver process.

    Returns:
        One entry per stub alive now.
    """
    return {pid: model for pid, (model, _) in stub_versions(server_pid).items()}


def stub_versions(server_pid: int) -> dict[int, tuple[str, int]]:
    """The Python stub processes of a server: pid -> (model, version) it serves.

    Args:
        server_pid: the tritonserver process.

    Returns:
        One entry per stub alive now (version 0 when the folder is not a number).

    Example:
        >>> stub_versions(server.pid)  # doctest: +SKIP
        {4121: ('hps_embedding', 1), 4122: ('hps_embedding', 1)}
    """
    try:
        children = psutil.Process(server_pid).children()
    except psutil.Error:  # the server has exited
        return {}
    stubs: dict[int, tuple[str, int]] = {}
    for child in children:
        try:
            argv = child.cmdline()
        except psutil.Error:  # exited meanwhile, a zombie, or not readable
            continue
        if len(argv) > 1 and Path(argv[0]).name == STUB_EXECUTABLE:
            version_dir = Path(argv[1]).parent
            version = int(version_dir.name) if version_dir.name.isdigit() else 0
            stubs[child.pid] = (version_dir.parent.name, version)
    return stubs


def died_on_their_own(
    server_pid: int, pids: Iterable[int], wait_s: float = REAP_WAIT_S
) -> set[int]:
    """The stubs among ``pids`` that died without the server ending them.

    Triton 2.51's Python backend (its code is the same up to late 2025) waits for a stub it
    ends, on an unload or a load of the model again, right after the stub exits, and for no
    other: a stub that dies on its own (killed, crashed) stays its zombie. So a stub that is
    still the server's zombie after ``wait_s`` died on its own; one gone from the process table
    was ended by Triton.

    Args:
        server_pid: the tritonserver process.
        pids: stubs no longer running.
        wait_s: the moment Triton takes to wait for a stub it ended, looked again after.

    Returns:
        The pids that died on their own.
    """

    def zombies() -> set[int]:
        found = set()
        for pid in pids:
            try:
                process = psutil.Process(pid)
                if process.status() == psutil.STATUS_ZOMBIE and process.ppid() == server_pid:
                    found.add(pid)
            except psutil.Error:  # gone: reaped
                continue
        return found

    first = zombies()
    if not first:
        return first
    time.sleep(wait_s)
    return first & zombies()


def cpu_ticks(pid: int) -> tuple[int, int] | None:
    """Start time and CPU time of a process, in clock ticks.

    Args:
        pid: the process.

    Returns:
        ``(start, cpu)``: when the process started, in ticks after boot, and the user + system
        time it used; ``None`` once the process exited (a zombie included). A later process
        given the same pid has another start time.
    """
    try:
        process = psutil.Process(pid)
        with process.oneshot():  # one read of the kernel's figures for all three
            if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            times = process.cpu_times()
            started = process.create_time() - psutil.boot_time()
    except psutil.Error:
        return None
    # psutil gives the kernel's tick counts divided by the tick rate: rounding gives them back
    # exactly, so an idle process compares equal from one look to the next.
    return (
        round(started * _CLOCK_TICKS),
        round(times.user * _CLOCK_TICKS) + round(times.system * _CLOCK_TICKS),
    )


@dataclass
class RetiredStub:
    """A stub of a model version that a reload replaced (see :class:`StubWatchdog`)."""

    model: str
    replaced_at: float
    """``time.monotonic()`` when the reload returned."""
    start: int
    """Its start time (:func:`cpu_ticks`): tells it from a later process with the same pid."""
    cpu: int
    """Its CPU time at the previous look, in clock ticks."""


def idle_stubs(
    retired: dict[int, RetiredStub], now: float, grace_s: float, max_wait_s: float = float("inf")
) -> list[int]:
    """Look once at retired stubs: the pids of those to release now.

    A stub is released once ``grace_s`` have passed since the reload that replaced it
    (requests its version was still executing have finished) and it used no CPU time since
    the previous look, or at the latest ``max_wait_s`` after the reload: a stub whose own
    threads never pause (an update consumer fed without a break, which would also keep its
    share of the Kafka partitions from the new stub of its instance) is not waited for
    forever. Each look records the CPU time for the next one; stubs that exited (or whose pid
    another process has now) leave ``retired``.

    Args:
        retired: pid -> the stub; updated in place.
        now: ``time.monotonic()`` of this look.
        grace_s: the least time after the reload.
        max_wait_s: the most time after the reload.

    Returns:
        The pids to release, in order.

    Example:
        >>> stubs = {4122: RetiredStub("dcn", time.monotonic(), *cpu_ticks(4122))}  # doctest: +SKIP
        >>> idle_stubs(stubs, time.monotonic() + 5, grace_s=5)  # doctest: +SKIP
        [4122]
    """
    idle = []
    for pid, stub in list(retired.items()):
        ticks = cpu_ticks(pid)
        if ticks is None or ticks[0] != stub.start:
            del retired[pid]
            continue
        waited = now - stub.replaced_at
        if waited >= max_wait_s or (waited >= grace_s and ticks[1] == stub.cpu):
            idle.append(pid)
        stub.cpu = ticks[1]
    return sorted(idle)


class StubWatchdog:
    """Reloads a model when one of its stub processes dies (see the module docstring).

    Args:
        server_pid: the tritonserver process, started with :func:`control_args`.
        http_url: its HTTP endpoint, e.g. ``http://127.0.0.1:8000``.
        token: the token given to :func:`control_args`.
        interval_s: seconds between two looks at the stub processes.
        grace_s: seconds after a reload before the old version's stubs may be released.
        max_wait_s: seconds after a reload after which they are released even if busy.
        retry_s: seconds between two attempts of a reload that failed (a model file damaged
            since the server started: the reload succeeds once it is mended).
    """

    def __init__(
        self,
        server_pid: int,
        http_url: str,
        token: str,
        interval_s: float = 0.5,
        grace_s: float = 5.0,
        max_wait_s: float = 30.0,
        retry_s: float = 10.0,
    ) -> None:
        self.server_pid = server_pid
        self.http_url = http_url.rstrip("/")
        self._token = token
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.max_wait_s = max_wait_s
        self.retry_s = retry_s
        self.reloads: list[str] = []
        """Models reloaded so far, in order."""
        self.released: list[int] = []
        """Stubs of replaced versions ended so far (pids), in order."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The watchdog thread's own state.
        self._retired: set[int] = set()  # stubs of an old version, expected to exit
        # Those of a reload that succeeded: Triton may never end them, the watchdog does when idle.
        self._releasing: dict[int, RetiredStub] = {}
        self._due: dict[str, float] = {}  # model -> time.monotonic() of its next reload attempt
        self._failures: dict[str, str] = {}  # model -> why its last reload failed
        # Stubs of a model version one of whose stubs died: Triton may never end them.
        self._stranded: set[int] = set()

    def start(self) -> StubWatchdog:
        """Start watching (a daemon thread); returns ``self``."""
        self._thread = threading.Thread(target=self._run, name="hps-stub-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; waits for a reload in progress. Safe to call more than once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stranded_stubs(self) -> set[int]:
        """Stubs still running that Triton may never end: those of a model version one of
        whose stubs died (the dead stub's requests keep that version loaded, see the module
        docstring), whether a reload replaced it or not.

        Returns:
            Their pids (call after :meth:`stop`; processes that exited are left out).
        """
        return {pid for pid in self._stranded if cpu_ticks(pid) is not None}

    def _run(self) -> None:
        known = stub_versions(self.server_pid)
        while not self._stop.wait(self.interval_s):
            current = stub_versions(self.server_pid)
            gone = {
                pid: served
                for pid, served in known.items()
                if pid not in current and pid not in self._retired
            }
            if gone:  # those Triton ended (an unload, a load again) are not to be brought back
                dead = died_on_their_own(self.server_pid, gone)
                gone = {pid: served for pid, served in gone.items() if pid in dead}
                self._stranded.update(
                    pid for pid, served in current.items() if served in gone.values()
                )
            if (gone or self._due) and server_ready(self.http_url):
                ready = self._ready_versions()
                self._note_lost(gone, ready)
                self._reload_due(current, ready)
                current = stub_versions(self.server_pid)
            self._retired &= set(current)
            self._stranded &= set(current)
            known = current
            if self._releasing:
                self._release(self._releasing)

    def _note_lost(
        self, gone: dict[int, tuple[str, int]], ready: set[tuple[str, int]] | None
    ) -> None:
        """Make the models of stubs that vanished while their version serves due for a reload."""
        # A stub of a version that is no longer READY exited because Triton unloaded that
        # version (a switch to a new one): nothing to bring back.
        lost = {m for m, v in gone.values() if ready is None or (m, v) in ready}
        for model in sorted(lost):
            dead = sorted(p for p, (m, _) in gone.items() if m == model)
            logger.warning(
                "model '%s': stub process %s exited; reloading the model", model,
                ", ".join(map(str, dead)),
            )  # fmt: skip
            self._due[model] = 0.0

    def _reload_due(
        self, current: dict[int, tuple[str, int]], ready: set[tuple[str, int]] | None
    ) -> None:
        """Reload the models whose time has come; a failed reload is tried again later."""
        now = time.monotonic()
        for model in sorted(m for m, at in self._due.items() if at <= now):
            if ready is not None and not any(m == model for m, _ in ready):
                del self._due[model]  # unloaded meanwhile: nothing left to bring back
                continue
            old = [p for p, (m, _) in current.items() if m == model]
            serving = sorted(v for m, v in ready or () if m == model)
            failure = self._reload(model, serving)
            if failure is None:
                del self._due[model]
                self._failures.pop(model, None)
                self._retired.update(old)
                self._stranded.update(old)
                replaced_at = time.monotonic()
                for pid in old:
                    if (ticks := cpu_ticks(pid)) is not None:
                        self._releasing[pid] = RetiredStub(model, replaced_at, *ticks)
                continue
            self._due[model] = time.monotonic() + self.retry_s
            if self._failures.get(model) != failure:  # said once, not every retry_s
                logger.error(
                    "model '%s': reload after a stub exit failed: %s. Its other instances keep "
                    "serving; requests routed to the dead one fail until a reload succeeds, "
                    "tried again every %.0f s",
                    model, failure, self.retry_s,
                )  # fmt: skip
            self._failures[model] = failure

    def _release(self, releasing: dict[int, RetiredStub]) -> None:
        """End the idle stubs of ``releasing`` (they leave it), unless the server is stopping."""
        idle = idle_stubs(releasing, time.monotonic(), self.grace_s, self.max_wait_s)
        # While the server shuts down, Triton ends its stubs itself.
        if not idle or not server_ready(self.http_url):
            return
        for pid in idle:
            stub = releasing.pop(pid)
            try:
                # SIGKILL: the Python stub ignores SIGTERM and SIGINT.
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # exited meanwhile
            self.released.append(pid)
            logger.warning(
                "model '%s': released stub process %d of the replaced version (idle, %.1f s "
                "after the reload)",
                stub.model, pid, time.monotonic() - stub.replaced_at,
            )  # fmt: skip

    def _ready_versions(self) -> set[tuple[str, int]] | None:
        """(model, version) pairs Triton reports READY; ``None`` if the index is unreadable."""
        try:
            states = version_states(self.http_url, self._token, timeout=5)
        except ControlError:
            return None
        return {(s.model, s.version) for s in states if s.state == "READY"}

    def _reload(self, model: str, versions: list[int]) -> str | None:
        """Load ``model``'s serving ``versions`` again (all its policy's where none are known:
        :func:`~hps_core.server.control.reload_model`): ``None`` once Triton reports success,
        else its reason."""
        try:
            seconds = reload_model(
                self.http_url, self._token, model, restart_marker(len(self.reloads) + 1), versions
            )
        except ControlError as exc:
            return str(exc)
        self.reloads.append(model)
        logger.warning("model '%s': reloaded in %.1f s after a stub exit", model, seconds)
        return None
