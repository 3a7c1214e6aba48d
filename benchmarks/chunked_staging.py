"""Where a large host batch's time goes on the GPU pipeline, with and without chunks.

A host batch with many keys (DLRM-v2: 214 keys per sample, 28 MB at 16,384 samples) runs as
chunks of samples on two lanes of buckets, the host staging chunk ``i + 1`` while the GPU
scores chunk ``i`` (``GpuRankingPipeline._predict_chunks``). This script times, in
one run on one model: the host's copy of the key matrix into pinned and into pageable memory,
``predict`` with the default chunks, without chunks, with smaller and larger chunks, without
staging threads and with threads handed smaller or larger pieces (medians of ``--runs`` calls
over 4 batches); then a timeline of three
chunked ``predict`` calls (when each chunk's staging, launch and wait began and ended, ms
from the call's start); then one chunk's GPU time (CUDA events) and its staging. Prints it
all and writes ``chunked_staging.csv`` (the settings' medians) under ``--out``.

Usage:
    python benchmarks/chunked_staging.py --ps-json /tmp/d2/ps.json --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import time
import types
from pathlib import Path

import cupy
import numpy as np
from ranking_vs_pytorch import make_batch, variant

from hps_core.config import load_ps_config
from hps_core.infer import RankingSession, load_ranking_graph
from hps_core.infer.gpu import chunks, uploads

_NO_THREADS = {"_THREADED_STAGING_BYTES": 1 << 62}
_ONE_PIECE = {"_STAGING_PIECE_BYTES": 1 << 62}
SETTINGS = {
    "chunks (default)": {},
    "no chunks": {"_CHUNKED_KEY_BYTES": 1 << 62},
    "chunks, no staging threads": _NO_THREADS,
    "chunks, pieces of 1 MB": {"_STAGING_PIECE_BYTES": 1 << 20},
    "chunks, one piece": _ONE_PIECE,
    "chunks, one piece, 8 threads": {**_ONE_PIECE, "_STAGING_THREADS": 8},
    "chunks, one piece, 2 threads": {**_ONE_PIECE, "_STAGING_THREADS": 2},
    "chunks of 2,048+, no threads": {
        "_MIN_CHUNK_SAMPLES": 2048,
        "_CHUNK_KEY_BYTES": 1,
        **_NO_THREADS,
    },
    "chunks of 2,048+, one piece": {
        "_MIN_CHUNK_SAMPLES": 2048,
        "_CHUNK_KEY_BYTES": 1,
        **_ONE_PIECE,
    },
    "chunks of 8,192+, no threads": {"_MIN_CHUNK_SAMPLES": 8192, **_NO_THREADS},
    "chunks of 8,192+, one piece": {"_MIN_CHUNK_SAMPLES": 8192, **_ONE_PIECE},
}
"""Settings of :mod:`hps_core.infer.gpu.chunks` and
:mod:`hps_core.infer.gpu.uploads` (the staging threads) timed against each other."""


def holder(setting: str) -> types.ModuleType:
    """The module whose constant ``setting`` is."""
    return uploads if hasattr(uploads, setting) else chunks


class _TimedEvent:
    """A CUDA event whose host waits are logged."""

    def __init__(self, event, log: list) -> None:
        self.event, self.log = event, log

    def record(self, stream) -> None:
        self.event.record(stream)

    def synchronize(self) -> None:
        started = time.perf_counter()
        self.event.synchronize()
        self.log.append(("wait", started, time.perf_counter()))


def median_ms(fn, batches, runs: int) -> float:
    times = []
    for i in range(runs):
        started = time.perf_counter()
        fn(batches[i % len(batches)])
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--cache", default="static", help="static or a gpucacheper")
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--precision", default="tf32")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ps = variant(args.ps_json, args.cache)
    config = load_ps_config(ps).models[0]
    rows = [(t.sparse_file / "key").stat().st_size // 8 for t in config.tables]
    _, layout = load_ranking_graph(config)
    session = RankingSession.open(ps, config.name, device_id=0, precision=args.precision)
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, rows, args.batch, 1.05, layout)[2] for _ in range(4)]
    pipe = session.pipeline
    for batch in batches * 2:
        session.predict(batch)

    keys = batches[0].sample_keys
    pinned_memory = cupy.cuda.alloc_pinned_memory(keys.nbytes)
    pinned = np.frombuffer(pinned_memory, keys.dtype, keys.size).reshape(keys.shape)
    for label, target in (("pinned", pinned), ("pageable", np.empty_like(keys))):
        times = []
        for _ in range(8):
            started = time.perf_counter()
            target[...] = keys
            times.append(time.perf_counter() - started)
        print(f"copy of the {keys.nbytes / 1e6:.0f} MB key matrix into {label} memory: "
              f"{1e3 * statistics.median(times):.2f} ms")  # fmt: skip
    print(f"samples per chunk: {pipe._chunk_samples(batches[0])}")

    results = []
    for label, settings in SETTINGS.items():
        saved = {k: getattr(holder(k), k) for k in settings}
        for key, value in settings.items():
            setattr(holder(key), key, value)
        pipe._uploader.close()  # its thread count is read when it starts threads
        for batch in batches:
            session.predict(batch)
        ms = median_ms(session.predict, batches, args.runs)
        results.append({"setting": label, "batch": args.batch, "predict_ms": ms})
        print(f"{label}: predict {ms:.3f} ms (median of {args.runs})")
        for key, value in saved.items():
            setattr(holder(key), key, value)

    log: list[tuple[str, float, float]] = []
    stage, run = pipe._uploader.stage_and_upload, pipe._run

    def timed_stage(bucket, part, **k) -> None:
        started = time.perf_counter()
        stage(bucket, part, **k)
        log.append(("stage", started, time.perf_counter()))

    def timed_run(bucket, *a, **k) -> None:
        started = time.perf_counter()
        run(bucket, *a, **k)
        log.append(("launch", started, time.perf_counter()))

    pipe._uploader.stage_and_upload, pipe._run = timed_stage, timed_run
    pipe._chunk_done = [_TimedEvent(e, log) for e in pipe._chunk_done]
    for batch in batches[:3]:
        log.clear()
        cupy.cuda.Device().synchronize()
        started = time.perf_counter()
        session.predict(batch)
        total = 1e3 * (time.perf_counter() - started)
        steps = "; ".join(
            f"{name} {1e3 * (a - started):.2f}-{1e3 * (b - started):.2f}" for name, a, b in log
        )
        print(f"predict {total:.3f} ms: {steps}")
    pipe._uploader.stage_and_upload, pipe._run = stage, run

    chunk = pipe._chunk_samples(batches[0])
    if chunk is not None:
        bucket = pipe._buckets[chunk]
        part = batches[0].sample_range(0, chunk)
        stream, graphs = pipe._stream, bucket.graphs
        events = [cupy.cuda.Event() for _ in range(4)]
        stage(bucket, part)
        stream.synchronize()
        events[0].record(stream)
        cache = pipe._cache_stream
        with cache, pipe.bank.section():
            cache.wait_event(events[0])
            pipe._launch_lookups(bucket)
            events[1].record(cache)
        stream.wait_event(events[1])
        if graphs.prefix is not None:
            graphs.prefix.launch(stream)
        graphs.dense.launch(stream)
        events[2].record(stream)
        graphs.insert.launch(stream)
        events[3].record(stream)
        events[3].synchronize()
        lookup_ms, dense_ms, insert_ms = (
            cupy.cuda.get_elapsed_time(a, b) for a, b in itertools.pairwise(events)
        )
        started = time.perf_counter()
        stage(bucket, part)
        stream.synchronize()
        staged_ms = 1e3 * (time.perf_counter() - started)
        print(f"one chunk of {chunk}: GPU lookup {lookup_ms:.3f} ms, dense {dense_ms:.3f} ms, "
              f"insert {insert_ms:.3f} ms; staging and copy {staged_ms:.3f} ms")  # fmt: skip
    with (args.out / "chunked_staging.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)


if __name__ == "__main__":
    main()
