"""HugeCTR's HPS plugin for PyTorch (``hps_torch``): embedding lookups of a ps.json's tables as
a ``torch.nn.Module``, inside a user's own PyTorch model.

A model written for HugeCTR's plugin changes only its import line::

    import hps_torch                     # HugeCTR
    from hps_core import hps_torch      # here

:class:`LookupLayer` takes integer keys of any shape and returns ``float32 [..., dim]`` on the
keys' device: CPU tensors are answered from the host tier, CUDA tensors through the GPU cache of
their device (``HPS.lookup_fromdlpack``, ordered on PyTorch's current CUDA stream). The HPS opens
on the first forward (HugeCTR's implicit initialisation); :func:`init` opens every table first,
as ``hps.Init`` does. Inference only: a lookup has no gradient.

Example:
    >>> from hps_core import hps_torch  # doctest: +SKIP
    >>> layer = hps_torch.LookupLayer("ps.json", "demo", 0, 128)  # doctest: +SKIP
    >>> layer(torch.tensor([[1, 2], [3, 4]])).shape  # doctest: +SKIP
    torch.Size([2, 2, 128])
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hps_core.errors import RequestError
from hps_core.hps import HPS, init
from hps_core.lookup.model_lookup import ModelLookup, TableQuery
from hps_core.lookup.table_lookup import HostTableLookup, InPlaceRows
from hps_core.nn.layers.embedding import Combiner

__all__ = ["EmbeddingBag", "LookupLayer", "init"]


class LookupLayer(torch.nn.Module):
    """Embedding vectors of one table of a ps.json model, as HugeCTR's
    ``hps_torch.LookupLayer``.

    Args:
        ps_config_file: the ps.json.
        model_name: a ``model`` of it.
        table_id: the table's index in the model's ``sparse_files``.
        emb_vec_size: the table's width (checked against the ps.json on the first forward).

    Example:
        >>> layer = LookupLayer("ps.json", "demo", 0, 128)  # doctest: +SKIP
        >>> vectors = layer(keys)  # doctest: +SKIP
    """

    def __init__(
        self,
        ps_config_file: str | os.PathLike[str],
        model_name: str,
        table_id: int,
        emb_vec_size: int,
    ) -> None:
        super().__init__()
        self.ps_config_file = str(Path(ps_config_file))
        self.model_name = model_name
        self.table_id = int(table_id)
        self.emb_vec_size = int(emb_vec_size)

    def extra_repr(self) -> str:
        return (
            f"ps_config_file={self.ps_config_file!r}, model_name={self.model_name!r}, "
            f"table_id={self.table_id}, emb_vec_size={self.emb_vec_size}"
        )

    def checked(self, keys: torch.Tensor) -> HPS:
        """The HPS of this layer, once ``keys`` are integers and the table's width is
        ``emb_vec_size``.

        Raises:
            RequestError: naming what does not fit.
        """
        if keys.dtype not in (torch.int32, torch.int64):
            raise RequestError(f"LookupLayer: keys must be int32 or int64, got {keys.dtype}")
        return _checked_hps(
            keys, self.ps_config_file, self.model_name, self.table_id, self.emb_vec_size
        )

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        """Look ``keys`` up.

        Args:
            keys: int32 or int64 keys of any shape, on the CPU or a CUDA device.

        Returns:
            float32 ``[*keys.shape, emb_vec_size]`` on the keys' device; the table's default
            vector for unknown keys.

        Raises:
            RequestError: keys that are not integers, or an ``emb_vec_size`` that is not the
                table's width.
        """
        if keys.dtype not in (torch.int32, torch.int64):
            raise RequestError(f"LookupLayer: keys must be int32 or int64, got {keys.dtype}")
        op = torch.ops.hps.lookup
        return op(keys, self.ps_config_file, self.model_name, self.table_id, self.emb_vec_size)


class EmbeddingBag(torch.nn.Module):
    """``torch.nn.EmbeddingBag``'s forward over one table of a ps.json model: each bag's rows
    pooled (sum or mean) by the HPS, on the keys' device.

    Args:
        ps_config_file: the ps.json.
        model_name: a ``model`` of it.
        table_id: the table's index in the model's ``sparse_files``.
        embedding_dim: the table's width (checked on the first forward).
        mode: ``"sum"`` or ``"mean"``.

    Example:
        >>> bag = EmbeddingBag("ps.json", "demo", 0, 128, mode="mean")  # doctest: +SKIP
        >>> bag(torch.tensor([1, 2, 3]), torch.tensor([0, 2])).shape  # doctest: +SKIP
        torch.Size([2, 128])
    """

    def __init__(
        self,
        ps_config_file: str | os.PathLike[str],
        model_name: str,
        table_id: int,
        embedding_dim: int,
        mode: str = "sum",
    ) -> None:
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"EmbeddingBag: mode must be 'sum' or 'mean', got {mode!r}")
        self.mode = mode
        self.rows = LookupLayer(ps_config_file, model_name, table_id, embedding_dim)

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pool the bags of ``input`` as ``torch.nn.EmbeddingBag`` does.

        Args:
            input: int32/int64 keys: ``[B, h]`` (bag ``b`` is row ``b``), or ``[n]`` with
                ``offsets``.
            offsets: with 1-D ``input``, each bag's first position (``[B]``, from 0, rising).
            per_sample_weights: float weights shaped as ``input`` (``mode="sum"`` only): each
                row is scaled by its weight before the sum.

        Returns:
            float32 ``[B, embedding_dim]`` on the keys' device; an empty bag is zeros.

        Raises:
            RequestError: shapes that do not fit, or weights with ``mode="mean"``.
        """
        layer = self.rows
        if input.dim() == 2:
            if offsets is not None:
                raise RequestError("EmbeddingBag: offsets go with 1-D input, got 2-D input")
            bags, hotness = int(input.shape[0]), int(input.shape[1])
            csr = None
        elif input.dim() == 1:
            if offsets is None or offsets.dim() != 1:
                raise RequestError("EmbeddingBag: 1-D input needs 1-D offsets (each bag's start)")
            bags, hotness = int(offsets.shape[0]), None
            end = torch.tensor([input.shape[0]], dtype=torch.int64, device=offsets.device)
            csr = torch.cat([offsets.to(torch.int64), end])
        else:
            raise RequestError(f"EmbeddingBag: input must be 1-D or 2-D, got {input.dim()}-D")
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise RequestError("EmbeddingBag: per_sample_weights need mode='sum'")
            if per_sample_weights.shape != input.shape:
                raise RequestError(
                    f"EmbeddingBag: per_sample_weights {list(per_sample_weights.shape)} must be "
                    f"shaped as input {list(input.shape)}"
                )
            rows = layer(input.reshape(-1)) * per_sample_weights.reshape(-1, 1).float()
            if csr is None:
                return rows.reshape(bags, hotness, -1).sum(dim=1)
            bag_of = torch.bucketize(
                torch.arange(rows.shape[0], device=rows.device), csr[1:], right=True
            )
            return torch.zeros(
                (bags, layer.emb_vec_size), dtype=torch.float32, device=rows.device
            ).index_add_(0, bag_of, rows)
        if input.dtype not in (torch.int32, torch.int64):
            raise RequestError(f"EmbeddingBag: keys must be int32 or int64, got {input.dtype}")
        if hotness == 0:  # bags of no key
            return torch.zeros((bags, layer.emb_vec_size), dtype=torch.float32, device=input.device)
        bounds = csr if csr is not None else input.new_empty(0, dtype=torch.int64)
        return torch.ops.hps.lookup_bags(
            input.reshape(-1), bounds, layer.ps_config_file, layer.model_name, layer.table_id,
            layer.emb_vec_size, self.mode, hotness or 0,
        )  # fmt: skip


def _checked_hps(keys: torch.Tensor, ps: str, model: str, table: int, dim: int) -> HPS:
    """The HPS of ``ps``, once table ``table`` of ``model`` is ``dim`` wide."""
    hps = HPS(ps)
    device = keys.device.index if keys.is_cuda else None
    width = hps.model(model, device).table(table).dim
    if width != dim:
        raise RequestError(
            f"LookupLayer: emb_vec_size {dim} is not the width of table {table} of model "
            f"'{model}' in {ps} ({width})"
        )
    return hps


@torch.library.custom_op("hps::lookup", mutates_args=())
def _lookup_op(keys: torch.Tensor, ps: str, model: str, table: int, dim: int) -> torch.Tensor:
    """:class:`LookupLayer`'s lookup as one registered operator, which ``torch.compile`` and
    ``torch.export`` keep whole (their tracing sees only its output's shape)."""
    hps = _checked_hps(keys, ps, model, table, dim)
    flat = keys.detach().reshape(-1).to(torch.int64)
    return _looked_up(hps, model, table, dim, flat, flat.shape[0]).reshape(*keys.shape, dim)


@_lookup_op.register_fake
def _(keys: torch.Tensor, ps: str, model: str, table: int, dim: int) -> torch.Tensor:
    return keys.new_empty((*keys.shape, dim), dtype=torch.float32)


@torch.library.custom_op("hps::lookup_bags", mutates_args=())
def _bags_op(
    keys: torch.Tensor,
    offsets: torch.Tensor,
    ps: str,
    model: str,
    table: int,
    dim: int,
    mode: str,
    hotness: int,
) -> torch.Tensor:
    """:class:`EmbeddingBag`'s pooled lookup as one registered operator: bags of ``hotness``
    keys, or CSR ``offsets`` (``bags + 1``) when ``hotness`` is 0."""
    hps = _checked_hps(keys, ps, model, table, dim)
    flat = keys.detach().to(torch.int64)
    pooling: dict[str, Any] = {"combiner": mode}
    if hotness > 0:
        pooling["hotness"] = hotness
        bags = int(flat.shape[0]) // hotness
    else:
        pooling["offsets"] = offsets
        bags = int(offsets.shape[0]) - 1
    return _looked_up(hps, model, table, dim, flat, bags, **pooling)


@_bags_op.register_fake
def _(
    keys: torch.Tensor,
    offsets: torch.Tensor,
    ps: str,
    model: str,
    table: int,
    dim: int,
    mode: str,
    hotness: int,
) -> torch.Tensor:
    bags = keys.shape[0] // hotness if hotness > 0 else offsets.shape[0] - 1
    return keys.new_empty((bags, dim), dtype=torch.float32)


def _no_gradient(ctx: object, grad: torch.Tensor) -> None:
    raise RuntimeError(
        "hps_torch looks embeddings up for inference only: its tables are the HPS's files, "
        "which a backward pass cannot update"
    )


_lookup_op.register_autograd(_no_gradient)
_bags_op.register_autograd(_no_gradient)


def _looked_up(
    hps: HPS, model: str, table: int, dim: int, keys: torch.Tensor, rows: int, **pooling: Any
) -> torch.Tensor:
    """``rows`` float32 rows of ``dim`` of int64 ``keys`` (pooled as ``pooling`` says:
    ``combiner`` and ``hotness`` or ``offsets``) on the keys' device."""
    combiner = pooling.get("combiner")
    query = TableQuery(
        table,
        keys,
        None if combiner is None else Combiner(combiner),
        pooling.get("hotness"),
        pooling.get("offsets"),
    )
    (out,) = looked_up_many(hps, model, keys.device, [query], [dim])
    if int(out.shape[0]) != rows:
        raise RequestError(f"hps_torch: {int(out.shape[0])} rows answered, {rows} asked")
    return out


def looked_up_many(
    hps: HPS,
    model: str,
    device: torch.device,
    queries: Sequence[TableQuery],
    dims: Sequence[int],
) -> list[torch.Tensor]:
    """Several tables' lookups of a model with PyTorch tensors, in one call of its lookup
    (on a GPU, one batch of the cache bank's kernels where that engine serves).

    CPU tensors are answered from the host tier. CUDA tensors through the GPU cache of their
    device, ordered on PyTorch's current stream: what the caller queues after this call on
    that stream sees the answer, and nothing here waits for the GPU unless keys missed.

    Args:
        hps: the HPS of the model's ps.json.
        model: the model's name.
        device: where the keys are (and the answers will be).
        queries: :class:`~hps_core.lookup.TableQuery` s of int64 PyTorch tensors (keys and
            offsets) on ``device``; on the CPU NumPy arrays are taken as well.
        dims: each query's table width.

    Returns:
        Per query, float32 ``[bags, dim]`` on ``device``.
    """
    if device.type != "cuda":
        return _looked_up_on_host(hps.model(model, None), [_host_query(q) for q in queries])
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    lookup = hps.model(model, index)
    outs = [
        torch.empty((q.bags, dim), dtype=torch.float32, device=device)
        for q, dim in zip(queries, dims, strict=True)
    ]
    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(index), cupy.cuda.ExternalStream(stream.cuda_stream, index):
        lookup.lookup_queries(_on_gpu(queries), [_cupy_view(o) for o in outs])
    return outs


def looked_up_side_by_side(
    hps: HPS,
    model: str,
    device: torch.device,
    queries: Sequence[TableQuery],
    dims: Sequence[int],
) -> torch.Tensor:
    """:func:`looked_up_many`'s answers side by side, ``[bags, sum of dims]``: on a GPU
    written into their columns by the cache bank's pooling itself where it can (see
    :meth:`~hps_core.lookup.ModelLookup.lookup_side_by_side`), with no answer per table and
    no concatenation.

    Args:
        hps: the HPS of the model's ps.json.
        model: the model's name.
        device: where the keys are (and the answer will be).
        queries: as :func:`looked_up_many`, every one of the same bags.
        dims: each query's table width.

    Returns:
        float32 ``[bags, sum of dims]`` on ``device``, the queries' columns in order.
    """
    if device.type != "cuda":
        return torch.cat(looked_up_many(hps, model, device, queries, dims), dim=1)
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    lookup = hps.model(model, index)
    bags = queries[0].bags if queries else 0
    out = torch.empty((bags, sum(dims)), dtype=torch.float32, device=device)
    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(index), cupy.cuda.ExternalStream(stream.cuda_stream, index):
        lookup.lookup_side_by_side(_on_gpu(queries), _cupy_view(out))
    return out


def _on_gpu(queries: Sequence[TableQuery]) -> list[TableQuery]:
    """``queries`` with their keys and offsets as CuPy views of the PyTorch tensors."""
    return [
        dataclasses.replace(
            q,
            keys=_cupy_view(q.keys),
            offsets=None if q.offsets is None else _cupy_view(q.offsets),
        )
        for q in queries
    ]


_CUPY_DTYPES = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


def _cupy_view(tensor: torch.Tensor) -> Any:
    """A CuPy array over a CUDA tensor's memory (kept alive by the view), for use on
    PyTorch's current stream. DLPack's exchange asks PyTorch for the current stream and
    device on every call (27 calls a forward of a 26-table model took a third of its host
    time, H100); the tensors here are already on that stream, so a view of the pointer is
    all the lookup needs."""
    import cupy

    dtype = _CUPY_DTYPES.get(tensor.dtype)
    if dtype is None or not tensor.is_contiguous():
        return cupy.from_dlpack(tensor)
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return cupy.empty(tuple(tensor.shape), dtype=dtype)
    memory = cupy.cuda.UnownedMemory(tensor.data_ptr(), nbytes, tensor, tensor.device.index)
    return cupy.ndarray(tuple(tensor.shape), dtype, cupy.cuda.MemoryPointer(memory, 0))


# The host tier's array is mapped read-only in processes that did not build it; PyTorch has
# no read-only tensors and warns when given one, but embedding_bag only reads it.
warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning, __name__)

FUSED_KEYS = 1024
"""From this many keys a pooled host query is gathered and pooled by PyTorch's
``embedding_bag`` straight from the host tier's array (one pass, no copy of a row per key);
fewer keys of many tables cost less read together (``ModelLookup.lookup_queries``)."""


def _looked_up_on_host(lookup: ModelLookup, queries: list[TableQuery]) -> list[torch.Tensor]:
    """Host queries' answers: large pooled ones fused where their table's rows can be read
    in place, the others through the model's lookup."""
    answers: list[torch.Tensor | None] = [None] * len(queries)
    for i, query in enumerate(queries):
        if query.combiner is not None and int(query.keys.shape[0]) >= FUSED_KEYS:
            query = lookup.checked(query)
            table = lookup.table(query.table)
            placed = table.rows_in_place(query.keys) if isinstance(table, HostTableLookup) else None
            if placed is not None:
                answers[i] = _pooled_in_place(placed, query, table.dim)
    rest = [i for i, a in enumerate(answers) if a is None]
    if rest:
        found = lookup.lookup_queries([queries[i] for i in rest])
        for i, array in zip(rest, found, strict=True):
            answers[i] = torch.from_numpy(array)
    return answers  # type: ignore[return-value]


def _pooled_in_place(placed: InPlaceRows, query: TableQuery, dim: int) -> torch.Tensor:
    """``query``'s bags pooled by ``embedding_bag`` from the shared host tier's own rows,
    plus those of the keys it lacks (from the tiers below, or the default vector)."""
    bags = query.bags
    pooled = _summed(placed.values, placed.rows, query, bags, dim)
    if len(placed.below):
        pooled += _summed(placed.below, placed.below_index, query, bags, dim)
    if query.combiner is Combiner.MEAN:
        if query.offsets is None:
            pooled /= float(query.hotness or 1)
        else:
            lengths = np.maximum(np.diff(np.asarray(query.offsets)), 1).astype(np.float32)
            pooled /= torch.from_numpy(lengths)[:, None]
    return pooled


def _summed(
    weight: np.ndarray, index: np.ndarray, query: TableQuery, bags: int, dim: int
) -> torch.Tensor:
    """Each bag's sum of ``weight``'s rows at ``index`` (``-1``: no row of it, counted as
    zeros), float32 ``[bags, dim]``."""
    taken = index >= 0
    if not taken.any():
        return torch.zeros((bags, dim), dtype=torch.float32)
    every = bool(taken.all())
    index_t = torch.from_numpy(index if every else np.where(taken, index, 0))
    scale = None if every else torch.from_numpy(taken.astype(np.float32))
    if query.offsets is None:
        hotness = int(query.hotness or 1)
        return F.embedding_bag(index_t.reshape(-1, hotness), torch.from_numpy(weight),
                               mode="sum", per_sample_weights=
                               None if scale is None else scale.reshape(-1, hotness))  # fmt: skip
    offsets = torch.from_numpy(np.asarray(query.offsets))
    return F.embedding_bag(index_t, torch.from_numpy(weight), offsets, mode="sum",
                           per_sample_weights=scale, include_last_offset=True)  # fmt: skip


def _host_query(query: TableQuery) -> TableQuery:
    """``query`` with its CPU tensors as NumPy arrays (no copy)."""
    if isinstance(query.keys, torch.Tensor) or isinstance(query.offsets, torch.Tensor):
        offsets = query.offsets
        return dataclasses.replace(
            query,
            keys=np.asarray(query.keys),
            offsets=None if offsets is None else np.asarray(offsets),
        )
    return query
