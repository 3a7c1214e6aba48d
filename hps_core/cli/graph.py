"""``hps graph NETWORK_JSON [--dense FILE]``: print the inference graph of a HugeCTR network.

One line per layer in execution order: its line in the file, name, type, input and output
shapes and parameter count; then the prediction, the total number of dense parameters and,
with ``--dense``, whether the dense model file has exactly that many floats. Layers this
engine cannot run are listed with their file position, and the exit code is then 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from hps_core.errors import ModelFileError, NotAvailableError
from hps_core.nn import NetworkForm, NetworkGraph, build_graph, load_network_json
from hps_core.nn.dense_blob import check_dense_blob_size
from hps_core.nn.graph import GraphNode
from hps_core.nn.layers.activation import Dropout, LossAsSigmoid
from hps_core.nn.shapes import TensorShape

_FORM_NOTES = {
    NetworkForm.INFERENCE: "inference form",
    NetworkForm.TRAINING: "training form: solver and optimizer ignored",
    NetworkForm.GRAPH: "graph only",
}
_COLUMNS = ("line", "layer", "type", "inputs", "outputs", "params")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps graph`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "graph",
        help="print the inference graph of a HugeCTR network JSON",
        description="Print the inference graph of a HugeCTR network: each layer with its line, "
        "input and output shapes and parameter count. Exits 1 if a layer cannot run or the "
        "dense model file does not match.",
    )
    parser.add_argument("network", metavar="NETWORK_JSON", help="HugeCTR network JSON file")
    parser.add_argument("--dense", metavar="FILE", help="dense model file to check against it")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """Print the graph report.

    Args:
        args: parsed arguments (``network``, ``dense``).
        stream: where to print (standard output by default).

    Returns:
        0 when every layer can run (and the dense file matches); 1 otherwise.
    """
    out = stream or sys.stdout
    graph = build_graph(load_network_json(args.network))
    ok = not graph.cannot_run
    print(f"network {graph.spec.source} ({_FORM_NOTES[graph.spec.form]})", file=out)
    _print_inputs(graph, out)
    _print_table(graph, out)
    if any(not node.used for node in graph.nodes):
        print("* not needed for the prediction", file=out)
    print(f"prediction '{graph.output}' {_shape(graph.output_shape)}", file=out)
    ok = _print_params(graph, args.dense, out) and ok
    if graph.cannot_run:
        print(f"cannot run {len(graph.cannot_run)} layer(s):", file=out)
        for problem in graph.cannot_run:
            print(f"  {problem}", file=out)
    return 0 if ok else 1


def _print_inputs(graph: NetworkGraph, out: TextIO) -> None:
    data = graph.spec.data
    print(f"dense input '{data.dense_name}' (B, {data.dense_dim})", file=out)
    for sparse in data.sparse:
        nnz = "" if sparse.nnz_per_slot is None else f", nnz_per_slot {sparse.nnz_per_slot}"
        print(f"sparse input '{sparse.name}' {sparse.slot_num} slots{nnz}", file=out)
    for table, node in enumerate(graph.embeddings):
        layer = node.layer
        print(
            f"embedding table {table}: '{node.spec.name}' <- '{layer.sparse_input}', "
            f"vec_size {layer.vec_size}, combiner {layer.combiner.value}",
            file=out,
        )


def _print_table(graph: NetworkGraph, out: TextIO) -> None:
    rows = [_COLUMNS] + [_row(graph, node) for node in graph.nodes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        cells = [
            cell.rjust(w) if i in (0, 5) else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip(), file=out)


def _row(graph: NetworkGraph, node: GraphNode) -> tuple[str, ...]:
    spec = node.spec
    sparse = {s.name for s in graph.spec.data.sparse}
    inputs = ", ".join(
        f"{name} (sparse)" if name in sparse else f"{name} {_shape(shape)}"
        for name, shape in zip(node.inputs, node.input_shapes, strict=True)
    )
    outputs = ", ".join(_shape(shape) for shape in node.output_shapes)
    layer_type = spec.type
    if isinstance(node.layer, LossAsSigmoid):
        layer_type += " -> Sigmoid"
    elif isinstance(node.layer, Dropout):
        layer_type += " (identity)"
    name = spec.name if node.used else f"{spec.name} *"
    params = f"{node.param_count:,}" if node.param_count else "-"
    return (str(spec.line), name, layer_type, inputs, outputs, params)


def _print_params(graph: NetworkGraph, dense_file: str | None, out: TextIO) -> bool:
    try:
        layout = graph.dense_layout()
    except NotAvailableError as exc:
        print(f"dense parameters: unknown ({exc})", file=out)
        return dense_file is None
    total = layout.total_floats
    print(f"dense parameters: {total:,} floats ({4 * total:,} bytes)", file=out)
    if dense_file is None:
        return True
    try:
        check_dense_blob_size(dense_file, layout)
    except ModelFileError as exc:
        print(f"dense file: MISMATCH: {exc}", file=out)
        return False
    print(f"dense file {dense_file}: {total:,} floats, matches", file=out)
    return True


def _shape(shape: TensorShape | None) -> str:
    return "?" if shape is None else str(shape)
