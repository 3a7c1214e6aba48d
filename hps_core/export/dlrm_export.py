"""Export a PyTorch DLRM (facebookresearch/dlrm ``DLRM_Net`` style) to HugeCTR files.

Example:
    >>> from hps_core.export import export_dlrm
    >>> files = export_dlrm("dlrm.pt", "out/", "dlrm")  # doctest: +SKIP
    >>> files.ps_json  # doctest: +SKIP
    PosixPath('out/ps.json')

    then ``hps repo out/ps.json REPO`` makes a Triton model repository serving it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.export.dlrm_arch import DlrmArch
from hps_core.export.dlrm_files import DlrmFiles, write_dlrm_model
from hps_core.export.dlrm_state import check_dlrm_state, infer_dlrm_arch, unwrap_checkpoint
from hps_core.export.torch_source import is_module, load_checkpoint, module_state


def export_dlrm(
    model: Any,
    out_dir: str | os.PathLike[str],
    model_name: str,
    arch: DlrmArch | None = None,
    key_maps: Mapping[int, np.ndarray] | None = None,
    max_keys_per_table: int | Sequence[int] = 1,
    max_batch_size: int = 64,
    overwrite: bool = False,
    allow_pickle: bool = False,
) -> DlrmFiles:
    """Write a DLRM's sparse folders, dense model, network JSON and ps.json into ``out_dir``.

    Args:
        model: a ``DLRM_Net``-style ``nn.Module``, its state dict (PyTorch tensors or NumPy
            arrays; a dlrm ``--save-model`` checkpoint with a ``state_dict`` entry also works),
            or the path of a ``torch.save`` file holding either.
        out_dir: the output folder; see :mod:`hps_core.export.dlrm_files` for its files.
        model_name: the ps.json ``model`` name and the file prefix.
        arch: the architecture the tensors must have (as dlrm's ``--arch-*`` flags give it);
            ``None`` reads it off the tensor shapes.
        key_maps: table index -> int array whose element ``i`` is the key of row ``i``;
            tables without one use key ``i`` for row ``i``.
        max_keys_per_table: most keys one sample looks up per table (one value or one per
            table): ``nnz_per_slot`` in the network and
            ``maxnum_catfeature_query_per_table_per_sample`` in ps.json.
        max_batch_size: the ps.json ``max_batch_size``.
        overwrite: replace existing files in ``out_dir``.
        allow_pickle: when ``model`` is a path, load it with ``weights_only=False`` (runs
            code from the file: only for trusted files).

    Returns:
        The paths written.

    Raises:
        ConfigError: every mismatch between ``arch`` and the tensors (key, both shapes, the
            flag), missing or unexpected keys, a module part HugeCTR would compute
            differently (e.g. ``EmbeddingBag(mode="mean")``), or a bad argument.
        ModelFileError: unreadable checkpoint, duplicate keys in a key map, or files that
            exist without ``overwrite``.
        NotAvailableError: ``model`` needs torch and it is not installed.
    """
    if isinstance(model, str | os.PathLike):
        where = str(model)
        state = load_checkpoint(model, allow_pickle=allow_pickle)
    elif is_module(model):
        where, state = "model", module_state(model)
    else:
        where, state = "state_dict", unwrap_checkpoint(model, "state_dict")
    checked = check_dlrm_state(state, arch or infer_dlrm_arch(state, where), where)
    return write_dlrm_model(
        Path(out_dir),
        model_name,
        checked.arch,
        checked.dense,
        checked.table_sources(),
        key_maps=key_maps,
        max_keys_per_table=max_keys_per_table,
        max_batch_size=max_batch_size,
        overwrite=overwrite,
    )
