"""Independent float64 references for the dense-network tests.

Written from HugeCTR's layer semantics with plain loops and einsum, sharing no code with
``hps_core.nn``: the whole-network reference reads the JSON with ``json`` and takes the
parameters from the flat dense blob in file order itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

EMBEDDING_TYPES = {
    "DistributedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingOneHot",
}


def fc(x, weight, bias):
    return np.einsum("...k,kn->...n", x, weight) + bias[0]


def relu(x):
    return np.where(x > 0, x, 0.0)


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def weight_multiply(x, weight):
    rows, slots = x.shape
    vec = weight.shape[1]
    out = np.empty((rows, slots * vec))
    for i in range(slots):
        out[:, i * vec : (i + 1) * vec] = x[:, i : i + 1] * weight[i]
    return out


def fm_order2(x, out_dim):
    slots = x.shape[1] // out_dim
    total = np.zeros((x.shape[0], out_dim))
    squares = np.zeros((x.shape[0], out_dim))
    for i in range(slots):
        part = x[:, i * out_dim : (i + 1) * out_dim]
        total += part
        squares += part * part
    return 0.5 * (total * total - squares)


def interaction(mlp, emb):
    vectors = [mlp] + [emb[:, k, :] for k in range(emb.shape[1])]
    columns = [mlp]
    for i in range(1, len(vectors)):
        for j in range(i):
            columns.append(np.sum(vectors[i] * vectors[j], axis=1, keepdims=True))
    columns.append(np.zeros((mlp.shape[0], 1)))
    return np.concatenate(columns, axis=1)


def multi_cross(x0, layer_params, projection_dim):
    xl = x0
    for params in layer_params:
        if projection_dim:
            u, v, b = params
            xl = x0 * (np.einsum("rd,dp,pe->re", xl, u, v) + b[0]) + xl
        else:
            w, b = params
            xl = x0 * np.einsum("rd,d->r", xl, w[0])[:, None] + xl + b[0]
    return xl


def pool(values, offsets, slot_num, combiner):
    rows = len(offsets) - 1
    out = np.zeros((rows, values.shape[1]))
    for r in range(rows):
        members = values[offsets[r] : offsets[r + 1]].astype(np.float64)
        if len(members):
            out[r] = members.sum(axis=0)
            if combiner == "mean":
                out[r] /= len(members)
    return out.reshape(rows // slot_num, slot_num, values.shape[1])


def dice(x, alpha, eps):
    """DIN's Dice with HugeCTR's statistics: per column over the rows of this batch."""
    mean = x.mean(axis=0)
    var = (x * x).mean(axis=0) - mean * mean
    p = 1 / (1 + np.exp(-(x - mean) / np.sqrt(var + eps)))
    return p * x + (1 - p) * alpha * x


def sequence_mask(len_from, len_to, s_from, s_to):
    """``[B, 1, Sf, St]``: 1 where query row < its length and key column < its length."""
    lf, lt = np.trunc(len_from.reshape(-1)), np.trunc(len_to.reshape(-1))
    rows = np.arange(s_from)[None, :, None] < lf[:, None, None]
    cols = np.arange(s_to)[None, None, :] < lt[:, None, None]
    return (rows & cols)[:, None].astype(np.float64)


def masked_softmax(scores, mask, factor):
    """HugeCTR: masked scores lose 10000 after scaling; 1e-6 is added to the denominator."""
    z = scores * factor - (1.0 - mask) * 10000.0
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / (e.sum(axis=-1, keepdims=True) + 1e-6)


def attention(q, k, v, mask, heads):
    """Heads split head-major along the hidden axis; softmax(Q K^T / sqrt(d)) V; merged."""
    batch, s_from, width = q.shape
    d = width // heads
    out = np.zeros((batch, s_from, width))
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        scores = np.einsum("bid,bjd->bij", q[:, :, cols], k[:, :, cols]) / np.sqrt(d)
        if mask is None:
            e = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = e / e.sum(axis=-1, keepdims=True)
        else:
            probs = masked_softmax(scores, mask[:, 0], 1.0)
        out[:, :, cols] = np.einsum("bij,bjd->bid", probs, v[:, :, cols])
    return out


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(-1) + beta.reshape(-1)


def mlp(x, param, blob):
    """HugeCTR's MLP layer: per width, ``x @ W (+ b)`` then ReLU unless the layer's activation
    is "None"; W and b are stored for every layer, b even where it is not added."""
    widths = param["num_outputs"]
    acts = param.get("activations", [param.get("activation", "Relu")] * len(widths))
    biases = param.get("biases", [param.get("use_bias", True)] * len(widths))
    for n, act, use_bias in zip(widths, acts, biases, strict=True):
        weight, bias = blob.take(x.shape[-1], n), blob.take(1, n)
        x = x @ weight + (bias if use_bias else 0.0)
        if act == "Relu":
            x = relu(x)
    return x


LOSSES = ("BinaryCrossEntropyLoss", "MultiCrossEntropyLoss", "CrossEntropyLoss")


def _names(value):
    return [value] if isinstance(value, str) else list(value)


class _Blob:
    def __init__(self, flat):
        self.flat = np.asarray(flat, dtype=np.float64)
        self.cursor = 0

    def take(self, *shape):
        n = int(np.prod(shape))
        part = self.flat[self.cursor : self.cursor + n].reshape(shape)
        self.cursor += n
        return part


def network_forward(
    path: str | Path, flat_params, dense, pooled: dict[str, np.ndarray], ntp=None, keep=False
):
    """Run a HugeCTR network file in float64, layer by layer in file order.

    Args:
        path: the network JSON.
        flat_params: the dense model file's floats.
        dense: ``[batch, dense_dim]`` dense features.
        pooled: embedding layer name -> ``[batch, slots, vec]`` pooled vectors.
        ntp: the dense model file's ``.ntp.json`` (BatchNorm's running statistics).
        keep: return every tensor by name instead.

    Returns:
        ``[batch, width]`` predictions of the last layer (or with ``keep``, every tensor).
    """
    layers = json.loads(Path(path).read_text())["layers"]
    tensors = {layers[0]["dense"]["top"]: np.asarray(dense, dtype=np.float64)}
    # BatchNorm running statistics, in layer order, as HugeCTR's .ntp.json lists them.
    entries = json.loads(Path(ntp).read_text())["layers"] if ntp else []
    state = [(np.asarray(e["mean"]), np.asarray(e["var"])) for e in entries]
    blob = _Blob(flat_params)
    last = None
    for layer in layers[1:]:
        kind, tops = layer["type"], _names(layer["top"])
        xs = [tensors.get(b) for b in _names(layer["bottom"])]
        x = xs[0]
        if kind in EMBEDDING_TYPES:
            outs = [np.asarray(pooled[layer.get("name", tops[0])], dtype=np.float64)]
        elif kind == "InnerProduct":
            n = layer["fc_param"]["num_output"]
            outs = [fc(x, blob.take(x.shape[-1], n), blob.take(1, n))]
        elif kind == "FusedInnerProduct":  # HugeCTR: activation "Relu" unless "None"
            n = layer["fc_param"]["num_output"]
            y = fc(x, blob.take(x.shape[-1], n), blob.take(1, n))
            outs = [relu(y) if layer.get("activation", "Relu") == "Relu" else y] * len(tops)
        elif kind == "MLP":
            outs = [mlp(x, layer["mlp_param"], blob)]
        elif kind == "ReLU":
            outs = [relu(x)]
        elif kind == "ELU":
            alpha = layer["elu_param"]["alpha"]
            outs = [np.where(x < 0, alpha * (np.exp(np.minimum(x, 0)) - 1), x)]
        elif kind == "PReLU_Dice":
            param = layer["prelu_dice_param"]
            outs = [dice(x, param.get("alpha", param.get("elu_alpha")), param["eps"])]
        elif kind == "CrossEntropyLoss":  # a softmax of the prediction at inference
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            outs = [e / e.sum(axis=-1, keepdims=True)]
        elif kind == "Softmax" and len(xs) == 2:
            outs = [masked_softmax(x, xs[1], layer.get("factor", 1.0))]
        elif kind == "Softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            outs = [e / e.sum(axis=-1, keepdims=True)]
        elif kind == "SequenceMask":
            s_from, s_to = layer["max_sequence_len_from"], layer["max_sequence_len_to"]
            outs = [sequence_mask(xs[0], xs[1], s_from, s_to)]
        elif kind == "MultiHeadAttention":
            mask = xs[3] if len(xs) == 4 else None
            outs = [attention(*xs[:3], mask, layer.get("num_attention_heads", 1))]
        elif kind == "BatchNorm":  # inference: the running statistics of the .ntp.json
            n = x.shape[-1]
            gamma, beta = blob.take(n, 1).reshape(-1), blob.take(n, 1).reshape(-1)
            mean, var = state.pop(0)
            outs = [gamma * (x - mean) / np.sqrt(var + layer["bn_param"]["eps"]) + beta]
        elif kind == "LayerNorm":
            n = x.shape[-1]
            outs = [layer_norm(x, blob.take(n, 1), blob.take(n, 1), layer["ln_param"]["eps"])]
        elif kind == "Sub":
            outs = [xs[0] - xs[1]]
        elif kind == "ReduceMean":
            outs = [x.mean(axis=layer.get("axis", 1), keepdims=True)]
        elif kind == "Scale":  # HugeCTR: axis 0 repeats elements in a row, axis 1 whole rows
            axis, factor = layer["scale_param"]["axis"], int(layer["scale_param"]["factor"])
            outs = [np.repeat(x, factor, axis=1 if axis == 0 else 0)]
        elif kind == "FusedReshapeConcat":
            c = np.concatenate(xs, axis=2)
            outs = [c[:, :-1, :].reshape(-1, c.shape[2]), c[:, -1, :]]
        elif kind == "FusedReshapeConcatGeneral":
            c = np.concatenate(xs, axis=2)
            outs = [c.reshape(-1, c.shape[2])]
        elif kind == "MatrixMultiply":
            outs = [np.matmul(xs[0], xs[1])]
        elif kind == "Cast":
            outs = [x]
        elif kind in ("Sigmoid", "BinaryCrossEntropyLoss", "MultiCrossEntropyLoss"):
            outs = [sigmoid(x)]
        elif kind == "Dropout":
            outs = [x]
        elif kind == "Reshape" and "selected" in layer:
            chosen = layer["selected"] or list(range(x.shape[1]))
            outs = [np.concatenate([x[:, slot, :] for slot in chosen], axis=1)]
        elif kind == "Reshape":
            leading, steps = layer.get("leading_dim", x[0].size), layer.get("time_step", 0)
            outs = [x.reshape(-1, steps, leading) if steps else x.reshape(-1, leading)]
        elif kind == "Concat":
            outs = [np.concatenate(xs, axis=layer.get("axis", 1) if x.ndim == 3 else 1)]
        elif kind == "Slice":
            outs = [x[:, a:b] for a, b in layer["ranges"]]
        elif kind == "WeightMultiply":
            outs = [weight_multiply(x, blob.take(*layer["weight_dims"]))]
        elif kind == "FmOrder2":
            outs = [fm_order2(x, layer["out_dim"])]
        elif kind == "ReduceSum":
            outs = [x.sum(axis=layer["axis"], keepdims=True)]
        elif kind == "Add":
            outs = [sum(xs)]
        elif kind in ("ElementwiseMultiply", "DotProduct"):
            outs = [np.prod(np.stack(xs), axis=0)]
        elif kind == "Interaction":
            outs = [interaction(*xs[:2])] * len(tops)  # FP16 training form: a 2nd top
        elif kind == "MultiCross":
            mc = layer["mc_param"]
            d, p = x.shape[1], mc.get("projection_dim", 0)
            shapes = [(d, p), (p, d), (1, d)] if p else [(1, d), (1, d)]
            params = [[blob.take(*s) for s in shapes] for _ in range(mc["num_layers"])]
            outs = [multi_cross(x, params, p)]
        else:
            raise NotImplementedError(kind)
        tensors.update(zip(tops, outs, strict=True))
        last = tops[-1]
    assert blob.cursor == blob.flat.size, "reference used a different number of parameters"
    if keep:
        return tensors
    # Several loss layers (multi-task): every task's sigmoid, in the order of the losses.
    losses = [layer for layer in layers[1:] if layer["type"] in LOSSES]
    if len(losses) > 1:
        return np.concatenate([tensors[_names(layer["top"])[0]] for layer in losses], axis=1)
    return tensors[last].reshape(dense.shape[0], -1)
