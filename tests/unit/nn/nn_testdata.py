"""Helpers of the dense-network tests (a uniquely named module, imported by the tests)."""

from __future__ import annotations

import json

import numpy as np
from network_files import NETWORKS

from hps_core.nn import LayerSpec, NetworkGraph, build_graph, parse_network_json

# Whole-network tests run on the project's own network files and, where they are here,
# HugeCTR's (tests/network_files.py).
FIXTURES = NETWORKS


def make_spec(layer_type: str, bottoms, tops, **fields) -> LayerSpec:
    """A LayerSpec as the parser would build it for a layer at line 7 of test.json."""
    bottoms = (bottoms,) if isinstance(bottoms, str) else tuple(bottoms)
    tops = (tops,) if isinstance(tops, str) else tuple(tops)
    raw = {"type": layer_type, "bottom": list(bottoms), "top": list(tops), **fields}
    return LayerSpec(3, 7, "test.json", tops[0], layer_type, bottoms, tops, raw)


def network_text(layers: list[dict], dense_dim: int = 4, sparse=(("keys", 3, 2),)) -> str:
    """JSON text of a training-form network with one Data layer and ``layers``."""
    data = {
        "name": "data",
        "type": "Data",
        "label": {"top": "label", "label_dim": 1},
        "dense": {"top": "dense", "dense_dim": dense_dim},
        "sparse": [{"top": t, "slot_num": s, "nnz_per_slot": n} for t, s, n in sparse],
    }
    doc = {"solver": {"batchsize": 16}, "layers": [data, *layers]}
    return json.dumps(doc, indent=2)


def graph_of(layers: list[dict], **kwargs) -> NetworkGraph:
    """Build the graph of :func:`network_text`."""
    return build_graph(parse_network_json(network_text(layers, **kwargs), source="net.json"))


def graph_inputs(graph: NetworkGraph, batch: int, rng: np.random.Generator, scale: float = 0.3):
    """Random dense features and pooled embeddings for every embedding layer of ``graph``."""
    dense = (scale * rng.standard_normal((batch, graph.spec.data.dense_dim))).astype(np.float32)
    pooled = {
        node.spec.name: (
            scale * rng.standard_normal((batch, node.layer.slot_num, node.layer.vec_size))
        ).astype(np.float32)
        for node in graph.embeddings
    }
    return dense, pooled


def flat(params) -> np.ndarray:
    """All tensors of a DenseParams mapping, concatenated as the dense file stores them."""
    arrays = [np.ravel(t) for tensors in params.values() for t in tensors]
    return np.concatenate(arrays) if arrays else np.empty(0, np.float32)


def random_csr(rng: np.random.Generator, rows: int, max_keys: int, dim: int, empty: float = 0.2):
    """Random unpooled vectors: ``[nnz, dim]`` values and CSR offsets over ``rows`` slots."""
    counts = rng.integers(1, max_keys + 1, size=rows)
    counts[rng.random(rows) < empty] = 0
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    values = rng.standard_normal((int(offsets[-1]), dim)).astype(np.float32)
    return values, offsets
