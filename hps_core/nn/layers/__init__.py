"""Runnable layers and the catalog of HugeCTR layer types.

``DENSE_LAYERS`` maps each HugeCTR type name this engine runs to its class; embedding types
are listed apart because they are fed by the lookup, not by other layers. The other names of
HugeCTR's layer catalog are known but not runnable yet, so a graph using them gets a precise
"cannot run" message instead of "unknown type".
"""

from __future__ import annotations

from hps_core.nn.layers.activation import Dropout, LossAsSigmoid, ReLU, Sigmoid
from hps_core.nn.layers.base import Array, Layer, ParamShape
from hps_core.nn.layers.dense import (
    MLP,
    FusedInnerProduct,
    InnerProduct,
    MultiCross,
    WeightMultiply,
)
from hps_core.nn.layers.elementwise import Add, ElementwiseMultiply, ReduceSum
from hps_core.nn.layers.embedding import (
    Combiner,
    EmbeddingLayer,
    UnpooledEmbedding,
    pool_embeddings,
)
from hps_core.nn.layers.interaction import FmOrder2, Interaction
from hps_core.nn.layers.shape_ops import Concat, Reshape, Slice

DENSE_LAYERS: dict[str, type[Layer]] = {
    name: cls
    for cls in (
        Add,
        Concat,
        Dropout,
        ElementwiseMultiply,
        FmOrder2,
        FusedInnerProduct,
        InnerProduct,
        Interaction,
        LossAsSigmoid,
        MLP,
        MultiCross,
        ReduceSum,
        ReLU,
        Reshape,
        Sigmoid,
        Slice,
        WeightMultiply,
    )
    for name in cls.type_names
}

EMBEDDING_TYPES: frozenset[str] = frozenset(EmbeddingLayer.type_names)

#: HugeCTR layer types this engine cannot run yet; those with trainable parameters make the
#: dense model file's layout unknown.
NOT_RUNNABLE_TRAINABLE: frozenset[str] = frozenset(
    {"BatchNorm", "GRU", "LayerNorm"}
)
NOT_RUNNABLE: frozenset[str] = NOT_RUNNABLE_TRAINABLE | {
    "Cast",
    "CrossEntropyLoss",
    "DotProduct",
    "ELU",
    "FusedReshapeConcat",
    "FusedReshapeConcatGeneral",
    "Gather",
    "HybridSparseEmbedding",
    "MaskedSoftmax",
    "MatrixMultiply",
    "MultiHeadAttention",
    "PReLU_Dice",
    "ReduceMean",
    "Scale",
    "Select",
    "SequenceMask",
    "Softmax",
    "Sub",
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
]
