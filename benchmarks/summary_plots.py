"""The plots of BENCHMARKS.md, drawn from the result files in ``benchmarks/results/``.

Every plot reads CSVs that benchmark scripts wrote (nothing here measures anything), and its
title names the commit and the machine those files record:

- ``vs_pytorch.png``: samples/s against batch size, in one process, of the MLPerf-shaped
  one-hot DLRM (b79329f) and of DLRM-v2 (afb06fd) against the same network in PyTorch with
  every table on the GPU, eager and as a CUDA graph (``ranking_vs_pytorch.py``, H200, TF32);
- ``served_vs_pytorch.png``: samples/s of both served by one Triton server
  (``ranking_serve_vs_pytorch.py``, H200; dc569c0 and a8b8a44);
- ``memory.png``: host RAM and GPU memory of the MLPerf DLRM per storage precision
  (``storage_memory.py``, 25b656e);
- ``large_table_load.png``: how fast an 8.12 GB table reaches the host tier, against ``cat``
  and a plain read (``large_table.py``, 2-core CPU machine, 19ac773);
- ``served_concurrency.png``: throughput of the default models against concurrency on the
  2-core CPU machine (d97b18f) and on the H200 (dbb42ea) (``serve_perf.py``).

Usage:
    python benchmarks/summary_plots.py                 # writes docs/benchmarks/*.png
    python benchmarks/summary_plots.py --out DIR
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_OUT = ROOT / "docs" / "benchmarks"


def read_rows(name: str) -> list[dict[str, str]]:
    """The rows of ``benchmarks/results/<name>``."""
    with (RESULTS / name).open(newline="") as f:
        return list(csv.DictReader(f))


def _series(rows: Sequence[dict[str, str]], x: str, y: str) -> tuple[list[float], list[float]]:
    """The (x, y) points of ``rows``, sorted by x."""
    points = sorted((float(r[x]), float(r[y])) for r in rows)
    return [p[0] for p in points], [p[1] for p in points]


def plot_vs_pytorch(plt, out: Path) -> Path:
    """Samples/s against batch size, ours against the PyTorch peer, TF32, keys from the host."""
    runs = [
        ("One-hot MLPerf DLRM (26 x 128, 7.1M rows)", "onehot_b79329f", "b79329f"),
        ("DLRM-v2 (multi-hot, DCN v2)", "v2_afb06fd", "afb06fd"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (title, name, commit) in zip(axes, runs, strict=True):
        rows = [
            r
            for r in read_rows(f"ranking_vs_pytorch_{name}.csv")
            if r["precision"] == "tf32" and r["inputs"] == "host"
        ]
        lines = [
            ("hps-triton, cache 20 % of rows", "hps-triton", "0.2", "o-"),
            ("hps-triton, static (all rows on GPU)", "hps-triton", "static", "s-"),
            ("PyTorch eager, all rows on GPU", "pytorch-eager", "all on GPU", "^--"),
            ("PyTorch CUDA graph, all rows on GPU", "pytorch-graph", "all on GPU", "v:"),
        ]
        for label, system, cache, style in lines:
            mine = [r for r in rows if r["system"] == system and r["cache"] == cache]
            xs, ys = _series(mine, "batch", "samples_per_s")
            if xs:
                ax.plot(xs, ys, style, label=label)
        ax.set(xscale="log", yscale="log", xlabel="samples per batch", ylabel="samples/s")
        ax.set_title(f"{title}\nH200, TF32, commit {commit}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "vs_pytorch.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_served_vs_pytorch(plt, out: Path) -> Path:
    """Served samples/s, ours against the PyTorch peer in the same server."""
    runs = [
        ("One-hot MLPerf DLRM, commit dc569c0", "serve_vs_pytorch_dc569c0.csv"),
        ("DLRM-v2, distinct samples, commit a8b8a44", "serve_vs_pytorch_v2_fresh_a8b8a44.csv"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (title, name) in zip(axes, runs, strict=True):
        rows = read_rows(name)
        cases = sorted({(int(r["samples"]), int(r["concurrency"])) for r in rows})
        width = 0.38
        for offset, (model, label) in enumerate(
            [("dlrm", "hps-triton"), ("dlrm_pytorch", "PyTorch (Python backend)")]
        ):
            values = [
                next(
                    float(r["samples_per_s"])
                    for r in rows
                    if r["model"] == model and (int(r["samples"]), int(r["concurrency"])) == case
                )
                for case in cases
            ]
            xs = [i + (offset - 0.5) * width for i in range(len(cases))]
            ax.bar(xs, values, width, label=label)
        ax.set_xticks(range(len(cases)), [f"{s} x conc. {c}" for s, c in cases], fontsize=8)
        ax.set(yscale="log", ylabel="samples/s", xlabel="samples per request x concurrency")
        ax.set_title(f"{title}\nH200, 2 GPU instances each, gRPC", fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "served_vs_pytorch.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_memory(plt, out: Path) -> Path:
    """Host RAM and GPU memory of the MLPerf DLRM in each storage precision."""
    rows = read_rows("storage_memory_25b656e.csv")
    gib = 2**30
    precisions = [r["storage"] for r in rows if r["cache"] == "0.2"]
    by = {(r["storage"], r["cache"]): r for r in rows}
    bars = [
        ("host RAM (shared tier)", [float(by[p, "0.2"]["host_bytes"]) / gib for p in precisions]),
        ("GPU, cache 20 % of rows", [float(by[p, "0.2"]["gpu_bytes"]) / gib for p in precisions]),
        ("GPU, static tables", [float(by[p, "static"]["gpu_bytes"]) / gib for p in precisions]),
    ]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.27
    for i, (label, values) in enumerate(bars):
        ax.bar([j + (i - 1) * width for j in range(len(precisions))], values, width, label=label)
    fp32_rows = float(rows[0]["fp32_bytes"]) / gib
    ax.axhline(fp32_rows, color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"FP32 rows: {fp32_rows:.2f} GiB", (1.2, fp32_rows + 0.08))
    ax.set_xticks(range(len(precisions)), precisions)
    ax.set(ylabel="GiB", xlabel="storage precision")
    title = "MLPerf DLRM (26 x 128, 7.1M rows): memory\nH200 machine, commit 25b656e"
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "memory.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_large_table_load(plt, out: Path) -> Path:
    """GB/s of each way to read the 8.12 GB table, cold and warm page cache."""
    rows = [r for r in read_rows("large_table_load_cpu_19ac773.csv") if r["gb_per_s"] != "nan"]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    labels = [f"{r['what']} [{r['cache']}]" for r in rows]
    values = [float(r["gb_per_s"]) for r in rows]
    ax.barh(range(len(rows)), values)
    for i, (value, r) in enumerate(zip(values, rows, strict=True)):
        note = f" {value:.2f} GB/s, {float(r['seconds']):.1f} s"
        ax.annotate(note, (value, i), va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="GB/s of the sparse files (log)")
    title = "Loading an 8.12 GB table (15.6M x 128 FP32) into the host tier"
    ax.set_title(f"{title}\n2-core CPU machine, commit 19ac773", fontsize=10)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    path = out / "large_table_load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_served_concurrency(plt, out: Path) -> Path:
    """Throughput of the default models against concurrency, CPU and GPU instances."""
    runs = [
        ("2-core CPU machine, 2 CPU instances (d97b18f)", "concurrency_sweep_d97b18f.csv", "o-"),
        ("H200 machine, 2 GPU instances (dbb42ea)", "concurrency_sweep_gpu_dbb42ea.csv", "s--"),
    ]
    models = [
        ("hps_embedding", "requests/s (26 keys per table each)"),
        ("dlrm_samples", "samples/s (64 per request)"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (model, ylabel) in zip(axes, models, strict=True):
        for label, name, style in runs:
            mine = [r for r in read_rows(name) if r["model"] == model]
            xs, ys = _series(mine, "concurrency", "throughput")
            ax.plot(xs, ys, style, label=label)
        ax.set(xscale="log", xlabel="requests in flight (perf_analyzer concurrency)", ylabel=ylabel)
        ax.set_xticks([1, 4, 16, 64, 256], ["1", "4", "16", "64", "256"])
        ax.set_title(f"{model}, gRPC", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "served_concurrency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


PLOTS = (
    plot_vs_pytorch,
    plot_served_vs_pytorch,
    plot_memory,
    plot_large_table_load,
    plot_served_concurrency,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the PNGs")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    for plot in PLOTS:
        print(f"wrote {plot(plt, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
