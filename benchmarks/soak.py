"""Soak: every shipped model under perf_analyzer load for minutes, resources sampled throughout.

One tritonserver (2 CPU instances per model, or ``--kind KIND_GPU``) serves the default
repository's models: ``hps_embedding`` (26 Zipf keys per table per request), ``dlrm``, ``dcn``
and ``wdl`` through the ``hugectr`` contract (one request = ``--samples-per-request`` one-hot
samples as DES, CATCOLUMN, ROWINDEX) and their ``_samples`` twins (the same samples as one
``[B, ...]`` request). For each concurrency of ``--concurrency``, one perf_analyzer per model
runs for ``--minutes`` at once (three windows of a third each; a failed request makes
perf_analyzer exit non-zero, which the table reports). Every ``--sample-s`` seconds the script
records the resident memory of the server and of its stub processes, their open file
descriptors and the entries and bytes of ``/dev/shm``; the table compares the first sample
after ``--warmup-s`` with the last. After the server stops it checks that no process and no
new ``/dev/shm`` entry is left. Writes ``soak_samples.csv``, ``soak_summary.csv`` and each
perf_analyzer's output.

Usage:
    python benchmarks/soak.py --minutes 10 --concurrency 16,64 --out bench_results/soak
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS
from hps_core.formats.sparse import KEY_DTYPE, KEY_FILE
from hps_core.infer import load_ranking_graph
from hps_core.server.install import find_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.server.stub_watchdog import stub_processes
from hps_core.triton_repo import InstanceGroup, ServingOptions
from hps_core.workload import zipf_keys

ROOT = Path(__file__).resolve().parents[1]
RANKING = ("dlrm", "dcn", "wdl")


def one_hot_samples(repo: Path, model: str, entries: int, samples: int, alpha: float):
    """``entries`` requests of ``samples`` one-hot Zipf samples: dense ``[E, B, D]`` and keys
    ``[E, B, S]`` (tables in order), plus the slots of each table."""
    config = load_ps_config(repo / model / "ps.json").model(model)
    _, layout = load_ranking_graph(config)
    rng = np.random.default_rng(0)
    columns, slots = [], []
    for table, feed in zip(config.tables, layout.tables, strict=True):
        keys = np.fromfile(table.sparse_file / KEY_FILE, dtype=KEY_DTYPE)
        n = feed.slot_num  # one key per slot
        ranks = zipf_keys(rng, entries * samples * n, len(keys), alpha)
        columns.append(keys[ranks].reshape(entries, samples, n))
        slots.append(n)
    dense = rng.random((entries, samples, config.maxnum_des_feature_per_sample), np.float32)
    return dense, np.concatenate(columns, axis=2), slots


def write_inputs(repo: Path, folder: Path, samples: int, alpha: float) -> dict[str, Path]:
    """perf_analyzer ``--input-data`` files of every soaked model."""
    inputs = {}
    path = inputs["hps_embedding"] = folder / "hps_embedding.json"
    subprocess.run(
        [sys.executable, str(ROOT / "client_examples" / "make_perf_input.py"),
         "--keys-per-table", "26,26", "--alpha", str(alpha), "--samples", "64",
         "--out", str(path)],
        check=True, capture_output=True,
    )  # fmt: skip
    for model in RANKING:
        dense, keys, slots = one_hot_samples(repo, model, 16, samples, alpha)
        rowindex = np.concatenate([np.arange(samples * s + 1) for s in slots]).tolist()
        hugectr, twin = [], []
        for d, k in zip(dense, keys, strict=True):
            # HugeCTR's order: sample by sample, each sample's tables slot by slot.
            hugectr.append({
                "DES": {"content": d.ravel().tolist(), "shape": [d.size]},
                "CATCOLUMN": {"content": k.ravel().tolist(), "shape": [k.size]},
                "ROWINDEX": {"content": rowindex, "shape": [len(rowindex)]},
            })  # fmt: skip
            for dense_row, key_row in zip(d, k, strict=True):
                twin.append({
                    "dense": {"content": dense_row.tolist(), "shape": [len(dense_row)]},
                    "sparse": {"content": key_row.tolist(), "shape": [len(key_row)]},
                })  # fmt: skip
        inputs[model] = folder / f"{model}.json"
        inputs[model].write_text(json.dumps({"data": hugectr}))
        inputs[f"{model}_samples"] = folder / f"{model}_samples.json"
        inputs[f"{model}_samples"].write_text(json.dumps({"data": twin}))
    return inputs


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def shm_usage() -> tuple[int, int]:
    entries = list(os.scandir("/dev/shm"))
    return len(entries), sum(e.stat().st_blocks * 512 for e in entries)


class Sampler(threading.Thread):
    """Records the server's and its stubs' memory and descriptors, and /dev/shm."""

    def __init__(self, server_pid: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.server_pid, self.every_s = server_pid, every_s
        self.rows: list[dict] = []
        self.phase = "start"
        self._halt = threading.Event()
        self._start = time.monotonic()

    def run(self) -> None:
        while True:
            try:
                stubs = list(stub_processes(self.server_pid))
                shm_entries, shm_bytes = shm_usage()
                self.rows.append({
                    "t_s": round(time.monotonic() - self._start, 1), "phase": self.phase,
                    "server_rss_mib": rss_kib(self.server_pid) / 1024,
                    "stubs": len(stubs),
                    "stubs_rss_mib": sum(rss_kib(p) for p in stubs) / 1024,
                    "server_fds": open_fds(self.server_pid),
                    "stub_fds": sum(open_fds(p) for p in stubs),
                    "shm_entries": shm_entries, "shm_mib": shm_bytes / 2**20,
                })  # fmt: skip
            except OSError:
                pass  # a stub exited between listing and reading
            if self._halt.wait(self.every_s):
                return

    def stop(self) -> None:
        self._halt.set()
        self.join()


def soak(
    pa, server, model: str, data: Path, batch: int, level: int, minutes: float, out: Path
) -> dict:
    window_ms = int(minutes * 60_000 / 3)
    args = pa.command(
        "-m", model, "-u", server.grpc_url.split("//")[-1], "-i", "grpc", "--input-data",
        str(data), "-b", str(batch), "--concurrency-range", str(level),
        "--measurement-interval", str(window_ms), "--stability-percentage", "100",
        "--max-trials", "3", "--percentile", "99",
    )  # fmt: skip
    done = subprocess.run(args, env=dict(pa.env), capture_output=True, text=True)
    text = done.stdout + done.stderr
    (out / f"perf_analyzer_{model}_c{level}.log").write_text(text)
    line = next((x for x in text.splitlines() if "Throughput:" in x), "")
    p99 = next((x for x in text.splitlines() if "p99 latency:" in x), "")
    return {
        "model": model, "concurrency": level, "exit": done.returncode,
        "throughput": line.split("Throughput:")[-1].strip(),
        "p99": p99.split("p99 latency:")[-1].strip(),
        "errors": sum("error" in x.lower() for x in text.splitlines()),
    }  # fmt: skip


def soak_level(pa, server, inputs: dict[str, Path], level: int, args) -> list[dict]:
    """Every model at ``level`` at once, one perf_analyzer each, for ``args.minutes``."""
    results: list[dict] = []

    def one(model: str, data: Path) -> None:
        batch = args.samples_per_request if model.endswith("_samples") else 1
        results.append(soak(pa, server, model, data, batch, level, args.minutes, args.out))

    threads = [threading.Thread(target=one, args=item) for item in inputs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="per concurrency level")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--models", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--kind", default="KIND_CPU", choices=("KIND_CPU", "KIND_GPU"))
    parser.add_argument("--samples-per-request", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("bench_results/soak"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pa = find_perf_analyzer()
    shm_before = set(os.listdir("/dev/shm"))
    summary = []
    with tempfile.TemporaryDirectory(prefix="hps-soak-") as tmp:
        repo = Path(tmp) / "repo"
        options = ServingOptions(instances=(InstanceGroup(2, args.kind),))
        for write in DEMO_MODELS.values():
            write(repo, options)
        inputs = write_inputs(repo, Path(tmp), args.samples_per_request, args.alpha)
        if args.models:
            inputs = {m: inputs[m] for m in args.models.split(",")}
        server = TritonServer(repo, startup_timeout_s=300, log_file=Path(tmp) / "server.log")
        server.start()
        sampler = Sampler(server.pid, args.sample_s)
        sampler.start()
        try:
            for level in (int(c) for c in args.concurrency.split(",")):
                sampler.phase = f"concurrency {level}"
                print(
                    f"concurrency {level}: {len(inputs)} models for {args.minutes} min", flush=True
                )
                results = soak_level(pa, server, inputs, level, args)
                summary += sorted(results, key=lambda r: r["model"])
            sampler.phase = "idle"
            time.sleep(args.sample_s)
        finally:
            sampler.stop()
            log_lines = len((Path(tmp) / "server.log").read_text().splitlines())
            server.stop()
        left = stub_processes(server.pid)
    shm_left = set(os.listdir("/dev/shm")) - shm_before
    with (args.out / "soak_samples.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(sampler.rows[0]))
        writer.writeheader()
        writer.writerows(sampler.rows)
    with (args.out / "soak_summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    print("\n| model | concurrency | perf_analyzer exit | lines with 'error' | throughput | p99 |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for r in summary:
        print(f"| {r['model']} | {r['concurrency']} | {r['exit']} | {r['errors']} | "
              f"{r['throughput']} | {r['p99']} |")  # fmt: skip
    warm = [r for r in sampler.rows if r["t_s"] >= args.warmup_s] or sampler.rows
    first, last = warm[0], sampler.rows[-1]
    print(f"\n| resource | first after {args.warmup_s:.0f} s (t={first['t_s']} s) | last "
          f"(t={last['t_s']} s) | max |")  # fmt: skip
    print("| --- | ---: | ---: | ---: |")
    for key in ("server_rss_mib", "stubs_rss_mib", "stubs", "server_fds", "stub_fds",
                "shm_entries", "shm_mib"):  # fmt: skip
        top = max(r[key] for r in warm)
        print(f"| {key} | {first[key]:.1f} | {last[key]:.1f} | {top:.1f} |")
    print(f"\nserver log: {log_lines} lines; after stop: {len(left)} stub processes, "
          f"{len(shm_left)} new /dev/shm entries {sorted(shm_left)[:5]}")  # fmt: skip


if __name__ == "__main__":
    main()
