"""Dense network engine for HugeCTR models: parse the network JSON, build the inference graph,
load the dense model file, and run the forward pass on NumPy or CuPy.

Typical use::

    graph = build_graph(load_network_json("dlrm.json"))
    executor = DenseExecutor(graph, read_dense_blob("dlrm_dense.model", graph.dense_layout()))
    predictions = executor.forward(dense, {"sparse_embedding1": pooled})
    timings = executor.profile(dense, {"sparse_embedding1": pooled})  # per-layer times, FLOPs

What a layer is written in (the network JSON, tensor shapes, compute precision) is
:mod:`hps_core.nn.spec`, the floor below :mod:`hps_core.nn.layers`. Precision modes (fp32, tf32,
fp16) and their measured accuracy: :mod:`hps_core.nn.spec.precision`.
"""

from __future__ import annotations

from hps_core.nn.dense_blob import (
    DenseLayout,
    DenseParams,
    LayerParams,
    check_dense_blob_size,
    random_dense_params,
    read_dense_blob,
    write_dense_blob,
)
from hps_core.nn.executor import DenseExecutor, EmbeddingInput
from hps_core.nn.graph import GraphNode, NetworkGraph, build_graph
from hps_core.nn.layers import (
    Combiner,
    EmbeddingLayer,
    UnpooledEmbedding,
    pool_embeddings,
    pool_gathered,
)
from hps_core.nn.profile import ForwardProfile, LayerTime, layer_flops
from hps_core.nn.spec.network_json import (
    DataSpec,
    LayerSpec,
    NetworkForm,
    NetworkSpec,
    SparseInputSpec,
    load_network_json,
    parse_network_json,
)
from hps_core.nn.spec.precision import ComputeContext, PaddedBatch, Precision, round_to_tf32
from hps_core.nn.spec.shapes import TensorShape

__all__ = [
    "Combiner",
    "ComputeContext",
    "DataSpec",
    "DenseExecutor",
    "DenseLayout",
    "DenseParams",
    "EmbeddingInput",
    "EmbeddingLayer",
    "ForwardProfile",
    "GraphNode",
    "LayerParams",
    "LayerSpec",
    "LayerTime",
    "NetworkForm",
    "NetworkGraph",
    "NetworkSpec",
    "PaddedBatch",
    "Precision",
    "SparseInputSpec",
    "TensorShape",
    "UnpooledEmbedding",
    "build_graph",
    "check_dense_blob_size",
    "layer_flops",
    "load_network_json",
    "parse_network_json",
    "pool_embeddings",
    "pool_gathered",
    "random_dense_params",
    "read_dense_blob",
    "round_to_tf32",
    "write_dense_blob",
]
