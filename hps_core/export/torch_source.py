"""Read a ``DLRM_Net`` from PyTorch: a saved checkpoint file or a live ``nn.Module``.

torch is imported only here and only when called, so the rest of the exporter (and the
large-model generator) runs with NumPy alone.

A state dict does not record how the model computes, so from a file the exporter trusts the
dlrm layout (sum pooling, ReLU, Sigmoid last). From a module it checks what it can: every
table is an ``nn.EmbeddingBag`` with ``mode="sum"`` and no ``max_norm``, the MLPs are
Linear layers each followed by a ReLU (a Sigmoid after the last one of ``top_l``), and
dlrm's ``arch_interaction_op`` / ``arch_interaction_itself`` attributes, when present, say
``"dot"`` without self-interaction.
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from hps_core.errors import ConfigError, ModelFileError, NotAvailableError, Problem
from hps_core.export.dlrm_state import unwrap_checkpoint


def _torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ModuleNotFoundError:
        raise NotAvailableError(
            "reading a PyTorch model needs torch; install it (pip install torch)"
        ) from None


def _numpy_scalar_globals() -> list[Any]:
    """What pickling a NumPy scalar references: dlrm's checkpoint stores its accuracy and
    loss as NumPy floats, which torch's weights-only loader refuses unless allowed."""
    scalar = importlib.import_module("numpy._core.multiarray").scalar
    return [scalar, np.dtype, *{type(np.dtype(c)) for c in "?bhilqBHILQefdg"}]


def load_checkpoint(path: str | os.PathLike[str], allow_pickle: bool = False) -> Mapping[str, Any]:
    """Load the state dict of a ``torch.save`` file (a state dict or a dlrm checkpoint).

    Args:
        path: the ``.pt`` file.
        allow_pickle: load with ``weights_only=False``, which runs any code the file
            contains; only for files you trust. Without it, tensors, containers and NumPy
            scalars load.

    Returns:
        The state dict (key -> tensor), on the CPU.

    Raises:
        ModelFileError: the file cannot be read or holds objects weights-only loading refuses.
        ConfigError: the file holds neither a state dict nor a dlrm checkpoint.
        NotAvailableError: torch is not installed.
    """
    torch = _torch()
    where = str(path)
    try:
        if allow_pickle:
            loaded = torch.load(path, map_location="cpu", weights_only=False)
        else:
            with torch.serialization.safe_globals(_numpy_scalar_globals()):
                loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = _unpickler_reason(str(exc))
        if reason.startswith("Unsupported global"):
            raise ModelFileError(
                f"{where}: holds objects other than tensors, so it was not loaded ({reason}); "
                "if you trust the file, pass --allow-pickle (Python: allow_pickle=True)"
            ) from None
        raise ModelFileError(f"{where}: cannot load as a PyTorch file: {reason}") from None
    except (AttributeError, ModuleNotFoundError) as exc:
        # A whole pickled module: its class must be importable here to load it.
        raise ModelFileError(
            f"{where}: holds a pickled Python object whose class cannot be found here ({exc}); "
            "save the model's state dict instead: torch.save(model.state_dict(), path)"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise ModelFileError(f"{where}: cannot load as a PyTorch file: {exc}") from None
    return unwrap_checkpoint(loaded, where)


def _unpickler_reason(message: str) -> str:
    """The specific part of torch's long weights-only error, on one line."""
    _, found, detail = message.partition("WeightsUnpickler error:")
    detail = detail.split("Check the documentation")[0] if found else message
    return " ".join(detail.split()) or "not a pickle"


def module_state(module: Any) -> Mapping[str, Any]:
    """Check that ``module`` computes what the exporter writes; return its state dict.

    Args:
        module: a ``DLRM_Net``-style ``nn.Module``.

    Returns:
        ``module.state_dict()``.

    Raises:
        ConfigError: listing every part HugeCTR cannot compute the same way.
    """
    nn = _torch().nn
    problems = []
    for name, expected in (("arch_interaction_op", "dot"), ("arch_interaction_itself", False)):
        value = getattr(module, name, expected)
        if value != expected:
            problems.append(
                Problem(
                    f"model.{name}",
                    f"is {value!r}; HugeCTR's Interaction layer computes the dot interaction "
                    f"without self-interaction ({name} = {expected!r})",
                )
            )
    for t, table in enumerate(getattr(module, "emb_l", ())):
        where = f"model.emb_l[{t}]"
        if not isinstance(table, nn.EmbeddingBag):
            problems.append(Problem(where, f"is {type(table).__name__}; expected nn.EmbeddingBag"))
        elif table.mode != "sum":
            problems.append(
                Problem(
                    where,
                    f"pools with mode='{table.mode}'; the export writes HugeCTR's sum combiner, "
                    "so only mode='sum' gives the same predictions",
                )
            )
        elif table.max_norm is not None:
            problems.append(
                Problem(where, f"renormalises looked-up rows (max_norm={table.max_norm})")
            )
    problems += _mlp_problems(nn, getattr(module, "bot_l", ()), "bot_l", nn.ReLU)
    problems += _mlp_problems(nn, getattr(module, "top_l", ()), "top_l", nn.Sigmoid)
    if problems:
        raise ConfigError(problems)
    return module.state_dict()


def _mlp_problems(nn: Any, mlp: Any, name: str, last_activation: type) -> list[Problem]:
    layers = list(mlp)
    problems = []
    for i, layer in enumerate(layers):
        activation = last_activation if i == len(layers) - 1 else nn.ReLU
        expected = nn.Linear if i % 2 == 0 else activation
        if not isinstance(layer, expected):
            problems.append(
                Problem(
                    f"model.{name}[{i}]",
                    f"is {type(layer).__name__}; expected {expected.__name__} (Linear layers, "
                    f"each followed by ReLU, {last_activation.__name__} after the last)",
                )
            )
    if len(layers) % 2:
        problems.append(
            Problem(f"model.{name}", f"ends with a Linear without its {last_activation.__name__}")
        )
    return problems


def is_module(obj: Any) -> bool:
    """Whether ``obj`` is a torch ``nn.Module`` (checked without importing torch)."""
    return any(
        c.__name__ == "Module" and c.__module__.startswith("torch.") for c in type(obj).__mro__
    )
