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

import os
from pathlib import Path

import torch

from hps_core.errors import RequestError
from hps_core.hps import HPS, init

__all__ = ["LookupLayer", "init"]


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
        self._checked = False

    def extra_repr(self) -> str:
        return (
            f"ps_config_file={self.ps_config_file!r}, model_name={self.model_name!r}, "
            f"table_id={self.table_id}, emb_vec_size={self.emb_vec_size}"
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
        hps = HPS(self.ps_config_file)
        device = keys.device.index if keys.is_cuda else None
        if not self._checked:
            dim = hps.model(self.model_name, device).table(self.table_id).dim
            if dim != self.emb_vec_size:
                raise RequestError(
                    f"LookupLayer: emb_vec_size {self.emb_vec_size} is not the width of table "
                    f"{self.table_id} of model '{self.model_name}' in {self.ps_config_file} "
                    f"({dim})"
                )
            self._checked = True
        flat = keys.detach().reshape(-1).to(torch.int64)
        shape = (*keys.shape, self.emb_vec_size)
        if device is None:
            found = hps.lookup(flat.numpy(), self.model_name, self.table_id)
            return torch.from_numpy(found).reshape(shape)
        import cupy

        out = torch.empty(
            (flat.shape[0], self.emb_vec_size), dtype=torch.float32, device=keys.device
        )
        # The lookup is ordered on PyTorch's current stream: what the caller queues after this
        # forward on that stream sees the answer.
        stream = torch.cuda.current_stream(keys.device)
        with cupy.cuda.Device(device), cupy.cuda.ExternalStream(stream.cuda_stream, device):
            hps.lookup_fromdlpack(flat, out, self.model_name, self.table_id, device)
        return out.reshape(shape)
