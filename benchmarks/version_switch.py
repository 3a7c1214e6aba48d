"""A model switched to a new version in the middle of a perf_analyzer run: failures, latency.

Serves the demo ``hps_embedding`` model (``--instances`` CPU instances, or ``--kind
KIND_GPU``) as ``hps serve`` does (explicit model control restricted to a token, stub
watchdog on), starts perf_analyzer (gRPC, ``--concurrency``, Zipf inputs of
``client_examples/make_perf_input.py``) for ``--windows`` x ``--window-ms``, adds version 2
(changed rows in new sparse files, ``hps repo --version 2``) and loads it through
:meth:`TritonServer.load_model` at the middle of the run. perf_analyzer's per-request export
(``--profile-export-file``) splits the requests by send time into before / during / after the
load. Prints and writes ``version_switch_<commit>.csv`` (one row per phase: requests, failed,
throughput, p50/p99 client latency, load time, setup) to ``--out``, and checks that the old
version's stubs and host-tier segments were released and that answers equal version 2.

Usage:
    python benchmarks/version_switch.py                     # 60 s, concurrency 8, 2 CPU inst.
    python benchmarks/version_switch.py --windows 3 --window-ms 10000
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from hps_core.demo.embedding import NAME, TABLES, table_vectors, write_embedding_demo
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.install import find_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.server.stub_watchdog import stub_versions
from hps_core.tiers.host_table import segment_name
from hps_core.tiers.shm_segment import SharedSegment, remove_stale_segments
from hps_core.triton_repo import InstanceGroup, ServingOptions, write_repository

ROOT = Path(__file__).resolve().parents[1]
CHANGED = (5_000, 1_000)  # version 2 changes the first rows of each table


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def _v2_vectors(index: int) -> tuple[np.ndarray, np.ndarray]:
    keys, vectors = table_vectors(index)
    vectors = vectors.copy()
    vectors[: CHANGED[index]] += np.float32(1.0)
    return keys, vectors


def add_version_2(repo: Path, data: Path, options: ServingOptions) -> list[Path]:
    """Write version 2's sparse files under ``data`` and add version 2 to ``repo``."""
    dirs = [data / f"table{i}" for i in range(len(TABLES))]
    for i, path in enumerate(dirs):
        write_sparse_table(path, *_v2_vectors(i))
    ps = json.loads((repo / NAME / "ps.json").read_text())
    ps["models"][0]["sparse_files"] = [str(p) for p in dirs]
    (data / "ps.json").write_text(json.dumps(ps))
    write_repository(data / "ps.json", repo, options, version=2)
    return dirs


def _percentiles(latencies_us: np.ndarray) -> tuple[float, float]:
    if latencies_us.size == 0:
        return float("nan"), float("nan")
    return float(np.percentile(latencies_us, 50)), float(np.percentile(latencies_us, 99))


def _requests(export: Path) -> tuple[np.ndarray, np.ndarray]:
    """Send times (ns) and latencies (us) of every request perf_analyzer exported."""
    doc = json.loads(export.read_text())
    sent, latency = [], []
    for experiment in doc["experiments"]:
        for request in experiment["requests"]:
            if not request.get("response_timestamps"):
                continue
            sent.append(request["timestamp"])
            latency.append((request["response_timestamps"][-1] - request["timestamp"]) / 1e3)
    return np.asarray(sent, dtype=np.int64), np.asarray(latency)


def _check_v2(server: TritonServer) -> None:
    """Every changed row of the first table (and unchanged ones) answers version 2's values."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    v2 = [_v2_vectors(i) for i in range(len(TABLES))]
    for start in range(0, CHANGED[0] + 26, 26 * 20):
        keys = [np.arange(start, start + 26) % rows for rows, _ in TABLES]
        flat = np.concatenate(keys)[None, :].astype(np.int64)
        numkeys = np.array([[26, 26]], dtype=np.int32)
        inputs = [
            grpcclient.InferInput("KEYS", list(flat.shape), "INT64"),
            grpcclient.InferInput("NUMKEYS", list(numkeys.shape), "INT32"),
        ]
        inputs[0].set_data_from_numpy(flat)
        inputs[1].set_data_from_numpy(numkeys)
        got = client.infer(NAME, inputs).as_numpy("OUTPUT0")[0]
        want = np.concatenate([v2[t][1][k].reshape(-1) for t, k in enumerate(keys)])
        if not np.array_equal(got, want):
            raise SystemExit(f"answers for keys from {start} differ from version 2's files")


def served_counts(metrics_url: str) -> dict[tuple[str, str], float]:
    """Triton's request counters of the model: (``success``/``failure``, version) -> count."""
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(metrics_url) as r:
        text = r.read().decode()
    counts: dict[tuple[str, str], float] = {}
    pattern = re.compile(r"^nv_inference_request_(success|failure)\{([^}]*)\} (\S+)$", re.M)
    for kind, labels, value in pattern.findall(text):
        if f'model="{NAME}"' not in labels:
            continue
        version = re.search(r'version="(\d+)"', labels)
        key = (kind, version.group(1) if version else "?")
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def main() -> int:
    """Run the benchmark; return the exit code (1 when a request failed or was left over)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--windows", type=int, default=3, help="perf_analyzer windows")
    # perf_analyzer keeps every response for its export (1,248 floats each here): about 20 KB
    # of memory per request, so the run is kept to ~20 s (~50,000 requests).
    parser.add_argument("--window-ms", type=int, default=7000, help="length of one window")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--kind", default="KIND_CPU", choices=("KIND_CPU", "KIND_GPU"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    options = ServingOptions(instances=(InstanceGroup(args.instances, args.kind),))
    pa = find_perf_analyzer()
    total_s = args.windows * args.window_ms / 1000
    with tempfile.TemporaryDirectory(prefix="hps-version-switch-") as tmp_name:
        tmp = Path(tmp_name)
        repo = tmp / "repo"
        folder = write_embedding_demo(repo, options)
        v1_dirs = [folder / "data" / f"table{i}" for i in range(len(TABLES))]
        inputs = tmp / "perf_input.json"
        subprocess.run(
            [sys.executable, str(ROOT / "client_examples" / "make_perf_input.py"),
             "--out", str(inputs)],
            check=True, capture_output=True,
        )  # fmt: skip
        server = TritonServer(
            repo, stub_watchdog=True, model_control=True, log_file=tmp / "tritonserver.log",
            on_stopped=[lambda _: remove_stale_segments()],
        )  # fmt: skip
        with server:
            export = tmp / "export.json"
            command = pa.command(
                "-m", NAME, "-u", server.grpc_url, "-i", "grpc", "--input-data", str(inputs),
                "-b", "1", "--concurrency-range", str(args.concurrency),
                "--measurement-mode", "time_windows", "--measurement-interval",
                str(args.window_ms), "--stability-percentage", "999",
                "--max-trials", str(args.windows), "--percentile", "99",
                "--profile-export-file", str(export),
            )  # fmt: skip
            v2_dirs = add_version_2(repo, tmp / "retrained", options)
            result: dict[str, object] = {}

            def run_pa() -> None:
                done = subprocess.run(command, env=dict(pa.env), capture_output=True, text=True)
                result["rc"], result["output"] = done.returncode, done.stdout + done.stderr

            # An unloaded version's counters leave the metrics page: sample them as they grow.
            counts: dict[tuple[str, str], float] = {}
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.2):
                    for key, value in served_counts(server.metrics_url).items():
                        counts[key] = max(counts.get(key, 0.0), value)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.time_ns()
            runner = threading.Thread(target=run_pa)
            runner.start()
            time.sleep(total_s / 2)
            load_start = time.time_ns()
            load_s = server.load_model(NAME)
            load_end = time.time_ns()
            runner.join()
            ended = time.time_ns()
            output = str(result["output"])
            released = _wait(
                lambda: {v for m, v in stub_versions(server.pid).values() if m == NAME} == {2},
                30,
            )
            segments_gone = _wait(
                lambda: (
                    not any(
                        SharedSegment(segment_name(p, dim)).data_path.exists()
                        for p, (_, dim) in zip(v1_dirs, TABLES, strict=True)
                    )
                ),
                30,
            )
            v2_segments = all(
                SharedSegment(segment_name(p, dim)).data_path.exists()
                for p, (_, dim) in zip(v2_dirs, TABLES, strict=True)
            )
            sampling.set()
            sampler.join()
            _check_v2(server)
            reloads = list(server._watchdog.reloads) if server._watchdog else []
        if result["rc"] != 0 or not export.is_file():
            print(output[-3000:], file=sys.stderr)
            print(f"perf_analyzer exited with {result['rc']} (a failed request stops it)",
                  file=sys.stderr)  # fmt: skip
            return 1
        sent, latency = _requests(export)
    # perf_analyzer stops at the first failed request with a non-zero exit; Triton's own
    # counters (per version, warm-up requests included) must agree.
    failed = int(sum(v for (kind, _), v in counts.items() if kind == "failure"))
    served = {ver: int(v) for (kind, ver), v in sorted(counts.items()) if kind == "success"}
    print(f"perf_analyzer ran {(ended - started) / 1e9:.1f} s; load of version 2 started "
          f"{(load_start - started) / 1e9:.1f} s in and took {load_s:.2f} s")  # fmt: skip
    if sent.size and abs(int(sent[0]) - started) > 3600e9:
        raise SystemExit("perf_analyzer's timestamps are not wall-clock ns: cannot split phases")
    phases = {
        "before": sent < load_start,
        "during": (sent >= load_start) & (sent <= load_end),
        "after": sent > load_end,
        "all": np.ones_like(sent, dtype=bool),
    }
    spans = {
        "before": (load_start - max(started, int(sent.min()))) / 1e9,
        "during": (load_end - load_start) / 1e9,
        "after": (int(sent.max()) - load_end) / 1e9,
        "all": (int(sent.max()) - int(sent.min())) / 1e9,
    }
    setup = (
        f"{platform.node()}; {os.cpu_count()} cores; {platform.processor() or platform.machine()};"
        f" {NAME} (tables {TABLES}), {args.instances} x {args.kind}, gRPC, concurrency "
        f"{args.concurrency}, 26 keys per table per request, Zipf 1.05"
    )
    rows = []
    for phase, mask in phases.items():
        p50, p99 = _percentiles(latency[mask])
        n = int(mask.sum())
        rows.append({
            "phase": phase, "requests": n, "failed": failed,
            "throughput_per_s": round(n / spans[phase], 1) if spans[phase] > 0 else "",
            "p50_ms": round(p50 / 1e3, 3), "p99_ms": round(p99 / 1e3, 3),
            "load_s": round(load_s, 3), "setup": setup,
        })  # fmt: skip
    print(f"{'phase':<8}{'requests':>10}{'failed':>8}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for row in rows:
        print(f"{row['phase']:<8}{row['requests']:>10}{row['failed']:>8}"
              f"{row['throughput_per_s']:>10}{row['p50_ms']:>10}{row['p99_ms']:>10}")  # fmt: skip
    print(
        f"old version's stubs exited: {released}; its segments removed: {segments_gone}; "
        f"version 2's segments present: {v2_segments}; watchdog reloads: {reloads}; "
        "answers equal version 2's files"
    )
    print(f"Triton's counters (sampled every 0.2 s, perf_analyzer's requests after its last "
          f"window included): successes per version {served}, failures {failed}")  # fmt: skip
    print(f"setup: {setup}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"version_switch_{_commit()}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    ok = released and segments_gone and v2_segments and not reloads and failed == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
