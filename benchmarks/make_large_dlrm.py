"""Generate a large MLPerf-shaped DLRM as HugeCTR files, ready for ``hps repo``.

The model is the MLPerf DLRM (Criteo Terabyte): 13 dense features, 26 tables of dim 128,
bottom MLP 13-512-256-128, top MLP 1024-1024-512-256-1 after the 479-wide dot interaction.
Table sizes default to MLPerf's (``--max-ind-range 40000000``: five tables of ~40M rows),
each capped at ``--max-rows-per-table``; then, if the whole model would exceed
``--max-total-gb``, the cap is lowered until it fits (small tables keep their size). Weights
are random (seeded) with dlrm's initialisation: tables uniform in +-1/sqrt(rows), Linear
weights normal with std sqrt(2 / (fan_in + fan_out)), biases normal with std sqrt(1/fan_out).

With ``--dcnv2``, MLPerf's current DLRM (DLRM-v2, DCN v2, multi-hot Criteo 1TB) instead, as
HugeCTR's ``samples/dlrm/train.py`` builds it (:func:`hps_core.demo.zoo_networks.dlrm_v2_network`):
MLPerf's table sizes for it and its fixed hotness per table
(``3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1`` keys per sample), the bottom
MLP, the 26 pooled vectors and its output concatenated (3,456 wide), a ``MultiCross`` of
``--cross-layers`` 3 and ``--projection-dim`` 512, the top MLP 1024-1024-512-256-1 and a
sigmoid; ``maxnum_catfeature_query_per_table_per_sample`` is each table's hotness. Weights of
every layer as above (the cross layers' ``U``, ``V`` like Linear weights, their biases like
Linear biases).

Tables are generated and written chunk by chunk (about 64 MiB at a time), never whole, with
the same writer as ``hps convert dlrm`` (:func:`hps_core.export.write_dlrm_model`); NumPy
only, no torch. Row ``i`` of table ``t`` has key ``i``.

Usage:
    python benchmarks/make_large_dlrm.py --out /data/dlrm                  # <= 16 GB
    python benchmarks/make_large_dlrm.py --out /data/dlrm2 --dcnv2 --max-rows-per-table 1000000
    python benchmarks/make_large_dlrm.py --out /data/dlrm --max-total-gb 40
    python benchmarks/make_large_dlrm.py --out /tmp/small --rows-per-table 100000
    hps repo /data/dlrm/ps.json /data/repo && hps serve --model-repository /data/repo
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from functools import partial

import numpy as np

from hps_core.demo.zoo_networks import MLPERF_V2_HOTNESS, dlrm_v2_network
from hps_core.errors import HPSError
from hps_core.export import DlrmArch, parse_dash_list, write_dlrm_model, write_ranking_files
from hps_core.export.dlrm_files import DlrmFiles
from hps_core.nn import DenseLayout, DenseParams

# Criteo Terabyte table sizes of the MLPerf DLRM reference (dlrm_s_pytorch.py with
# --max-ind-range=40000000).
MLPERF_TABLE_ROWS = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)  # fmt: skip
# MLPerf DLRM-v2's table sizes (multi-hot Criteo 1TB, torchrec_dlrm's --num_embeddings_per_feature).
MLPERF_V2_TABLE_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
KEY_BYTES = 8
ROW_BLOCK = 4096
GB = 10**9


def table_rows(
    wanted: Sequence[int], dim: int, max_rows: int, max_total_gb: float
) -> tuple[tuple[int, ...], int]:
    """Cap every table at ``max_rows``, then lower the cap until the tables fit the budget.

    Args:
        wanted: rows asked for per table.
        dim: floats per vector.
        max_rows: the most rows of one table.
        max_total_gb: budget for the sparse files (keys + vectors), in 10^9 bytes.

    Returns:
        ``(rows per table, the cap applied)``.

    Raises:
        ValueError: not even one row per table fits the budget.
    """
    row_bytes = dim * 4 + KEY_BYTES
    budget_rows = int(max_total_gb * GB // row_bytes)
    if len(wanted) > budget_rows:
        raise ValueError(
            f"--max-total-gb {max_total_gb} cannot hold even one row per table "
            f"({len(wanted)} tables x {row_bytes} bytes)"
        )
    low, high = 1, max(1, min(max_rows, max(wanted)))
    while low < high:  # the largest cap whose total fits
        cap = (low + high + 1) // 2
        if sum(min(r, cap) for r in wanted) <= budget_rows:
            low = cap
        else:
            high = cap - 1
    return tuple(min(r, low) for r in wanted), low


def random_dense(arch: DlrmArch, seed: int) -> dict[str, np.ndarray]:
    """dlrm-initialised MLP tensors in PyTorch layout (``[out, in]`` weights, ``[out]`` biases)."""
    rng = np.random.default_rng([seed, 1_000_000])
    dense = {}
    for key, shape in arch.expected_shapes().items():
        if key.startswith("emb_l."):
            continue
        fan_out = shape[0]
        std = np.sqrt(2 / (shape[0] + shape[1])) if len(shape) == 2 else np.sqrt(1 / fan_out)
        dense[key] = (std * rng.standard_normal(shape)).astype(np.float32)
    return dense


def random_layer_params(layout: DenseLayout, seed: int) -> DenseParams:
    """dlrm-initialised tensors for any HugeCTR dense layout: ``[in, out]`` weights normal with
    std sqrt(2 / (in + out)), ``[1, out]`` biases normal with std sqrt(1 / out)."""
    rng = np.random.default_rng([seed, 2_000_000])
    params: DenseParams = {}
    for layer in layout.layers:
        tensors = []
        for param in layer.params:
            fan_in, fan_out = param.shape[0], param.shape[-1]
            std = np.sqrt(1 / fan_out) if fan_in == 1 else np.sqrt(2 / (fan_in + fan_out))
            tensors.append((std * rng.standard_normal(param.shape)).astype(np.float32))
        params[layer.layer] = tuple(tensors)
    return params


def write_dlrm_v2(args: argparse.Namespace, rows: Sequence[int], dim: int) -> DlrmFiles:
    """The DLRM-v2 model of ``--dcnv2`` (see the module docstring)."""
    hotness = parse_dash_list(args.multi_hot_sizes, "--multi-hot-sizes")
    if len(hotness) != len(rows):
        raise ValueError(f"--multi-hot-sizes has {len(hotness)} values for {len(rows)} tables")
    bottom = parse_dash_list(args.arch_mlp_bot, "--arch-mlp-bot")
    network = dlrm_v2_network(
        dim, hotness, bottom[1:], parse_dash_list(args.arch_mlp_top, "--arch-mlp-top"),
        args.cross_layers, args.projection_dim,
    )  # fmt: skip
    return write_ranking_files(
        args.out,
        args.model_name,
        network,
        lambda layout: random_layer_params(layout, args.seed),
        [partial(random_rows, args.seed, t, n, dim) for t, n in enumerate(rows)],
        rows,
        max_keys_per_table=hotness,
        max_batch_size=args.max_batch_size,
        overwrite=args.overwrite,
    )


def random_rows(seed: int, table: int, rows: int, dim: int, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a table, uniform in +-1/sqrt(rows).

    Row ``i`` depends only on ``(seed, table, i)`` (each block of ``ROW_BLOCK`` rows has its
    own generator), so the table is the same however the writer splits it into chunks.
    """
    out = np.empty((stop - start, dim), dtype=np.float32)
    for block in range(start // ROW_BLOCK, -(-stop // ROW_BLOCK)):
        first = block * ROW_BLOCK
        values = np.random.default_rng([seed, table, block]).random(
            (ROW_BLOCK, dim), dtype=np.float32
        )
        low, high = max(start, first), min(stop, first + ROW_BLOCK)
        out[low - start : high - start] = values[low - first : high - first]
    bound = np.float32(rows**-0.5)
    out *= 2 * bound
    out -= bound
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--model-name", default="dlrm", help="ps.json model name (default dlrm)")
    parser.add_argument(
        "--rows-per-table",
        help="rows of every table (N) or of each table (N-N-...); default MLPerf's sizes",
    )
    parser.add_argument("--max-rows-per-table", type=int, default=4_000_000)
    parser.add_argument(
        "--max-total-gb", type=float, default=16.0, help="budget for the tables, in 10^9 bytes"
    )
    parser.add_argument("--arch-sparse-feature-size", type=int, default=128)
    parser.add_argument("--arch-mlp-bot", default="13-512-256-128")
    parser.add_argument("--arch-mlp-top", default="1024-1024-512-256-1")
    parser.add_argument("--num-tables", type=int, default=26, help="with --rows-per-table N")
    parser.add_argument("--max-keys-per-table", type=int, default=1, help="keys/sample/table")
    parser.add_argument("--dcnv2", action="store_true", help="MLPerf DLRM-v2 (DCN v2, multi-hot)")
    parser.add_argument(
        "--multi-hot-sizes",
        default="-".join(str(h) for h in MLPERF_V2_HOTNESS),
        help="with --dcnv2: keys per sample of each table (default MLPerf's)",
    )
    parser.add_argument("--cross-layers", type=int, default=3, help="with --dcnv2")
    parser.add_argument("--projection-dim", type=int, default=512, help="with --dcnv2")
    parser.add_argument("--max-batch-size", type=int, default=1024, help="ps.json max_batch_size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    dim = args.arch_sparse_feature_size
    try:
        if args.rows_per_table is None:
            wanted: Sequence[int] = MLPERF_V2_TABLE_ROWS if args.dcnv2 else MLPERF_TABLE_ROWS
        else:
            wanted = parse_dash_list(args.rows_per_table, "--rows-per-table")
            if len(wanted) == 1:
                wanted = wanted * args.num_tables
        rows, cap = table_rows(wanted, dim, args.max_rows_per_table, args.max_total_gb)
        started = time.perf_counter()
        if args.dcnv2:
            files = write_dlrm_v2(args, rows, dim)
            shape = (
                f"DLRM-v2: bottom {args.arch_mlp_bot}, {args.cross_layers} cross layers of "
                f"projection {args.projection_dim}, top {args.arch_mlp_top}"
            )
        else:
            arch = DlrmArch(
                dim,
                rows,
                parse_dash_list(args.arch_mlp_bot, "--arch-mlp-bot"),
                parse_dash_list(args.arch_mlp_top, "--arch-mlp-top"),
            )
            files = write_dlrm_model(
                args.out,
                args.model_name,
                arch,
                random_dense(arch, args.seed),
                [partial(random_rows, args.seed, t, n, dim) for t, n in enumerate(rows)],
                max_keys_per_table=args.max_keys_per_table,
                max_batch_size=args.max_batch_size,
                overwrite=args.overwrite,
            )
            shape = f"bottom {args.arch_mlp_bot}, top {arch.interaction_width}-{args.arch_mlp_top}"
    except (HPSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - started
    row_bytes = dim * 4 + KEY_BYTES
    print(f"{'table':>5} {'rows':>12} {'asked':>12} {'GB':>8}  folder")
    for t, (path, n) in enumerate(zip(files.sparse_files, rows, strict=True)):
        print(f"{t:>5} {n:>12,} {wanted[t]:>12,} {n * row_bytes / GB:>8.3f}  {path.name}")
    total = files.total_bytes
    capped = sum(n < w for n, w in zip(rows, wanted, strict=True))
    print(
        f"{sum(rows):,} rows in {len(rows)} tables of dim {dim} "
        f"({capped} capped at {cap:,} rows); dense {files.dense_floats:,} floats ({shape})"
    )
    print(f"wrote {total / GB:.2f} GB in {seconds:.1f} s ({total / GB / seconds:.2f} GB/s)")
    print(f"ps.json: {files.ps_json}")
    print(f"next: hps repo {files.ps_json} REPO && hps serve --model-repository REPO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
