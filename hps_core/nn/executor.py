"""Run the dense network of a HugeCTR graph: dense features + embeddings -> predictions.

The executor turns the graph into a flat plan once: only layers the prediction depends on,
in topological order, an InnerProduct fused with a ReLU that is its only consumer, and each
intermediate tensor released after its last use. Parameters are uploaded once, in the compute
precision. The same plan runs on NumPy (CPU instances) or CuPy (GPU instances).

:meth:`DenseExecutor.profile` runs the same plan with a clock mark after each step (see
:mod:`hps_core.nn.profile`); :meth:`DenseExecutor.forward` runs it without any.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from hps_core.errors import ModelFileError, RequestError
from hps_core.nn.dense_blob import read_dense_blob
from hps_core.nn.graph import GraphNode, NetworkGraph, build_graph
from hps_core.nn.layers import Array, EmbeddingLayer, InnerProduct, Layer, UnpooledEmbedding
from hps_core.nn.layers.activation import ReLU
from hps_core.nn.layers.shape_ops import Concat, Reshape
from hps_core.nn.profile import ForwardProfile, LayerTime, StepClock, layer_flops, step_clock
from hps_core.nn.spec.network_json import load_network_json
from hps_core.nn.spec.precision import ComputeContext, PaddedBatch, Precision
from hps_core.nn.spec.shapes import TensorShape

#: What the executor accepts for one embedding layer: pooled ``[batch, slots, vec]`` (or
#: ``[batch, slots * vec]``) vectors, or the unpooled vectors with their row offsets.
EmbeddingInput = Array | UnpooledEmbedding


@dataclass(frozen=True)
class _Step:
    name: str
    layer: Layer
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[Array, ...]
    release: tuple[str, ...]
    # For profiling: the layers the step runs (a fused ReLU included), its type and the
    # shapes of its inputs.
    covers: tuple[str, ...]
    layer_type: str
    input_shapes: tuple[TensorShape, ...]


@dataclass(frozen=True)
class PooledConcat:
    """A Concat of ``[B, w]`` tensors, one of which is the embedding Concat's output flattened
    by a Reshape (DLRM-v2's embeddings beside the bottom MLP's output): a caller that pools
    the embeddings straight into the columns ``[at, at + S * D)`` of that Concat's output
    gives the output (see :meth:`DenseExecutor.forward_given`), and the executor copies only
    the other inputs into their columns, not every pooled vector once more.

    Args:
        output: the Concat's output.
        width: its columns per sample.
        at: the first column of the embeddings.
        flat: the Reshape's output (the embeddings as ``[B, S * D]``).
        copied: the Concat's other inputs and their columns ``[first, stop)``.
    """

    output: str
    width: int
    at: int
    flat: str
    copied: tuple[tuple[str, int, int], ...]


class DenseExecutor:
    """Forward pass of a HugeCTR dense network.

    Args:
        graph: a graph whose layers can all run.
        params: layer name -> float32 tensors in dense-model-file order (as
            :func:`~hps_core.nn.dense_blob.read_dense_blob` returns).
        xp: ``numpy`` or ``cupy``; parameters are uploaded to it.
        precision: ``"fp32"`` (default), ``"tf32"`` or ``"fp16"`` (see
            :mod:`hps_core.nn.spec.precision`).
        fuse: fuse each ReLU into the InnerProduct it alone reads (the ReLU's output then
            replaces the InnerProduct's); ``False`` keeps every layer's own output, for
            :meth:`tensors`.

    Raises:
        NotAvailableError: a layer cannot run, or the precision cannot run on this device.
        ModelFileError: ``params`` does not match the graph's dense layout.

    Example:
        >>> executor = DenseExecutor.from_files("dlrm.json", "dlrm_dense.model")  # doctest: +SKIP
        >>> executor.forward(dense, {"sparse_embedding1": pooled}).shape  # doctest: +SKIP
        (1024, 1)
    """

    def __init__(
        self,
        graph: NetworkGraph,
        params: Mapping[str, Sequence[np.ndarray]],
        xp: ModuleType = np,
        precision: str | Precision = Precision.FP32,
        fuse: bool = True,
    ) -> None:
        graph.require_runnable()
        self.graph = graph
        self.ctx = ComputeContext(xp, Precision.parse(precision))
        _check_params(graph, params)
        self._steps = _plan(graph, params, self.ctx, fuse)
        self.embedding_layers: tuple[EmbeddingLayer, ...] = tuple(
            node.layer for node in graph.embeddings if node.used
        )
        self._embedding_names = tuple(n.spec.name for n in graph.embeddings if n.used)
        #: Whether a sample's prediction depends on the other samples of its batch (a layer
        #: takes statistics over the batch, as DIN's Dice does): then a batch must not be
        #: padded with extra rows.
        self.batch_dependent = any(step.layer.batch_dependent for step in self._steps)

    @classmethod
    def from_files(
        cls,
        network_file: str | Path,
        dense_file: str | Path,
        xp: ModuleType = np,
        precision: str | Precision = Precision.FP32,
    ) -> DenseExecutor:
        """Build an executor from a network JSON file and its dense model file.

        Args:
            network_file: HugeCTR network JSON (inference or training form).
            dense_file: HugeCTR dense model file.
            xp: ``numpy`` or ``cupy``.
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``.

        Returns:
            The executor.
        """
        graph = build_graph(load_network_json(network_file))
        graph.require_runnable()
        params = read_dense_blob(dense_file, graph.dense_layout())
        return cls(graph, params, xp, precision)

    @property
    def embedding_names(self) -> tuple[str, ...]:
        """Names of the embedding layers :meth:`forward` needs, in file (table) order."""
        return self._embedding_names

    def forward(
        self,
        dense: Array,
        embeddings: Mapping[str, EmbeddingInput],
        out: Array | None = None,
    ) -> Array:
        """Compute the predictions of one batch.

        Args:
            dense: ``[batch, dense_dim]`` dense features.
            embeddings: embedding layer name -> its vectors for this batch.
            out: optional C-contiguous float32 array of the prediction's shape to write into.

        Returns:
            float32 ``[batch, width]`` predictions (``out`` when given).

        Raises:
            RequestError: a missing, unexpected or mis-shaped input.
        """
        return _deliver(self._run(dense, embeddings, None), out)

    def embedding_tops(self) -> tuple[str, ...]:
        """The output tensor of each embedding layer :meth:`forward` needs, in table order."""
        tops = {step.name: step.outputs[0] for step in self._steps}
        return tuple(tops[name] for name in self._embedding_names)

    def embedding_concat(self) -> str | None:
        """The output of a Concat that stacks every embedding layer's output, if there is one.

        DLRM-style networks concatenate ``[B, S_t, D]`` embeddings of all tables along the slot
        axis; a producer that writes each table straight into its slice of that tensor makes
        the Concat free (see :meth:`forward_given`).

        Returns:
            The Concat's output name when it reads exactly the embedding outputs, in table
            order, along axis 1 of 3-D tensors of one width; else ``None``.
        """
        tops = self.embedding_tops()
        for step in self._steps:
            layer = step.layer
            if isinstance(layer, Concat) and step.inputs == tops and layer.axis == 1:
                shapes = step.input_shapes
                if all(s.rank == 3 and s.dims[1] == shapes[0].dims[1] for s in shapes):
                    return step.outputs[0]
        return None

    @functools.cached_property
    def pooled_concat(self) -> PooledConcat | None:
        """The Concat a caller can pool the embeddings into (see :class:`PooledConcat`): when
        the output of :meth:`embedding_concat` feeds one Reshape to ``[B, S * D]`` alone, and
        that feeds one Concat of 2-D tensors alone; else ``None``."""
        stacked = self.embedding_concat()
        if stacked is None:
            return None
        reshape = self._sole_reader(stacked)
        if reshape is None or not isinstance(reshape.layer, Reshape) or reshape.layer.selected:
            return None
        flat = reshape.outputs[0]
        concat = self._sole_reader(flat)
        if concat is None or not isinstance(concat.layer, Concat) or concat.layer.axis != 1:
            return None
        shapes = concat.input_shapes
        if concat.inputs.count(flat) != 1 or any(
            s.rank != 2 or s.rows_per_sample != 1 for s in shapes
        ):
            return None
        columns, at = {}, 0
        for name, shape in zip(concat.inputs, shapes, strict=True):
            columns[name] = (at, at + shape.dims[0])
            at += shape.dims[0]
        copied = tuple((n, a, b) for n, (a, b) in columns.items() if n != flat)
        return PooledConcat(concat.outputs[0], at, columns[flat][0], flat, copied)

    def reads_of_given(self, names: Collection[str]) -> frozenset[str]:
        """Which of the tensors ``names``, given to :meth:`forward_given`, the pass reads
        (the others only stand for the steps that would make them).

        Example:
            >>> executor.reads_of_given({"sparse_embedding1", "concat1"})  # doctest: +SKIP
            frozenset({'concat1'})
        """
        given, read = set(names), set()
        pooled = self.pooled_concat
        for step in self._steps:
            if pooled is not None and step.outputs[0] == pooled.output and pooled.output in given:
                read.add(pooled.output)  # its other inputs are copied into it
            elif not all(name in given for name in step.outputs):
                read.update(name for name in step.inputs if name in given)
        return frozenset(read)

    def _sole_reader(self, name: str) -> _Step | None:
        """The one step that reads tensor ``name``, if exactly one does (once)."""
        readers = [step for step in self._steps if name in step.inputs]
        return readers[0] if len(readers) == 1 and readers[0].inputs.count(name) == 1 else None

    def forward_given(
        self,
        dense: Array,
        given: Mapping[str, Array],
        prefix_done: bool = False,
        samples: Array | None = None,
    ) -> Array:
        """Compute the predictions from the dense input and already computed tensors.

        A step whose outputs are all in ``given`` is skipped; so a caller that pools the
        embeddings itself passes each embedding layer's output (``[B, S_t, D]``), or the
        output of :meth:`embedding_concat` (then that Concat is skipped too), or the output
        of :attr:`pooled_concat` holding the embeddings in their columns (then that Concat
        only copies its other inputs into theirs). Nothing is checked against the host's data,
        so the pass never waits for the GPU and can be recorded in a CUDA graph.

        Args:
            dense: ``[batch, dense_dim]`` dense features.
            given: tensor name -> array in the storage dtype.
            prefix_done: ``given`` holds the outputs of :meth:`forward_dense_prefix`: skip the
                prefix's steps.
            samples: for a batch padded to ``dense``'s rows, an int32 array (of the pass's
                array module) whose first element is the number of real samples, read where
                the pass runs: layers that take statistics over the batch skip the padding
                (:class:`~hps_core.nn.spec.precision.PaddedBatch`), so a batch-dependent
                network too can be recorded once per padded size. None: every row is real.

        Returns:
            float32 ``[batch, width]`` predictions.

        Raises:
            RequestError: a step needs a tensor that neither ``given`` nor an earlier step
                provides.
        """
        xp, data = self.ctx.xp, self.graph.spec.data
        batch = dense.shape[0]
        ctx = self.ctx
        if samples is not None and self.batch_dependent:
            ctx = dataclasses.replace(ctx, padded=PaddedBatch(samples, batch))
        tensors = dict(given)
        tensors[data.dense_name] = ctx.cast(xp.asarray(dense))
        skipped = self._dense_prefix if prefix_done else frozenset()
        pooled = self.pooled_concat
        for step in self._steps:
            if step.name in skipped:
                continue
            if pooled is not None and step.outputs[0] == pooled.output and pooled.output in given:
                wide = tensors[pooled.output]
                for name, first, stop in pooled.copied:
                    wide[:, first:stop] = tensors[name]
                continue
            if all(name in given for name in step.outputs):
                continue
            missing = [name for name in step.inputs if name not in tensors]
            if missing or isinstance(step.layer, EmbeddingLayer):
                raise RequestError(f"step '{step.name}' needs tensors not given: {missing}")
            outputs = step.layer.forward(ctx, [tensors[name] for name in step.inputs], step.params)
            tensors.update(zip(step.outputs, outputs, strict=True))
            for name in step.release:
                tensors.pop(name, None)
        return tensors[self.graph.output].reshape(batch, -1).astype(np.float32, copy=False)

    def forward_dense_prefix(self, dense: Array) -> dict[str, Array]:
        """Run the steps that depend on the dense input alone (DLRM's bottom MLP), so that a
        caller can overlap them with the embedding lookup.

        Args:
            dense: ``[batch, dense_dim]`` dense features.

        Returns:
            The prefix's outputs that later steps read, by name: pass them to
            :meth:`forward_given` with the embeddings, which then skips the prefix. Empty when
            no step depends on the dense input alone.
        """
        xp, data = self.ctx.xp, self.graph.spec.data
        tensors = {data.dense_name: self.ctx.cast(xp.asarray(dense))}
        prefix = self._dense_prefix
        for step in self._steps:
            if step.name not in prefix:
                continue
            outputs = step.layer.forward(
                self.ctx, [tensors[name] for name in step.inputs], step.params
            )
            tensors.update(zip(step.outputs, outputs, strict=True))
        later = {name for step in self._steps if step.name not in prefix for name in step.inputs}
        return {
            name: array
            for name, array in tensors.items()
            if name in later and name != data.dense_name
        }

    @property
    def dense_prefix_steps(self) -> frozenset[str]:
        """Names of the steps :meth:`forward_dense_prefix` runs."""
        return self._dense_prefix

    @functools.cached_property
    def _dense_prefix(self) -> frozenset[str]:
        """Steps whose inputs all come, directly or through earlier such steps, from the dense
        input (none in a batch-dependent network: the prefix runs without the batch's count of
        real samples, which its statistics would need)."""
        if self.batch_dependent:
            return frozenset()
        known = {self.graph.spec.data.dense_name}
        names = set()
        for step in self._steps:
            if (
                step.inputs
                and not isinstance(step.layer, EmbeddingLayer)
                and all(name in known for name in step.inputs)
            ):
                names.add(step.name)
                known.update(step.outputs)
        return frozenset(names)

    def profile(self, dense: Array, embeddings: Mapping[str, EmbeddingInput]) -> ForwardProfile:
        """Run :meth:`forward` once, timing each step of the plan.

        Times are CUDA-event times on CuPy and host-clock times on NumPy (see
        :mod:`hps_core.nn.profile`); the call returns after the pass has completed.

        Args:
            dense: ``[batch, dense_dim]`` dense features.
            embeddings: embedding layer name -> its vectors for this batch.

        Returns:
            One :class:`~hps_core.nn.profile.LayerTime` per step, the whole pass's time, and
            the predictions.

        Raises:
            RequestError: a missing, unexpected or mis-shaped input.
        """
        clock = step_clock(self.ctx.xp)
        clock.mark()
        predictions = self._run(dense, embeddings, clock)
        clock.mark()
        # Marks: start, after the input cast, after each step, after the output conversion.
        intervals = clock.intervals()
        batch = predictions.shape[0]
        layers = tuple(
            LayerTime(
                step.name,
                step.covers,
                step.layer_type,
                seconds,
                layer_flops(step.layer, step.input_shapes, batch),
            )
            for step, seconds in zip(self._steps, intervals[1:-1], strict=True)
        )
        return ForwardProfile(batch, layers, sum(intervals), predictions)

    def step_flops(self, batch: int) -> tuple[tuple[str, int], ...]:
        """Arithmetic work of each step for ``batch`` samples, without running anything.

        Args:
            batch: samples in the batch.

        Returns:
            ``(step name, FLOPs)`` per step in execution order (see
            :func:`~hps_core.nn.profile.layer_flops`).
        """
        return tuple(
            (step.name, layer_flops(step.layer, step.input_shapes, batch)) for step in self._steps
        )

    def unfused(self) -> DenseExecutor:
        """The same network, parameters, array module and precision without ReLU fusion (for
        :meth:`tensors`, where each InnerProduct's own output is wanted).

        Returns:
            A new executor (its parameters are copied back to the host and uploaded again).
        """
        xp = self.ctx.xp
        params = {
            step.name: tuple(np.asarray(xp.asnumpy(p) if xp is not np else p) for p in step.params)
            for step in self._steps
            if step.params
        }
        return DenseExecutor(self.graph, params, xp, self.ctx.precision, fuse=False)

    def tensors(self, dense: Array, embeddings: Mapping[str, EmbeddingInput]) -> dict[str, Array]:
        """Run :meth:`forward` keeping every named tensor (for debugging a model, as HugeCTR's
        ``check_out_tensor``): nothing is released after its last use. Build the executor
        with ``fuse=False`` to see each InnerProduct's output before its ReLU.

        Args:
            dense: ``[batch, dense_dim]`` dense features.
            embeddings: embedding layer name -> its vectors for this batch.

        Returns:
            Every tensor of the network by name, in execution order: the dense input, each
            embedding layer's pooled output and each step's outputs (the storage dtype; the
            prediction as :meth:`forward` returns it under the network's output name).

        Raises:
            RequestError: a missing, unexpected or mis-shaped input.
        """
        kept: dict[str, Array] = {}
        predictions = self._run(dense, embeddings, None, kept)
        kept[self.graph.output] = predictions
        return kept

    def _run(
        self,
        dense: Array,
        embeddings: Mapping[str, EmbeddingInput],
        clock: StepClock | None,
        kept: dict[str, Array] | None = None,
    ) -> Array:
        """The forward pass; with a clock, a mark after the input cast and after each step;
        with ``kept``, every tensor is also stored there by name."""
        xp, data = self.ctx.xp, self.graph.spec.data
        dense = xp.asarray(dense)
        if dense.ndim != 2 or dense.shape[1] != data.dense_dim or dense.dtype.kind not in "fiu":
            raise RequestError(
                f"dense input '{data.dense_name}' must be numeric [batch, {data.dense_dim}], "
                f"got {dense.dtype} {dense.shape}"
            )
        batch = dense.shape[0]
        _check_embedding_names(self._embedding_names, embeddings)
        tensors = {data.dense_name: self.ctx.cast(dense)}
        if kept is not None:
            kept.update(tensors)
        if clock is not None:
            clock.mark()
        for step in self._steps:
            if isinstance(step.layer, EmbeddingLayer):
                outputs = step.layer.forward(self.ctx, [embeddings[step.name]], ())
                if outputs[0].shape[0] != batch:
                    raise RequestError(
                        f"embedding '{step.name}' has {outputs[0].shape[0]} samples, the dense "
                        f"input has {batch}"
                    )
            else:
                outputs = step.layer.forward(
                    self.ctx, [tensors[name] for name in step.inputs], step.params
                )
            tensors.update(zip(step.outputs, outputs, strict=True))
            if kept is not None:
                kept.update(zip(step.outputs, outputs, strict=True))
            for name in step.release:
                del tensors[name]
            if clock is not None:
                clock.mark()
        return tensors[self.graph.output].reshape(batch, -1).astype(np.float32, copy=False)


def _deliver(result: Array, out: Array | None) -> Array:
    """``result``, or ``out`` after copying ``result`` into it."""
    if out is None:
        return result
    if out.shape != result.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise RequestError(
            f"out must be C-contiguous float32 {result.shape}, got {out.dtype} {out.shape}"
        )
    out[...] = result
    return out


def _check_params(graph: NetworkGraph, params: Mapping[str, Sequence[np.ndarray]]) -> None:
    layout = graph.dense_layout()
    expected = {layer.layer for layer in layout.layers}
    extra = sorted(set(params) - expected)
    if extra:
        raise ModelFileError(f"dense parameters for layers the network has not: {extra}")
    for layer in layout.layers:
        tensors = params.get(layer.layer)
        shapes = (*layer.params, *layer.state)
        if tensors is None or len(tensors) != len(shapes):
            count = "none" if tensors is None else len(tensors)
            raise ModelFileError(
                f"layer '{layer.layer}' ({layer.where}) needs {len(shapes)} parameter "
                f"tensors, got {count}"
            )
        for shape, tensor in zip(shapes, tensors, strict=True):
            if tuple(np.shape(tensor)) != shape.shape:
                raise ModelFileError(
                    f"layer '{layer.layer}' ({layer.where}) {shape.name} must have shape "
                    f"{shape.shape}, got {tuple(np.shape(tensor))}"
                )


def _plan(
    graph: NetworkGraph,
    params: Mapping[str, Sequence[np.ndarray]],
    ctx: ComputeContext,
    fuse: bool = True,
) -> tuple[_Step, ...]:
    nodes = [n for n in graph.nodes if n.used]
    readers: dict[str, list[GraphNode]] = {}
    for node in nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    fused_away: set[str] = set()
    steps: list[tuple[GraphNode, Layer, tuple[str, ...], tuple[str, ...]]] = []
    for node in nodes:
        if node.spec.name in fused_away:
            continue
        layer, outputs, covers = node.layer, node.spec.tops, (node.spec.name,)
        relu = _sole_relu_reader(node, readers, graph.output) if fuse else None
        if relu is not None:
            layer = dataclasses.replace(layer, fuse_relu=True)
            outputs = relu.spec.tops
            covers += (relu.spec.name,)
            fused_away.add(relu.spec.name)
        steps.append((node, layer, outputs, covers))
    reads = [() if isinstance(layer, EmbeddingLayer) else node.inputs for node, layer, *_ in steps]
    last_read = {name: i for i, names in enumerate(reads) for name in names}
    plan = []
    for i, (node, layer, outputs, covers) in enumerate(steps):
        release = tuple(n for n, last in last_read.items() if last == i and n != graph.output)
        tensors = tuple(ctx.xp.asarray(t, dtype=ctx.dtype) for t in params.get(node.spec.name, ()))
        shapes = tuple(graph.tensor_shapes[name] for name in reads[i])
        plan.append(
            _Step(
                node.spec.name,
                layer,
                reads[i],
                outputs,
                tensors,
                release,
                covers,
                node.spec.type,
                shapes,
            )
        )
    return tuple(plan)


def _sole_relu_reader(
    node: GraphNode, readers: Mapping[str, list[GraphNode]], output: str
) -> GraphNode | None:
    """The ReLU that is the only reader of an InnerProduct's output, if there is one."""
    if not isinstance(node.layer, InnerProduct) or node.spec.tops[0] == output:
        return None
    users = readers.get(node.spec.tops[0], [])
    if len(users) == 1 and isinstance(users[0].layer, ReLU):
        return users[0]
    return None


def _check_embedding_names(needed: Sequence[str], given: Mapping[str, EmbeddingInput]) -> None:
    missing = [name for name in needed if name not in given]
    unexpected = sorted(set(given) - set(needed))
    if missing or unexpected:
        raise RequestError(
            f"embeddings must be given for exactly {list(needed)}; "
            f"missing {missing}, unexpected {unexpected}"
        )
