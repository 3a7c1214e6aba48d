"""The inference DAG of a HugeCTR network: tensor wiring, topological order, shapes, and the
layout of the dense parameters.

Building never stops at the first layer it cannot run: such layers (and what depends on them)
are kept with unknown shapes and listed in :attr:`NetworkGraph.cannot_run`, so a tool can
report all of them at once. Wiring and shape errors are hard errors, raised together as one
:class:`~hps_core.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hps_core.errors import ConfigError, NotAvailableError, Problem
from hps_core.nn.dense_blob import DenseLayout, LayerParams
from hps_core.nn.layers import (
    DENSE_LAYERS,
    EMBEDDING_TYPES,
    NOT_RUNNABLE,
    NOT_RUNNABLE_TRAINABLE,
    EmbeddingLayer,
    Layer,
)
from hps_core.nn.spec.network_json import LayerSpec, NetworkSpec
from hps_core.nn.spec.shapes import TensorShape


@dataclass(frozen=True)
class GraphNode:
    """One layer of the graph.

    Args:
        spec: the layer as written in the file.
        layer: the runnable layer, or ``None`` when it cannot run (or its inputs are unknown).
        inputs: the bottoms its forward pass reads.
        input_shapes: their shapes (``None`` where unknown).
        used: whether the prediction depends on it.
    """

    spec: LayerSpec
    layer: Layer | None
    inputs: tuple[str, ...]
    input_shapes: tuple[TensorShape | None, ...]
    used: bool

    @property
    def output_shapes(self) -> tuple[TensorShape | None, ...]:
        """Shapes of the tops (``None`` where unknown)."""
        if self.layer is None:
            return (None,) * len(self.spec.tops)
        return self.layer.output_shapes

    @property
    def param_count(self) -> int:
        """Number of dense parameters (0 when unknown)."""
        return sum(p.size for p in self.layer.param_shapes()) if self.layer else 0


@dataclass(frozen=True)
class NetworkGraph:
    """A network ready to be executed or reported.

    Args:
        spec: the parsed file.
        nodes: every layer after ``Data`` in topological order (file order among ties).
        output: the prediction tensor (HugeCTR's rule: the last top of the last layer; for a
            multi-task network, the Concat of every task's prediction that building adds).
        cannot_run: one problem per layer whose type this engine cannot run.
        tensor_shapes: shape of every tensor whose shape is known.
    """

    spec: NetworkSpec
    nodes: tuple[GraphNode, ...]
    output: str
    cannot_run: tuple[Problem, ...]
    tensor_shapes: Mapping[str, TensorShape]

    @property
    def output_shape(self) -> TensorShape | None:
        """Shape of the prediction, ``None`` when unknown."""
        return self.tensor_shapes.get(self.output)

    @property
    def embeddings(self) -> tuple[GraphNode, ...]:
        """Embedding layers in file order, which is HugeCTR's order of embedding tables."""
        nodes = [n for n in self.nodes if isinstance(n.layer, EmbeddingLayer)]
        return tuple(sorted(nodes, key=lambda n: n.spec.index))

    def require_runnable(self) -> None:
        """Raise unless every layer can run.

        Raises:
            NotAvailableError: listing each layer that cannot run, with its line.
        """
        if self.cannot_run:
            lines = "\n".join(str(p) for p in self.cannot_run)
            raise NotAvailableError(
                f"the network has layers this engine cannot run:\n{lines}", self.cannot_run
            )

    def dense_layout(self) -> DenseLayout:
        """The dense model file layout: trainable layers in file order, as HugeCTR writes it.

        Returns:
            The layout.

        Raises:
            NotAvailableError: a layer's parameters are unknown (type not runnable).
        """
        unknown = []
        layers = []
        for node in sorted(self.nodes, key=lambda n: n.spec.index):
            spec = node.spec
            if node.layer is None and _may_have_params(spec.type):
                unknown.append(f"{spec.where()} ({spec.type})")
            elif node.layer is not None and (
                node.layer.param_shapes() or node.layer.state_shapes()
            ):
                layers.append(
                    LayerParams(
                        spec.name, spec.type, spec.where(), node.layer.param_shapes(),
                        node.layer.state_shapes(),
                    )
                )  # fmt: skip
        if unknown:
            raise NotAvailableError(
                "the dense parameter layout is unknown because of: " + "; ".join(unknown)
            )
        return DenseLayout(tuple(layers))


def build_graph(spec: NetworkSpec) -> NetworkGraph:
    """Wire the layers of ``spec``, order them and infer every shape.

    Args:
        spec: the parsed network file.

    Returns:
        The graph.

    Raises:
        ConfigError: duplicate tops, missing bottoms, cycles, misuse of the label or sparse
            inputs, invalid layer fields, or shapes that do not fit; all problems at once.
    """
    spec = _with_multi_task_output(spec)
    problems: list[Problem] = []
    producers = _producers(spec, problems)
    consumed = [_consumed_bottoms(layer, problems) for layer in spec.layers]
    _check_bottoms(spec, producers, consumed, problems)
    if problems:
        raise ConfigError(problems)
    deps = [
        {producers[b] for b in bottoms if isinstance(producers[b], int)} for bottoms in consumed
    ]
    order = _topological_order(spec.layers, deps)
    shapes, layers, cannot_run = _infer(spec, order, consumed, problems)
    if problems:
        raise ConfigError(problems)
    used = _ancestors(len(spec.layers) - 1, deps)
    nodes = tuple(
        GraphNode(
            spec=spec.layers[i],
            layer=layers[i],
            inputs=consumed[i],
            input_shapes=tuple(shapes.get(b) for b in consumed[i]),
            used=i in used,
        )
        for i in order
    )
    known = {name: shape for name, shape in shapes.items() if shape is not None}
    return NetworkGraph(spec, nodes, spec.layers[-1].tops[-1], tuple(cannot_run), known)


LOSS_TYPES = frozenset({"BinaryCrossEntropyLoss", "MultiCrossEntropyLoss", "CrossEntropyLoss"})
MULTI_TASK_OUTPUT = "multi_task_combined_pred"


def _with_multi_task_output(spec: NetworkSpec) -> NetworkSpec:
    """A multi-task network (MMoE, shared-bottom: one loss layer per task) predicts every
    task: as HugeCTR's inference did, each loss becomes a Sigmoid (a Softmax for
    ``CrossEntropyLoss``) of its prediction and a Concat (axis 1) joins them in the order the
    losses appear in the file, as the network's last layer ``multi_task_combined_pred``."""
    losses = [layer for layer in spec.layers if layer.type in LOSS_TYPES]
    if len(losses) < 2:
        return spec
    tops = [layer.tops[0] for layer in losses]
    raw = {"name": MULTI_TASK_OUTPUT, "type": "Concat", "bottom": tops, "top": MULTI_TASK_OUTPUT}
    joined = LayerSpec(
        len(spec.layers), losses[-1].line, spec.source, MULTI_TASK_OUTPUT, "Concat",
        tuple(tops), (MULTI_TASK_OUTPUT,), raw,
    )  # fmt: skip
    return dataclasses.replace(spec, layers=(*spec.layers, joined))


def _producers(spec: NetworkSpec, problems: list[Problem]) -> dict[str, int | str]:
    """Map each tensor to the index of the layer producing it, or to an input kind."""
    data = spec.data
    producers: dict[str, int | str] = {data.dense_name: "dense"}
    producers.update({name: "label" for name in data.label_names})
    producers.update({sparse.name: "sparse" for sparse in data.sparse})
    names: dict[str, LayerSpec] = {}
    for index, layer in enumerate(spec.layers):
        if layer.name in names:
            message = f"layer name '{layer.name}' is also used at line {names[layer.name].line}"
            problems.append(Problem(layer.where("name"), message))
        names[layer.name] = layer
        for top in layer.tops:
            if top in layer.bottoms:
                problems.append(Problem(layer.where("top"), f"'{top}' is also one of its bottoms"))
            elif top in producers:
                other = producers[top]
                owner = f"layer '{spec.layers[other].name}'" if isinstance(other, int) else "Data"
                problems.append(
                    Problem(layer.where("top"), f"'{top}' is already produced by {owner}")
                )
            else:
                producers[top] = index
    return producers


def _consumed_bottoms(layer: LayerSpec, problems: list[Problem]) -> tuple[str, ...]:
    layer_class = DENSE_LAYERS.get(layer.type)
    if layer_class is None:
        return layer.bottoms
    try:
        return layer_class.consumed_bottoms(layer)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return layer.bottoms


_EMBEDDING_COLLECTION_HINT = (
    "; sparse input {} feeds no embedding layer: if an EmbeddingCollection produced this "
    "tensor, HugeCTR's graph_to_json leaves it out of the file (it writes SparseEmbedding "
    "layers only), so add a LocalizedSlotSparseEmbeddingHash layer over that input with this "
    "top and serve its tables as ps.json sparse files"
)


def _check_bottoms(
    spec: NetworkSpec,
    producers: Mapping[str, int | str],
    consumed: Sequence[tuple[str, ...]],
    problems: list[Problem],
) -> None:
    embedded = {b for layer in spec.layers if layer.type in EMBEDDING_TYPES for b in layer.bottoms}
    unread = [sparse.name for sparse in spec.data.sparse if sparse.name not in embedded]
    for layer, reads in zip(spec.layers, consumed, strict=True):
        embedding = layer.type in EMBEDDING_TYPES
        for bottom in layer.bottoms:
            kind = producers.get(bottom)
            if kind is None:
                message = f"no layer or input produces '{bottom}'"
                if unread and not embedding:
                    message += _EMBEDDING_COLLECTION_HINT.format(
                        ", ".join(f"'{n}'" for n in unread)
                    )
                problems.append(Problem(layer.where("bottom"), message))
            elif embedding and kind != "sparse":
                problems.append(
                    Problem(layer.where("bottom"), f"'{bottom}' is not a sparse input of Data")
                )
            elif kind == "sparse" and layer.type in DENSE_LAYERS:
                problems.append(
                    Problem(
                        layer.where("bottom"),
                        f"sparse input '{bottom}' can only feed an embedding layer",
                    )
                )
            elif kind == "label" and bottom in reads:
                problems.append(
                    Problem(
                        layer.where("bottom"),
                        f"reads the label '{bottom}', which inference does not have",
                    )
                )


def _topological_order(layers: Sequence[LayerSpec], deps: Sequence[set[int]]) -> list[int]:
    waiting = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in layers]
    for index, d in enumerate(deps):
        for producer in d:
            users[producer].append(index)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(layers):
        stuck = [layers[i] for i, n in enumerate(waiting) if n > 0]
        names = ", ".join(f"'{layer.name}' (line {layer.line})" for layer in stuck)
        raise ConfigError(
            Problem(stuck[0].where("bottom"), f"the layers form a cycle among: {names}")
        )
    return order


def _infer(
    spec: NetworkSpec,
    order: Sequence[int],
    consumed: Sequence[tuple[str, ...]],
    problems: list[Problem],
) -> tuple[dict[str, TensorShape | None], dict[int, Layer | None], list[Problem]]:
    shapes: dict[str, TensorShape | None] = {
        spec.data.dense_name: TensorShape(1, (spec.data.dense_dim,))
    }
    sparse = {s.name: s for s in spec.data.sparse}
    layers: dict[int, Layer | None] = {}
    cannot_run: list[Problem] = []
    for index in order:
        layer_spec = spec.layers[index]
        layer = None
        try:
            if layer_spec.type in EMBEDDING_TYPES:
                layer = EmbeddingLayer.from_sparse(layer_spec, sparse[layer_spec.bottoms[0]])
            elif layer_spec.type in DENSE_LAYERS:
                inputs = [shapes.get(b) for b in consumed[index]]
                if all(shape is not None for shape in inputs):
                    layer = DENSE_LAYERS[layer_spec.type].build(layer_spec, inputs)
            else:
                cannot_run.append(_cannot_run(layer_spec))
        except ConfigError as exc:
            problems.extend(exc.problems)
        layers[index] = layer
        outputs = layer.output_shapes if layer else (None,) * len(layer_spec.tops)
        shapes.update(zip(layer_spec.tops, outputs, strict=True))
    return shapes, layers, cannot_run


def _cannot_run(layer: LayerSpec) -> Problem:
    if layer.type in NOT_RUNNABLE:
        message = f"type '{layer.type}' is a HugeCTR layer this engine cannot run yet"
    else:
        known = [*DENSE_LAYERS, *NOT_RUNNABLE, *EMBEDDING_TYPES]
        close = difflib.get_close_matches(layer.type, known, n=1, cutoff=0.75)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        message = f"unknown layer type '{layer.type}'{hint}"
    return Problem(layer.where("type"), message)


def _may_have_params(layer_type: str) -> bool:
    if layer_type in DENSE_LAYERS:
        return DENSE_LAYERS[layer_type].trainable
    if layer_type in NOT_RUNNABLE or layer_type in EMBEDDING_TYPES:
        return layer_type in NOT_RUNNABLE_TRAINABLE
    return True  # an unknown type may have any parameters


def _ancestors(index: int, deps: Sequence[set[int]]) -> set[int]:
    seen = {index}
    stack = [index]
    while stack:
        for producer in deps[stack.pop()]:
            if producer not in seen:
                seen.add(producer)
                stack.append(producer)
    return seen
