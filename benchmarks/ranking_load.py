"""What the serving benchmarks of a ranking model share: its perf_analyzer input, a model
repository of its ``hugectr``-contract model alone, and readings of nvidia-smi and of Triton's
metrics endpoint."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.formats.sparse import KEY_FILE
from hps_core.infer import load_ranking_graph
from hps_core.triton_repo import ServingOptions, write_repository
from hps_core.workload import zipf_keys

REQUESTS = 16
"""Different requests in a perf_analyzer input (sent in turn)."""

_METRIC = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


def add_load_arguments(parser: argparse.ArgumentParser, concurrency: str) -> None:
    """The options every ranking-load benchmark takes: model, load shape, measurement."""
    parser.add_argument("--ps-json", required=True, help="a ranking model's ps.json")
    parser.add_argument("--samples", type=int, default=1024, help="samples per request")
    parser.add_argument("--gpucacheper", type=float, default=0.5)
    parser.add_argument("--concurrency", default=concurrency)
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--stability", type=float, default=25.0, help="perf_analyzer -s")
    parser.add_argument("--out", default="bench_results")


def write_input(
    ps_json: Path, model: str, samples: int, alpha: float, path: Path, requests: int = REQUESTS
) -> None:
    """perf_analyzer input: ``requests`` requests of ``samples`` samples (DES, CATCOLUMN,
    ROWINDEX) with each table's number of keys per slot (one; MLPerf DLRM-v2's fixed hotness
    for its multi-hot tables), keys Zipf-distributed over each table (key i is row i, as
    ``make_large_dlrm.py`` writes them). perf_analyzer sends them in turn, again and again:
    with few of them a partial cache ends up holding every key they carry."""
    config = load_ps_config(ps_json).model(model)
    _, layout = load_ranking_graph(config)
    rng = np.random.default_rng(0)
    rows = [(t.sparse_file / KEY_FILE).stat().st_size // 8 for t in config.tables]
    dense_dim = config.maxnum_des_feature_per_sample
    widths = [t.sample_width for t in layout.tables]
    rowindex = np.concatenate(
        [np.arange(0, samples * t.sample_width + 1, t.hotness, dtype=np.int32)
         for t in layout.tables]
    )  # fmt: skip
    data = []
    for _ in range(requests):
        keys = np.concatenate(
            [
                zipf_keys(rng, samples * w, r, alpha).reshape(samples, w)
                for r, w in zip(rows, widths, strict=True)
            ],
            axis=1,
        )
        dense = rng.random(samples * dense_dim, dtype=np.float32)
        data.append(
            {
                "DES": {"content": dense.round(4).tolist(), "shape": [dense.size]},
                "CATCOLUMN": {"content": keys.ravel().tolist(), "shape": [keys.size]},
                "ROWINDEX": {"content": rowindex.tolist(), "shape": [rowindex.size]},
            }
        )
    path.write_text(json.dumps({"data": data}))


def write_model_repository(ps_json: Path, model: str, repo: Path, options: ServingOptions) -> None:
    """``hps repo`` of ``ps_json`` into ``repo``, keeping the ``hugectr``-contract model alone."""
    write_repository(ps_json, repo, options)
    for folder in repo.iterdir():
        if folder.name != model:
            shutil.rmtree(folder)


def gpu_memory_mib() -> list[int]:
    """Memory in use on each GPU, as nvidia-smi reports it."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return [int(line) for line in out.stdout.split()]


def metric_sums(metrics_url: str, names: tuple[str, ...], by: str) -> dict[str, dict[str, float]]:
    """Sums of Triton metrics ``names`` per value of label ``by`` (e.g. ``device``).

    Returns:
        ``{label value: {metric name: sum}}``.
    """
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    sums: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match is None or match.group(1) not in names:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        group = sums.setdefault(labels.get(by, ""), dict.fromkeys(names, 0.0))
        group[match.group(1)] += float(match.group(3))
    return sums


def hit_rate(sums: dict[str, float]) -> float:
    """Per-occurrence hit rate from sums of ``hps_cache_hits_total`` and ``..._misses_total``."""
    hits, misses = sums["hps_cache_hits_total"], sums["hps_cache_misses_total"]
    return hits / (hits + misses) if hits + misses else 0.0
