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
from make_large_dlrm import MLPERF_V2_TABLE_ROWS
from torch_plugin_vs_pytorch import (
    DENSE,
    DIM,
    DlrmDcn,
    TorchTables,
    features,
    write_ps_json,
    write_tables,
)

from hps_core import hps_torchrec
from hps_core.demo.zoo_networks import MLPERF_V2_HOTNESS
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
    rows = [min(n, args.max_rows) for n in MLPERF_V2_TABLE_ROWS]
    hotness = list(MLPERF_V2_HOTNESS)
    batches = [int(b) for b in args.batches.split(",")]
    args.dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    weights, names = write_tables(args.dir, rows, seed=7)
    torch.manual_seed(0)
    peer = DlrmDcn(TorchTables(weights, names), len(rows)).to(device).eval()
    share = 1.0 if args.cache == "static" else float(args.cache)
    ps = write_ps_json(args.dir, names, hotness, share, max(batches))
    specs = [hps_torchrec.TableSpec(n, DIM, (f"cat_{t}",)) for t, n in enumerate(names)]
    ours = DlrmDcn(hps_torchrec.EmbeddingBagCollection(ps, "dlrm_dcn", specs), len(rows))
    ours.load_state_dict(
        {k: v for k, v in peer.state_dict().items() if not k.startswith("tables.")}
    )
    ours = ours.to(device).eval()
    del weights
    rng = np.random.default_rng(1)
    report = []
    for batch in batches:
        kjt = features(rng, rows, hotness, batch, 1.05, device)
        dense = torch.randn(batch, DENSE, device=device)
        for name, model in (("pytorch", peer), (f"hps {args.cache}", ours)):
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
