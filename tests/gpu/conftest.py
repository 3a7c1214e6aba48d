"""Everything under tests/gpu needs CuPy and a visible CUDA device.

Each item here gets the ``gpu`` marker; when CuPy does not import or sees no device, each is
skipped with the reason. Test modules import CuPy with ``pytest.importorskip("cupy")`` so
that collecting them never fails on a machine without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from instance_kinds import cuda_unavailable_reason

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if _HERE in item.path.parents]
    if not gpu_items:
        return
    reason = cuda_unavailable_reason()
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
