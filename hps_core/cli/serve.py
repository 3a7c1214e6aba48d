"""``hps serve``: run tritonserver in the foreground on this project's model repository.

Model control stays with the operator: Triton runs in explicit mode with the model-repository
API restricted to a token, which ``hps serve`` writes to a control file only this user can
read (:mod:`hps_core.server.control`), so ``hps reload MODEL`` can switch a model to a new
version and ``hps models`` can list the repository's models, while clients cannot load or
unload anything (they list the models that serve through Triton's statistics API). Passing
model-control options to tritonserver after ``--`` hands model control to the user instead
(no watchdog, no reload).

Example:
    hps serve --http-port 8000 -- --model-control-mode=explicit --load-model=dlrm
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from hps_core.arrays import first_gpu
from hps_core.cli.shm_space import check_repository_fits
from hps_core.errors import HPSError, SharedMemoryFullError
from hps_core.hugectr_repo import hugectr_models, split_backend_configs, user_paths
from hps_core.hugectr_watch import TranslationWatch
from hps_core.server.control import (
    CONTROL_OPTIONS,
    ControlError,
    ControlInfo,
    load_model,
    remove_control_file,
    without_frames,
    write_control_file,
)
from hps_core.server.process import (
    DEFAULT_EXIT_TIMEOUT_S,
    SERVICES,
    ModelState,
    ServerError,
    ServerStartError,
    TritonServer,
    busy_ports_message,
)
from hps_core.tiers.shm_segment import DEV_SHM, folder_space, remove_stale_segments, shm_dir
from hps_core.wording import plural

# The repository root when this package is used from a checkout (editable install).
_CHECKOUT_ROOT = Path(__file__).resolve().parents[2]


class _StopRequested(Exception):
    """Raised from the SIGINT/SIGTERM handler to leave the wait loop."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` subcommand.

    Args:
        subparsers: the ``hps`` command's subparsers.
    """
    parser = subparsers.add_parser(
        "serve",
        help="run tritonserver in the foreground",
        description=(
            "Run Triton Inference Server on a model repository until Ctrl+C or SIGTERM. "
            "Options after `--` go to tritonserver unchanged. At shutdown Triton waits "
            f"--exit-timeout-secs={DEFAULT_EXIT_TIMEOUT_S} for in-flight requests, open HTTP "
            "connections and model unloading; pass `-- --exit-timeout-secs=N` to change it."
        ),
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        metavar="DIR",
        help="model repository (default: model_repository/ of the checkout, else of the "
        "current directory)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address every endpoint binds to (default %(default)s)"
    )
    for service, port in zip(SERVICES, (8000, 8001, 8002), strict=True):
        parser.add_argument(
            f"--{service}-port",
            type=int,
            default=port,
            metavar="PORT",
            help="(default %(default)s; 0 picks a free port)",
        )
    parser.add_argument(
        "--log-verbose", type=int, default=0, metavar="N", help="tritonserver verbose level"
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up if not ready by then (default: wait while the server runs)",
    )
    parser.add_argument(
        "--no-stub-watchdog",
        dest="stub_watchdog",
        action="store_false",
        help="do not reload a model whose Python stub process died (the watchdog is on by "
        "default, and off when model-control options are passed to tritonserver)",
    )
    parser.add_argument(
        "--rebuild-host-tiers",
        action="store_true",
        help="build every table's host tier again from its files instead of re-attaching the "
        "copy an earlier run kept in shared memory (it is re-attached only while its files keep "
        "their size, modification time and inode)",
    )
    parser.add_argument(
        "--no-keep-host-tiers",
        dest="keep_host_tiers",
        action="store_false",
        help="at the stop, remove the host tiers from shared memory (by default they stay, so "
        "that a restart with the same files does not read them again)",
    )
    parser.add_argument(
        "--strict-models",
        action="store_true",
        help="exit when a model fails to load (by default that model is unavailable, with its "
        "error printed, and the others serve)",
    )
    parser.add_argument(
        "tritonserver_args",
        nargs=argparse.REMAINDER,
        metavar="TRITONSERVER_ARGS",
        help="extra tritonserver options, after `--`",
    )
    parser.set_defaults(func=run)


def default_model_repository(cwd: Path | None = None) -> Path:
    """Return the repository served when ``--model-repository`` is not given.

    Args:
        cwd: the current directory; ``Path.cwd()`` when ``None``.

    Returns:
        ``model_repository/`` at the checkout root if it exists, else under ``cwd``.
    """
    checkout_repo = _CHECKOUT_ROOT / "model_repository"
    if (_CHECKOUT_ROOT / "pyproject.toml").is_file() and checkout_repo.is_dir():
        return checkout_repo
    return (cwd or Path.cwd()) / "model_repository"


def run(args: argparse.Namespace) -> int:
    """Serve until the server exits or a stop signal arrives.

    Args:
        args: parsed ``hps serve`` arguments.

    Returns:
        The server's exit code (128 + N when it died of signal N).
    """
    extra = list(args.tritonserver_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    extra = take_tritonserver_options(args, extra)
    user_repository = Path(args.model_repository or default_model_repository())
    with contextlib.ExitStack() as stack:
        repository, extra, translation = _serve_hugectr_models(user_repository, extra, stack)
        return _serve(args, repository, extra, translation, user_repository)


# tritonserver options a HugeCTR user's command line carries that hps serve owns: taken as the
# hps serve option of that name (the one after `--` wins, as on a command line).
_OWN_OPTIONS = {
    "--model-repository": "model_repository",
    "--model-store": "model_repository",
    "--http-port": "http_port",
    "--grpc-port": "grpc_port",
    "--metrics-port": "metrics_port",
    "--log-verbose": "log_verbose",
}


def take_tritonserver_options(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """Take from the tritonserver options after ``--`` those ``hps serve`` owns, as a HugeCTR
    user's ``tritonserver`` command line passes them: ``--model-repository`` (one), the ports
    and ``--log-verbose`` set the ``hps serve`` options; ``--backend-directory`` (HugeCTR's
    samples name its backends' folder) is dropped, as the Python backend's is this project's.

    Args:
        args: ``hps serve``'s parsed options (updated).
        extra: the options after ``--``.

    Returns:
        The options left for tritonserver.

    Raises:
        HPSError: a second model repository, or an option without its value.
    """
    rest: list[str] = []
    i = 0
    while i < len(extra):
        name, eq, value = extra[i].partition("=")
        known = name in _OWN_OPTIONS or name == "--backend-directory"
        if not known:
            rest.append(extra[i])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(extra):
                raise HPSError(f"tritonserver option {name} needs a value")
            value = extra[i + 1]
            i += 1
        i += 1
        if name == "--backend-directory":
            print(f"hps serve: {name}={value} dropped: hps serve runs hps-triton's Python "
                  "backend from its own folder (HugeCTR's backends are not needed)",
                  file=sys.stderr, flush=True)  # fmt: skip
            continue
        field = _OWN_OPTIONS[name]
        if field == "model_repository":
            given = args.model_repository
            if given is not None and Path(given).resolve() != Path(value).resolve():
                raise HPSError(
                    f"two model repositories: --model-repository {given} and {name}={value} "
                    "after --; hps serve serves one"
                )
            args.model_repository = Path(value)
        else:
            try:
                setattr(args, field, int(value))
            except ValueError:
                raise HPSError(f"tritonserver option {name}: '{value}' is not an integer") from None
    return rest


def _serve_hugectr_models(
    repository: Path, extra: list[str], stack: contextlib.ExitStack
) -> tuple[Path, list[str], Path | None]:
    """The repository to serve, the tritonserver options and the translation's folder (or
    None): a repository with models of HugeCTR's ``hps``/``hugectr`` backends is served
    through a translation of it in a temporary folder (:mod:`hps_core.hugectr_repo`, kept in
    step by :mod:`hps_core.hugectr_watch`; removed when serving ends), their ps.json taken
    from ``--backend-config=<backend>,ps=PS``; other repositories as they are."""
    ps_files, extra = split_backend_configs(extra)
    if not repository.is_dir() or not hugectr_models(repository):
        return repository, extra, None
    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hps-hugectr-repo-")))
    watch = TranslationWatch(repository, ps_files, out, gpu=first_gpu() is not None)
    notes = watch.translate_all()
    print(f"hps serve: {repository} has models of HugeCTR's backends; serving them through "
          "hps-triton's Python backend from a translation in a temporary folder (yours is "
          "untouched, and changes to it are translated as they come)", flush=True)  # fmt: skip
    for note in notes:
        _say(note)
    watch.start(_say)
    stack.callback(watch.stop)
    return out / "repo", extra, out


def _say(line: str) -> None:
    print(f"hps serve: {line}", file=sys.stderr, flush=True)


def _serve(
    args: argparse.Namespace,
    repository: Path,
    extra: list[str],
    translation: Path | None,
    user_repository: Path,
) -> int:
    """Serve ``repository`` (the translation of ``user_repository`` in ``translation``, or
    ``user_repository`` itself); what is printed names the user's files."""

    def shown(text: str) -> str:
        return text if translation is None else user_paths(text, translation, user_repository)

    # A user who controls models (explicit mode, restricted APIs) keeps that control.
    own_control = any(a.startswith(CONTROL_OPTIONS) for a in extra)
    watchdog = args.stub_watchdog and not own_control
    server = TritonServer(
        model_repository=repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        log_verbose=args.log_verbose,
        extra_args=extra,
        log_to_stdout=True,
        startup_timeout_s=args.startup_timeout,
        # Host-tier segments whose users all died with the server (kill -9) go now, not at
        # the next start.
        on_stopped=[lambda _: remove_stale_segments()],
        stub_watchdog=watchdog,
        strict_models=args.strict_models,
        model_control=not own_control,
        keep_host_tiers=args.keep_host_tiers,
    )
    check_ports_free(server)
    # Models a user loads through their own model control may be fewer than the repository's.
    fits = check_repository_fits(
        repository, extra, refuse=not own_control, rebuild=args.rebuild_host_tiers
    )
    for warning in fits:
        _say(warning)
    control_file = None
    nothing_serves = False
    with _stop_signals_raise():
        try:
            server.start()
            control_file = _publish_control(server, translation)
            try:
                states = server.model_states()
            except ServerError as exc:  # the user's own model control may close it to us
                print(
                    f"hps serve: cannot list the models' states, so cannot tell whether any "
                    f"serves: {exc}",
                    file=sys.stderr,
                )
            else:
                states = {**states, **refused_models(server, states)}
                report_unavailable_models(states, shown)
                stop_reason = _nothing_serves(states, user_repository, own_control)
                if stop_reason:
                    nothing_serves = True
                    print(f"hps serve: {stop_reason}; stopping the server", file=sys.stderr)
                    raise _StopRequested
            print(
                f"hps serve: ready on HTTP {server.http_url}, gRPC {server.grpc_url}, "
                f"metrics {server.metrics_url} (Ctrl+C stops)",
                flush=True,
            )
            server.wait()
        except _StopRequested:
            pass
        except ServerStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
        finally:
            # A second signal would interrupt the orderly stop; stop() has its own deadline.
            _ignore_stop_signals()
            if control_file is not None:
                remove_control_file(control_file, os.getpid())
            code = server.stop()
    if code is None or nothing_serves:  # never launched, or served nothing
        return 1
    return 128 - code if code < 0 else code


def _nothing_serves(
    states: Mapping[str, ModelState], repository: Path, own_control: bool
) -> str | None:
    """Why the server serves nothing and should stop, or None when a model is ready (or the
    user, holding model control, may load models into an empty repository later)."""
    if any(state.ready for state in states.values()):
        return None
    if states:
        return f"none of the {plural(len(states), 'model')} loaded"
    if own_control:
        print(
            f"hps serve: the repository {repository} holds no model; load models through the "
            "repository API",
            file=sys.stderr,
        )
        return None
    return f"the repository {repository} holds no model (a folder with a config.pbtxt each)"


def _publish_control(server: TritonServer, translation: Path | None) -> os.PathLike[str] | None:
    """Write the control file ``hps reload`` reads; ``None`` without model control."""
    if not server.controls_models:
        return None
    info = ControlInfo(
        os.getpid(),
        server.http_url,
        server.control_token,
        None if translation is None else str(translation),
        str(Path(server.model_repository).resolve()),
    )
    try:
        return write_control_file(server.ports.http, info)
    except (ControlError, OSError) as exc:  # serving matters more than reloading
        print(f"hps serve: hps reload will not reach this server: {exc}", file=sys.stderr)
        return None


# Triton's reason for a model whose stub process died while it loaded: a signal, no error.
_STUB_DIED = "is not healthy"


def refused_models(server: TritonServer, states: Mapping[str, ModelState]) -> dict[str, ModelState]:
    """The models of the server's repository that Triton refused before reading a version
    (a version policy that names no version folder, a config it cannot use), each with
    Triton's own load error, which only its log says otherwise: the answer to a request to
    load it again. Triton's index leaves such a model out once it tried to load it; while this
    process holds model control (every model loaded at start) a model it lists with no state
    was refused too, while the user holds it such a model is one the user did not load.

    Args:
        server: the running server.
        states: its models (:meth:`TritonServer.model_states`).

    Returns:
        Model name -> ``UNAVAILABLE`` and Triton's load error, for each such model that still
        fails to load (one that loads now is left out); outside explicit model control,
        where Triton takes no load request, a reason saying that its log has the error.
    """
    token = server.control_token if server.controls_models else ""
    args = list(server.extra_args)
    explicit = server.controls_models or any(
        a == "--model-control-mode=explicit" or args[i : i + 2] == [a, "explicit"]
        for i, a in enumerate(args)
        if a.startswith("--model-control-mode")
    )
    folders = sorted(p.parent.name for p in Path(server.model_repository).glob("*/config.pbtxt"))
    refused = {}
    for name in folders:
        if name in states and (states[name].state or not server.controls_models):
            continue
        if not explicit:  # Triton takes no load request: its log alone says why
            refused[name] = ModelState("UNAVAILABLE", _REFUSED)
            continue
        try:
            load_model(server.http_url, token, name, timeout=60.0)
        except ControlError as exc:
            reason = str(exc).partition(": Triton answered ")[2].partition(": ")[2]
            refused[name] = ModelState("UNAVAILABLE", reason or str(exc))
    return refused


_REFUSED = (
    "Triton refused it before loading a version (a version_policy naming no version folder, "
    "or a config it cannot use): its log above says why"
)


def report_unavailable_models(
    states: Mapping[str, ModelState], shown: Callable[[str], str] | None = None
) -> list[str]:
    """Print, for each model that did not load, its name and Triton's reason (stderr), and
    what to do: fix the files, give the server more shared memory, or look for what killed
    a stub (a reason from Triton alone).

    Args:
        states: the server's models (:meth:`TritonServer.model_states`).
        shown: rewrites a reason to name the user's files (those of the HugeCTR repository
            a translation serves, :func:`hps_core.hugectr_repo.user_paths`).

    Returns:
        The lines printed (none when every model is ready).
    """
    lines = []
    reasons = []
    ready = sum(state.ready for state in states.values())
    for name, state in sorted(states.items()):
        if not state.ready:
            reason = " ".join(without_frames(state.reason).split()) or "no reason given"
            reason = reason if shown is None else shown(reason)
            reasons.append(reason)
            lines.append(f"hps serve: model '{name}' is {state.state or 'not loaded'}: {reason}")
    if lines:
        lines.append(
            f"hps serve: {ready} of {plural(len(states), 'model')} serve; {_advice(reasons)}"
        )
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


def _advice(reasons: list[str]) -> str:
    """What to do about the reasons models did not load, by what kind of reason they are."""
    advice = []
    if any(SharedMemoryFullError.__name__ in reason for reason in reasons):
        advice.append("give the server the shared memory its error above says and restart")
    if any(_STUB_DIED in reason for reason in reasons):
        space = []
        for folder in dict.fromkeys((DEV_SHM, shm_dir())):
            free, total = folder_space(folder)
            space.append(f"{folder}: {free / 2**20:.1f} MiB free of {total / 2**20:.1f} MiB")
        advice.append(
            "a stub process died while its model loaded, killed by a signal: the OOM killer's, "
            f"or SIGBUS when shared memory ran out (now {'; '.join(space)}); the server log "
            "above says which, restart once that is mended"
        )
    if any(
        SharedMemoryFullError.__name__ not in reason and _STUB_DIED not in reason
        for reason in reasons
    ):
        advice.append(
            "fix the files and restart (or load the model through the repository API when "
            "model control is yours)"
        )
    return "; ".join(advice)


def check_ports_free(server: TritonServer) -> None:
    """Fail before Triton starts if one of its ports is taken (a second ``hps serve``, say).

    Triton binds its ports only after loading every model, which can take minutes, and
    then exits with ``Socket '127.0.0.1:8001' already in use``.

    Args:
        server: the server about to start.

    Raises:
        ServerError: one line per port in use, naming it and the flag that changes it.
    """
    busy = server.busy_ports()
    if busy:
        flags = {name: f"--{name}-port PORT" for name in busy}
        raise ServerError(busy_ports_message(busy, server.host, flags))


@contextmanager
def _stop_signals_raise() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _StopRequested(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
