"""Everything under tests/gpu needs CuPy and a visible CUDA device.

Each item here gets the ``gpu`` marker; when CuPy does not import or sees no device, each is
skipped with the reason. Test modules import CuPy with ``pytest.importorskip("cupy")`` so
that collecting them never fails on a machine without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def _gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not importable: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"no usable CUDA device: {exc}"
    return None if count > 0 else "no CUDA device visible"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if _HERE in item.path.parents]
    if not gpu_items:
        return
    reason = _gpu_unavailable_reason()
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
