"""``hps graph NETWORK_JSON [--dense FILE]``: print the inference graph of a HugeCTR network.

One line per layer in execution order: its line in the file, name, type, input and output
shapes and parameter count; then the prediction, the total number of dense parameters and,
with ``--dense``, whether the dense model file has exactly that many floats. Layers this
engine cannot run are listed with their file position, and the exit code is then 1.

The table stays within :data:`TABLE_WIDTH` columns: an input or output list that does not fit
goes on to a second line, and a longer one is abbreviated to its first names and its length
(``sparse_embedding1, ... (26 inputs)``); the network file, at the printed line, has them all.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple, TextIO

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
_GAP = "  "
TABLE_WIDTH = 120
"""Widest line of the layer table (a Concat of 26 embeddings once made 875-column lines)."""
# Layer names and types wider than this are shortened in the middle (their ends differ).
_NAME_WIDTH = 40
# The input and output columns each keep at least this width (or their whole width).
_MIN_LIST_WIDTH = 16
# An input or output list may take this many lines before it is abbreviated.
_LIST_LINES = 2
_ELLIPSIS = "..."


class _Row(NamedTuple):
    """The cells of one layer's row; the lists are laid out once the widths are known."""

    line: str
    layer: str
    type: str
    inputs: tuple[str, ...]
    input_names: tuple[str, ...]
    outputs: tuple[str, ...]
    params: str


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
    rows = [_row(graph, node) for node in graph.nodes]

    def width(header: str, cells: list[str]) -> int:
        return max([len(header), *(len(cell) for cell in cells)])

    line_w = width(_COLUMNS[0], [r.line for r in rows])
    layer_w = width(_COLUMNS[1], [r.layer for r in rows])
    type_w = width(_COLUMNS[2], [r.type for r in rows])
    params_w = width(_COLUMNS[5], [r.params for r in rows])
    room = TABLE_WIDTH - line_w - layer_w - type_w - params_w - len(_GAP) * (len(_COLUMNS) - 1)
    inputs_full = width(_COLUMNS[3], [", ".join(r.inputs) for r in rows])
    outputs_full = width(_COLUMNS[4], [", ".join(r.outputs) for r in rows])
    # Outputs are short (shapes only): they keep their width unless the inputs would be
    # squeezed below the minimum; the inputs take what is left.
    outputs_room = max(_MIN_LIST_WIDTH, room - min(inputs_full, _MIN_LIST_WIDTH))
    inputs_room = max(min(inputs_full, _MIN_LIST_WIDTH), room - min(outputs_full, outputs_room))
    laid_out = [
        (
            _fit_list(r.inputs, r.input_names, "inputs", inputs_room),
            _fit_list(r.outputs, r.outputs, "outputs", outputs_room),
        )
        for r in rows
    ]
    widths = [
        line_w,
        layer_w,
        type_w,
        width(_COLUMNS[3], [line for ins, _ in laid_out for line in ins]),
        width(_COLUMNS[4], [line for _, outs in laid_out for line in outs]),
        params_w,
    ]
    _print_cells(_COLUMNS, widths, out)
    for row, (inputs, outputs) in zip(rows, laid_out, strict=True):
        for i in range(max(len(inputs), len(outputs))):
            first = i == 0
            _print_cells(
                (
                    row.line if first else "",
                    row.layer if first else "",
                    row.type if first else "",
                    inputs[i] if i < len(inputs) else "",
                    outputs[i] if i < len(outputs) else "",
                    row.params if first else "",
                ),
                widths,
                out,
            )


def _print_cells(cells: tuple[str, ...], widths: list[int], out: TextIO) -> None:
    # Numbers (line, params) are right-aligned, text left-aligned.
    padded = [
        cell.rjust(w) if i in (0, 5) else cell.ljust(w)
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
    ]
    print(_GAP.join(padded).rstrip(), file=out)


def _fit_list(items: tuple[str, ...], names: tuple[str, ...], noun: str, width: int) -> list[str]:
    """Lay ``items`` out in lines of at most ``width`` characters.

    Args:
        items: the cells of the list, e.g. ``fc1 (B, 16)``.
        names: shorter forms of the same cells (``fc1``), used when abbreviating.
        noun: what the items are (``inputs``), for the count of an abbreviated list.
        width: the column width.

    Returns:
        The whole list on up to :data:`_LIST_LINES` lines, else all its names (shapes are
        in the rows of the layers that make them) on that many lines, else one line with
        the first names that fit and the count: ``data1, data2, ... (26 inputs)``.
    """
    for cells in (items, names):
        lines = _wrap(cells, width)
        if len(lines) <= _LIST_LINES:
            return lines
    count = f"{_ELLIPSIS} ({len(items)} {noun})"
    for keep in range(len(names) - 1, 0, -1):
        text = ", ".join([*names[:keep], count])
        if len(text) <= width:
            return [text]
    return [_clip(count, width)]


def _wrap(items: tuple[str, ...], width: int) -> list[str]:
    """Items joined by ``", "``, broken after a comma where a line would pass ``width``."""
    lines: list[str] = []
    line = ""
    for i, item in enumerate(items):
        piece = item if i == len(items) - 1 else item + ","
        if line and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = ""
        line = _clip(piece, width) if not line else f"{line} {piece}"
    if line or not lines:
        lines.append(line)
    return lines


def _clip(text: str, width: int) -> str:
    """``text``, shortened in the middle to ``width`` characters if longer."""
    if len(text) <= width:
        return text
    if width <= len(_ELLIPSIS):
        return text[:width]
    head = (width - len(_ELLIPSIS) + 1) // 2
    tail = width - len(_ELLIPSIS) - head
    return text[:head] + _ELLIPSIS + (text[-tail:] if tail else "")


def _row(graph: NetworkGraph, node: GraphNode) -> _Row:
    spec = node.spec
    sparse = {s.name for s in graph.spec.data.sparse}
    inputs = tuple(
        f"{name} (sparse)" if name in sparse else f"{name} {_shape(shape)}"
        for name, shape in zip(node.inputs, node.input_shapes, strict=True)
    )
    outputs = tuple(_shape(shape) for shape in node.output_shapes)
    layer_type = spec.type
    if isinstance(node.layer, LossAsSigmoid):
        layer_type += " -> Sigmoid"
    elif isinstance(node.layer, Dropout):
        layer_type += " (identity)"
    name = _clip(spec.name, _NAME_WIDTH)
    if not node.used:
        name += " *"
    params = f"{node.param_count:,}" if node.param_count else "-"
    return _Row(
        str(spec.line),
        name,
        _clip(layer_type, _NAME_WIDTH),
        inputs,
        tuple(node.inputs),
        outputs,
        params,
    )


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
