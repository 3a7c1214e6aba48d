"""Runnable layers and the catalog of HugeCTR layer types.

``DENSE_LAYERS`` maps each HugeCTR type name this engine runs to its class; embedding types
are listed apart because they are fed by the lookup, not by other layers. The other names of
HugeCTR's layer catalog are known but not runnable yet, so a graph using them gets a precise
"cannot run" message instead of "unknown type".
"""

from __future__ import annotations

from hps_core.nn.layers.activation import (
    ELU,
    Dropout,
    LossAsSigmoid,
    LossAsSoftmax,
    PReLUDice,
    ReLU,
    Sigmoid,
    Softmax,
)
from hps_core.nn.layers.attention import LayerNorm, MultiHeadAttention, SequenceMask
from hps_core.nn.layers.base import Array, Layer, ParamShape
from hps_core.nn.layers.dense import (
    MLP,
    BatchNorm,
    FusedInnerProduct,
    InnerProduct,
    MultiCross,
    WeightMultiply,
)
from hps_core.nn.layers.elementwise import Add, ElementwiseMultiply, ReduceMean, ReduceSum, Sub
from hps_core.nn.layers.embedding import (
    Combiner,
    EmbeddingLayer,
    UnpooledEmbedding,
    pool_embeddings,
    pool_gathered,
)
from hps_core.nn.layers.interaction import FmOrder2, Interaction, MatrixMultiply
from hps_core.nn.layers.shape_ops import (
    Cast,
    Concat,
    FusedReshapeConcat,
    FusedReshapeConcatGeneral,
    Reshape,
    Scale,
    Slice,
)

DENSE_LAYERS: dict[str, type[Layer]] = {
    name: cls
    for cls in (
        Add,
        BatchNorm,
        Cast,
        Concat,
        Dropout,
        ELU,
        ElementwiseMultiply,
        FmOrder2,
        FusedInnerProduct,
        FusedReshapeConcat,
        FusedReshapeConcatGeneral,
        InnerProduct,
        Interaction,
        LayerNorm,
        LossAsSigmoid,
        LossAsSoftmax,
        MLP,
        MatrixMultiply,
        MultiCross,
        MultiHeadAttention,
        PReLUDice,
        ReduceMean,
        ReduceSum,
        ReLU,
        Reshape,
        Scale,
        SequenceMask,
        Sigmoid,
        Slice,
        Softmax,
        Sub,
        WeightMultiply,
    )
    for name in cls.type_names
}

EMBEDDING_TYPES: frozenset[str] = frozenset(EmbeddingLayer.type_names)

#: HugeCTR layer types this engine cannot run yet; those with trainable parameters make the
#: dense model file's layout unknown.
NOT_RUNNABLE_TRAINABLE: frozenset[str] = frozenset(
    # cuDNN keeps its weights in an undocumented order; no HugeCTR sample or test uses it.
    {"GRU"}
)
NOT_RUNNABLE: frozenset[str] = NOT_RUNNABLE_TRAINABLE | {
    # HugeCTR cannot build it either: at 24.x it is made a Select over dim 0, which that layer
    # refuses, and the older GatherLayer never allocated its output.
    "Gather",
    "HybridSparseEmbedding",
    # HugeCTR neither writes nor reads it in network files.
    "Select",
}

__all__ = [
    "DENSE_LAYERS",
    "EMBEDDING_TYPES",
    "NOT_RUNNABLE",
    "NOT_RUNNABLE_TRAINABLE",
    "Array",
    "Combiner",
    "EmbeddingLayer",
    "Layer",
    "ParamShape",
    "UnpooledEmbedding",
    "pool_embeddings",
    "pool_gathered",
]
