"""Fixtures of the formats tests (defined in formats_testdata, a uniquely named module)."""

from formats_testdata import random_table, rng

__all__ = ["random_table", "rng"]
