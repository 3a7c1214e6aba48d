"""The interface every runnable layer implements, and the checks their builders share.

A layer is built once from its :class:`~hps_core.nn.spec.network_json.LayerSpec` and the shapes of
its inputs; building validates the JSON fields and infers the output shapes. ``forward`` is
written once against ``ctx.xp``, so the same code runs on NumPy and CuPy arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, ClassVar

from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext
from hps_core.nn.spec.shapes import TensorShape

Array = Any  # a numpy.ndarray or cupy.ndarray


@dataclass(frozen=True)
class ParamShape:
    """One trainable tensor of a layer, in the order the dense model file stores it.

    Args:
        name: short name, e.g. ``weight`` or ``bias``.
        shape: the tensor's shape as HugeCTR allocates it.
    """

    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Number of float32 values in the dense model file."""
        return prod(self.shape)


class Layer(ABC):
    """A layer ready to run: configuration validated and output shapes known."""

    #: HugeCTR type names this class runs.
    type_names: ClassVar[tuple[str, ...]] = ()
    #: Whether the layer has parameters in the dense model file.
    trainable: ClassVar[bool] = False
    #: Whether a sample's output depends on the other samples of its batch (statistics over
    #: the batch, as DIN's Dice takes them at inference too).
    batch_dependent: ClassVar[bool] = False

    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def consumed_bottoms(cls, spec: LayerSpec) -> tuple[str, ...]:
        """The bottoms whose values the forward pass reads (all of them by default)."""
        return spec.bottoms

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Layer:
        """Validate ``spec`` against the input shapes and return the layer.

        Args:
            spec: the layer as written in the network file.
            inputs: shapes of the consumed bottoms, in order.

        Returns:
            The layer, its output shapes inferred.

        Raises:
            ConfigError: a field is invalid or the input shapes do not fit.
        """
        raise NotImplementedError(f"{cls.__name__} is not built from dense inputs")

    def param_shapes(self) -> tuple[ParamShape, ...]:
        """The trainable tensors in dense-model-file order (none by default)."""
        return ()

    def state_shapes(self) -> tuple[ParamShape, ...]:
        """Non-trained tensors (BatchNorm's running statistics), which HugeCTR keeps in the
        dense model file's ``.ntp.json``; the forward pass gets them after the trained ones.
        ``name`` is the JSON key."""
        return ()

    @abstractmethod
    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        """Compute the outputs.

        Args:
            ctx: array module and precision.
            inputs: one array per consumed bottom, in the storage dtype.
            params: the layer's parameters in :meth:`param_shapes` order, storage dtype.

        Returns:
            One array per top, in the storage dtype.
        """


def expect_counts(
    spec: LayerSpec, inputs: Sequence[TensorShape], n_in: int | None, n_out: int | None = 1
) -> None:
    """Check the number of inputs (at least 2 when ``n_in`` is None) and of tops.

    Raises:
        ConfigError: a count is wrong.
    """
    if n_in is None and len(inputs) < 2:
        raise spec.error(f"needs at least 2 bottoms, got {len(inputs)}", "bottom")
    if n_in is not None and len(inputs) != n_in:
        raise spec.error(f"needs {n_in} bottom(s), got {len(inputs)}", "bottom")
    if n_out is not None and len(spec.tops) != n_out:
        raise spec.error(f"needs {n_out} top(s), got {len(spec.tops)}", "top")


def expect_rank(spec: LayerSpec, shape: TensorShape, ranks: tuple[int, ...], which: int) -> None:
    """Check that input ``which`` has one of the allowed ranks.

    Raises:
        ConfigError: the rank is not allowed.
    """
    if shape.rank not in ranks:
        allowed = " or ".join(f"{r}-D" for r in ranks)
        raise spec.error(
            f"input '{spec.bottoms[which]}' must be {allowed}, got shape {shape}", "bottom"
        )


def expect_same_shapes(spec: LayerSpec, inputs: Sequence[TensorShape]) -> None:
    """Check that all inputs have the same shape (element-wise layers).

    Raises:
        ConfigError: two inputs differ.
    """
    for name, shape in zip(spec.bottoms[1:], inputs[1:], strict=True):
        if shape != inputs[0]:
            raise spec.error(
                f"all inputs must have the same shape: '{spec.bottoms[0]}' is {inputs[0]}, "
                f"'{name}' is {shape}",
                "bottom",
            )
