"""Where the time of one forward of ``torch_plugin_vs_pytorch.py``'s DLRM-DCN goes, with its
tables in the HPS: the host's Python (cProfile, by cumulative time, the HPS's functions) and
the GPU's and host's operators (``torch.profiler``, by self time, CuPy's kernels included as
CUDA time), beside the same module with ``torch.nn.EmbeddingBag`` tables.

Issue 46's target is the same module's speed with ``EmbeddingBag`` tables at every batch; the
first GPU run (H100, 162202a) measured 6.7-6.9 ms a forward at 1 to 1,024 samples against
1.1-2.4 ms, a cost that does not grow with the batch: this script says whose it is.

Usage (a GPU with CuPy and PyTorch; ``--device cpu --max-rows 2000`` checks the script)::

    python benchmarks/torch_plugin_profile.py --out $OUT --batches 1,16384
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path

import numpy as np
import torch
from torch_plugin_vs_pytorch import DENSE, features, models

from hps_core.hps import HPS


def profiled(model, dense, kjt, steps: int) -> str:
    """cProfile's and torch.profiler's tables of ``steps`` forwards (after a warm-up)."""
    cuda = dense.is_cuda
    wait = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(5):
            model(dense, kjt)
        wait()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(steps):
            model(dense, kjt)
        wait()
        profile.disable()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                model(dense, kjt)
            wait()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
    stats.print_stats(45)
    tables = [prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)]
    if cuda:
        tables.append(prof.key_averages().table(sort_by="self_device_time_total", row_limit=20))
    return "\n".join([text.getvalue(), *tables])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/torch_plugin_tables"))
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    parser.add_argument("--max-rows", type=int, default=300_000)
    parser.add_argument("--batches", default="1,16384")
    parser.add_argument("--cache", default="static", help="static or a GPU cache share")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda", help="cpu: a check of the script")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    variants, rows, hotness = models(args.dir, args.max_rows, [args.cache], max(batches), device)
    rng = np.random.default_rng(1)
    report = []
    for batch in batches:
        kjt = features(rng, rows, hotness, batch, 1.05, device)
        dense = torch.randn(batch, DENSE, device=device)
        for name, model in variants.items():
            head = f"===== {name}, batch {batch}, {args.steps} forwards ====="
            print(head, flush=True)
            report.append(f"{head}\n{profiled(model, dense, kjt, args.steps)}")
    HPS.close_all()
    path = args.out / "torch_plugin_profile.txt"
    path.write_text("\n".join(report))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
