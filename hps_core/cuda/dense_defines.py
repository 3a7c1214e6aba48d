"""What ``kernels/dense.cu`` is compiled with, importable without CuPy (so the unit tests can
check the source text): its template instantiations and the constants it shares with
:mod:`hps_core.cuda.dense_ops`, written as ``#define`` lines by :func:`dense_defines`."""

from __future__ import annotations

from hps_core.cuda.kernels import define_lines

DENSE_TEMPLATES = (
    "interaction<float>", "interaction<unsigned short>", "row_dot<float>",
    "row_dot<unsigned short>", "concat_rows<unsigned>", "concat_rows<unsigned short>",
    "column_moments<float>", "column_moments<unsigned short>",
)  # fmt: skip
"""The template instantiations ``kernels/dense.cu`` is compiled with (one module for all)."""

CONCAT_INPUTS = 8
"""Inputs one ``concat_rows`` launch takes (its kernel has a pointer argument for each)."""

MOMENT_ROWS = 8
"""Rows of a ``column_moments`` block (``blockDim.y``; its threads are 32 columns by these)."""


def dense_defines() -> str:
    """The ``#define`` lines ``kernels/dense.cu`` is compiled with.

    Example:
        >>> dense_defines()
        '#define CONCAT_INPUTS 8\\n#define MOMENT_ROWS 8\\n'
    """
    return define_lines({"CONCAT_INPUTS": CONCAT_INPUTS, "MOMENT_ROWS": MOMENT_ROWS})
