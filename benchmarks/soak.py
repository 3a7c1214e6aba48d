"""Soak: every shipped model under perf_analyzer load for minutes, resources sampled throughout.

One tritonserver (2 CPU instances per model, or ``--kind KIND_GPU``) serves the default
repository's models: ``hps_embedding`` (26 Zipf keys per table per request), ``dlrm``, ``dcn``
and ``wdl`` through the ``hugectr`` contract (one request = ``--samples-per-request`` one-hot
samples as DES, CATCOLUMN, ROWINDEX) and their ``_samples`` twins (the same samples as one
``[B, ...]`` request). For each concurrency of ``--concurrency``, one perf_analyzer per model
runs for ``--minutes`` at once (three windows of a third each; a failed request makes
perf_analyzer exit non-zero, and so does a measurement it could not call stable); the server's
own statistics give each model's answered and failed requests per level. Every ``--sample-s``
seconds the script records the resident memory of the server and of its stub processes, their
open file descriptors, the entries and bytes of ``/dev/shm`` and, where NVML answers
(``nvidia-ml-py``, the GPU image has it), the GPU memory in use: on the whole device and by the
server and its stubs; the table compares the first sample after ``--warmup-s`` with the last.
After the server stops it checks that no process and no new ``/dev/shm`` entry is left. Writes
``soak_samples.csv``, ``soak_summary.csv``, ``soak_drift.csv`` (per load phase, each memory
resource's slope per minute after ``--warmup-s``), ``soak_resources.png`` (with matplotlib) and
each perf_analyzer's output.

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
import urllib.request
from pathlib import Path

import numpy as np
import psutil

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
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except psutil.NoSuchProcess:
        return 0


def open_fds(pid: int) -> int:
    return psutil.Process(pid).num_fds()


class GpuMemory:
    """GPU memory in use through NVML: the whole of every device, and by a set of processes.

    ``available`` is False where NVML cannot be loaded (no ``pynvml``, no driver): the soak
    then records no GPU columns.
    """

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception:  # ImportError, or NVMLError where there is no driver
            self.available = False
            return
        self._nvml = pynvml
        self._devices = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.available = True

    def sample(self, pids: set[int]) -> dict[str, float]:
        """MiB in use on all devices, and by ``pids`` (NaN when NVML lists none of the
        processes, as in containers whose pids NVML does not see)."""
        nvml = self._nvml
        used, ours, seen = 0, 0, False
        for device in self._devices:
            used += nvml.nvmlDeviceGetMemoryInfo(device).used
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(device)
            except nvml.NVMLError:
                procs = []  # not supported in some sandboxes: the device total still is
            for proc in procs:
                if proc.pid in pids and proc.usedGpuMemory is not None:
                    ours += proc.usedGpuMemory
                    seen = True
        return {
            "gpu_used_mib": used / 2**20,
            "gpu_procs_mib": ours / 2**20 if seen else float("nan"),
        }


def shm_usage() -> tuple[int, int]:
    entries = list(os.scandir("/dev/shm"))
    return len(entries), sum(e.stat().st_blocks * 512 for e in entries)


class Sampler(threading.Thread):
    """Records the server's and its stubs' memory and descriptors, /dev/shm and GPU memory."""

    def __init__(self, server_pid: int, every_s: float, csv_path: Path) -> None:
        super().__init__(daemon=True)
        self.server_pid, self.every_s = server_pid, every_s
        self.gpu = GpuMemory()
        self.csv_path = csv_path  # written row by row: a soak cut short keeps its samples
        self.rows: list[dict] = []
        self.phase = "start"
        self._halt = threading.Event()
        self._start = time.monotonic()

    def run(self) -> None:
        with self.csv_path.open("w", newline="") as f:
            writer = None
            while True:
                row = self._sample()
                if row is not None:
                    self.rows.append(row)
                    if writer is None:
                        writer = csv.DictWriter(f, fieldnames=list(row))
                        writer.writeheader()
                    writer.writerow(row)
                    f.flush()
                if self._halt.wait(self.every_s):
                    return

    def _sample(self) -> dict | None:
        try:
            stubs = list(stub_processes(self.server_pid))
            shm_entries, shm_bytes = shm_usage()
            gpu = self.gpu.sample({self.server_pid, *stubs}) if self.gpu.available else {}
            return {
                "t_s": round(time.monotonic() - self._start, 1), "phase": self.phase,
                "server_rss_mib": rss_kib(self.server_pid) / 1024,
                "stubs": len(stubs),
                "stubs_rss_mib": sum(rss_kib(p) for p in stubs) / 1024,
                "server_fds": open_fds(self.server_pid),
                "stub_fds": sum(open_fds(p) for p in stubs),
                "shm_entries": shm_entries, "shm_mib": shm_bytes / 2**20, **gpu,
            }  # fmt: skip
        except OSError:
            return None  # a stub exited between listing and reading

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


def server_counts(server) -> dict[str, tuple[int, int]]:
    """Requests each model has answered and failed so far, by the server's own statistics
    (``/v2/models/stats``): the count of failures does not depend on whether perf_analyzer
    reached a stable measurement."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/stats", timeout=30) as reply:
        stats = json.loads(reply.read())["model_stats"]
    counts: dict[str, tuple[int, int]] = {}
    for entry in stats:
        inference = entry["inference_stats"]
        ok, failed = counts.get(entry["name"], (0, 0))
        counts[entry["name"]] = (
            ok + int(inference["success"]["count"]),
            failed + int(inference["fail"]["count"]),
        )
    return counts


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


RESOURCES = (
    "server_rss_mib", "stubs_rss_mib", "stubs", "server_fds", "stub_fds", "shm_entries",
    "shm_mib", "gpu_used_mib", "gpu_procs_mib",
)  # fmt: skip


def phase_drift(rows: list[dict], settle_s: float) -> list[dict]:
    """Per load phase, each memory resource at ``settle_s`` into the phase and at its end, and
    its least-squares slope per minute over that span: flat after warm-up means a slope near
    zero, which the first-against-last comparison alone cannot tell from a slow leak."""
    out = []
    for phase in dict.fromkeys(r["phase"] for r in rows):
        if not phase.startswith("concurrency"):
            continue
        span = [r for r in rows if r["phase"] == phase]
        span = [r for r in span if r["t_s"] >= span[0]["t_s"] + settle_s]
        if len(span) < 3:
            continue
        t = np.array([r["t_s"] for r in span]) / 60.0
        for key in ("server_rss_mib", "stubs_rss_mib", "gpu_used_mib", "gpu_procs_mib"):
            values = np.array([r.get(key, np.nan) for r in span], dtype=np.float64)
            if np.isnan(values).any():
                continue
            out.append({
                "phase": phase, "resource": key, "minutes": round(t[-1] - t[0], 1),
                "first_mib": values[0], "last_mib": values[-1],
                "slope_mib_per_min": float(np.polyfit(t, values, 1)[0]),
            })  # fmt: skip
    return out


def plot_resources(rows: list[dict], path: Path) -> None:
    """One panel per sampled resource against time, the phases shaded (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    keys = [k for k in RESOURCES if k in rows[0] and k != "stubs"]
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 1.8 * len(keys)), sharex=True)
    t = [r["t_s"] for r in rows]
    for ax, key in zip(axes, keys, strict=True):
        ax.plot(t, [r[key] for r in rows], marker=".", linewidth=1)
        ax.set_ylabel(key, fontsize=8)
        start = 0
        for i in range(1, len(rows) + 1):  # shade every other phase
            if i == len(rows) or rows[i]["phase"] != rows[start]["phase"]:
                if rows[start]["phase"].startswith("concurrency"):
                    ax.axvspan(t[start], t[i - 1], alpha=0.1)
                    ax.text(t[start], ax.get_ylim()[1], rows[start]["phase"], fontsize=7,
                            va="top")  # fmt: skip
                start = i
    axes[-1].set_xlabel("seconds since the server was ready")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


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
        sampler = Sampler(server.pid, args.sample_s, args.out / "soak_samples.csv")
        sampler.start()
        try:
            for level in (int(c) for c in args.concurrency.split(",")):
                sampler.phase = f"concurrency {level}"
                print(
                    f"concurrency {level}: {len(inputs)} models for {args.minutes} min", flush=True
                )
                before = server_counts(server)
                results = soak_level(pa, server, inputs, level, args)
                after = server_counts(server)
                for r in results:
                    r["server_ok"] = after[r["model"]][0] - before[r["model"]][0]
                    r["server_failed"] = after[r["model"]][1] - before[r["model"]][1]
                summary += sorted(results, key=lambda r: r["model"])
            sampler.phase = "idle"
            time.sleep(args.sample_s)
        finally:
            sampler.stop()
            log_lines = len((Path(tmp) / "server.log").read_text().splitlines())
            server.stop()
        left = stub_processes(server.pid)
    shm_left = set(os.listdir("/dev/shm")) - shm_before
    with (args.out / "soak_summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    print("\n| model | concurrency | server: answered | server: failed | perf_analyzer exit | "
          "lines with 'error' | throughput | p99 |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for r in summary:
        print(f"| {r['model']} | {r['concurrency']} | {r['server_ok']:,} | {r['server_failed']} | "
              f"{r['exit']} | {r['errors']} | {r['throughput']} | {r['p99']} |")  # fmt: skip
    warm = [r for r in sampler.rows if r["t_s"] >= args.warmup_s] or sampler.rows
    first, last = warm[0], sampler.rows[-1]
    print(f"\n| resource | first after {args.warmup_s:.0f} s (t={first['t_s']} s) | last "
          f"(t={last['t_s']} s) | max |")  # fmt: skip
    print("| --- | ---: | ---: | ---: |")
    for key in RESOURCES:
        if key not in first:
            continue  # GPU columns where NVML answered only
        top = max(r[key] for r in warm)
        print(f"| {key} | {first[key]:.1f} | {last[key]:.1f} | {top:.1f} |")
    drift = phase_drift(sampler.rows, args.warmup_s)
    if drift:
        with (args.out / "soak_drift.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(drift[0]))
            writer.writeheader()
            writer.writerows(drift)
        print(f"\n| phase (from {args.warmup_s:.0f} s in) | resource | minutes | first MiB | "
              "last MiB | slope MiB/min |")  # fmt: skip
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for d in drift:
            print(f"| {d['phase']} | {d['resource']} | {d['minutes']} | {d['first_mib']:.1f} | "
                  f"{d['last_mib']:.1f} | {d['slope_mib_per_min']:+.2f} |")  # fmt: skip
    plot_resources(sampler.rows, args.out / "soak_resources.png")
    print(f"\nserver log: {log_lines} lines; after stop: {len(left)} stub processes, "
          f"{len(shm_left)} new /dev/shm entries {sorted(shm_left)[:5]}")  # fmt: skip


if __name__ == "__main__":
    main()
