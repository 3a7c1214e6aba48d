"""Fixtures of the config tests: fresh copies of the sample ps.json documents."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ps_samples import MINIMAL_PS, REALISTIC_PS


@pytest.fixture
def realistic() -> dict[str, Any]:
    """A fresh deep copy of ``REALISTIC_PS`` that a test may modify."""
    return copy.deepcopy(REALISTIC_PS)


@pytest.fixture
def minimal() -> dict[str, Any]:
    """A fresh deep copy of ``MINIMAL_PS`` that a test may modify."""
    return copy.deepcopy(MINIMAL_PS)
