"""``hps graph NETWORK_JSON [--dense FILE] [--tensor NAME ...]``: print the inference graph of a
HugeCTR network, and the values of named tensors.

One line per layer in execution order: its line in the file, name, type, input and output
shapes and parameter count; then the prediction, the total number of dense parameters and,
with ``--dense``, whether the dense model file has exactly that many floats. Layers this
engine cannot run are listed with their file position, and the exit code is then 1.

The table stays within :data:`TABLE_WIDTH` columns: an input or output list that does not fit
goes on to a second line, and a longer one is abbreviated to its first names and its length
(``sparse_embedding1, ... (26 inputs)``); the network file, at the printed line, has them all.

With ``--tensor NAME`` (repeatable) and ``--dense``, the network runs once (unfused, NumPy,
float32) on the inputs of ``--inputs FILE.npz`` (``dense`` ``[B, dense_dim]`` and, per
embedding layer, its pooled ``[B, slots, vec]`` vectors under the layer's name) or on
``--random-inputs B`` samples drawn with ``--seed``, and each named tensor is printed: its
shape, then its values (NumPy's print options: long arrays are summarised; ``--full`` prints
every value). ``--tensor list`` names every tensor.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple, TextIO

import numpy as np

from hps_core.cli.arguments import positive_int
from hps_core.errors import ModelFileError, NotAvailableError, RequestError
from hps_core.nn import (
    DenseExecutor,
    NetworkForm,
    NetworkGraph,
    build_graph,
    load_network_json,
    read_dense_blob,
)
from hps_core.nn.dense_blob import check_dense_blob_size
from hps_core.nn.graph import GraphNode
from hps_core.nn.layers.activation import Dropout, LossAsSigmoid
from hps_core.nn.spec.shapes import TensorShape
from hps_core.wording import plural

_FORM_NOTES = {
    NetworkForm.INFERENCE: "inference form",
    NetworkForm.TRAINING: "training form: solver and optimizer ignored",
    NetworkForm.GRAPH: "graph form: layers without a solver",
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
    parser.add_argument(
        "--tensor",
        action="append",
        default=[],
        metavar="NAME",
        help="print this tensor's values (needs --dense and inputs; 'list' names them all)",
    )
    inputs = parser.add_mutually_exclusive_group()
    inputs.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="inputs for --tensor: 'dense' [B, dense_dim] and, per embedding layer, its pooled "
        "[B, slots, vec] vectors under the layer's name",
    )
    inputs.add_argument(
        "--random-inputs", type=positive_int, metavar="B", help="B random samples for --tensor"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --random-inputs")
    parser.add_argument("--full", action="store_true", help="print every value of --tensor")
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
    if getattr(args, "tensor", None) and ok:
        _print_tensors(graph, args, out)
    return 0 if ok else 1


def _print_tensors(graph: NetworkGraph, args: argparse.Namespace, out: TextIO) -> None:
    """Run the network once on the given or random inputs and print the named tensors."""
    names = [graph.spec.data.dense_name]
    names += [top for node in graph.nodes if node.used for top in node.spec.tops]
    names = list(dict.fromkeys(names))
    if args.tensor == ["list"]:
        print(f"tensors: {', '.join(names)}", file=out)
        return
    if args.dense is None:
        raise RequestError("--tensor needs the dense model file (--dense FILE)")
    executor = DenseExecutor(graph, read_dense_blob(args.dense, graph.dense_layout()), fuse=False)
    unknown = [name for name in args.tensor if name not in names]
    if unknown:
        wanted = ", ".join(map(repr, unknown))
        raise RequestError(f"no tensor {wanted}; tensors: {', '.join(names)}")
    dense, pooled = _tensor_inputs(graph, args)
    tensors = executor.tensors(dense, pooled)
    options = {"threshold": sys.maxsize} if args.full else {}
    with np.printoptions(precision=6, suppress=True, **options):
        for name in args.tensor:
            value = tensors[name]
            print(f"tensor '{name}' {value.dtype} {tuple(value.shape)}:", file=out)
            print(value, file=out)


def _tensor_inputs(
    graph: NetworkGraph, args: argparse.Namespace
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    data = graph.spec.data
    layers = {node.spec.name: node.layer for node in graph.embeddings if node.used}
    if args.inputs is None and args.random_inputs is None:
        raise RequestError("--tensor needs inputs: --inputs FILE.npz or --random-inputs B")
    if args.random_inputs is not None:
        rng = np.random.default_rng(args.seed)
        batch = args.random_inputs
        dense = rng.standard_normal((batch, data.dense_dim)).astype(np.float32)
        pooled = {
            name: rng.standard_normal((batch, layer.slot_num, layer.vec_size)).astype(np.float32)
            for name, layer in layers.items()
        }
        return dense, pooled
    with np.load(args.inputs) as npz:
        arrays = {name: npz[name] for name in npz.files}
    missing = [name for name in (data.dense_name, *layers) if name not in arrays]
    if missing:
        raise RequestError(
            f"{args.inputs}: missing arrays {', '.join(map(repr, missing))} (it needs "
            f"'{data.dense_name}' [B, {data.dense_dim}] and each embedding layer's "
            "[B, slots, vec])"
        )
    return arrays[data.dense_name], {name: arrays[name] for name in layers}


def _print_inputs(graph: NetworkGraph, out: TextIO) -> None:
    data = graph.spec.data
    print(f"dense input '{data.dense_name}' (B, {data.dense_dim})", file=out)
    for sparse in data.sparse:
        nnz = "" if sparse.nnz_per_slot is None else f", nnz_per_slot {sparse.nnz_per_slot}"
        print(f"sparse input '{sparse.name}' {plural(sparse.slot_num, 'slot')}{nnz}", file=out)
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
