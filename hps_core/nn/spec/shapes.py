"""Symbolic tensor shapes whose leading dimension scales with the batch size.

HugeCTR builds its network for one fixed ``max_batchsize``; a server sees any batch size up to
that. A :class:`TensorShape` therefore keeps the leading dimension as a multiple of the batch
size ``B`` (``26B`` after a Reshape that puts every slot on its own row) and the trailing
dimensions as plain integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class TensorShape:
    """Shape ``(rows_per_sample * B, *dims)`` of one tensor of the graph.

    Args:
        rows_per_sample: rows of the leading dimension per sample (1 for ``(B, ...)``).
        dims: the trailing dimensions.

    Example:
        >>> str(TensorShape(1, (26, 16)))
        '(B, 26, 16)'
        >>> TensorShape(26, (11,)).concrete(4)
        (104, 11)
    """

    rows_per_sample: int
    dims: tuple[int, ...]

    @property
    def rank(self) -> int:
        """Number of dimensions, the leading one included."""
        return 1 + len(self.dims)

    @property
    def row_size(self) -> int:
        """Elements in one row of the leading dimension."""
        return prod(self.dims)

    @property
    def sample_size(self) -> int:
        """Elements that belong to one sample."""
        return self.rows_per_sample * self.row_size

    def concrete(self, batch_size: int) -> tuple[int, ...]:
        """Return the array shape for ``batch_size`` samples.

        Args:
            batch_size: number of samples.

        Returns:
            The shape as a tuple of ints.
        """
        return (self.rows_per_sample * batch_size, *self.dims)

    def __str__(self) -> str:
        lead = "B" if self.rows_per_sample == 1 else f"{self.rows_per_sample}B"
        return "(" + ", ".join([lead, *(str(d) for d in self.dims)]) + ")"
