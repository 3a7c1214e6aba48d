"""The examples in hps_core.workload's docstrings run and give what they show."""

from __future__ import annotations

import doctest

import hps_core.workload


def test_docstring_examples():
    result = doctest.testmod(hps_core.workload)
    assert result.attempted >= 5
    assert result.failed == 0
