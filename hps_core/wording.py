"""Wording shared by messages: counts with their nouns."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, the noun with an ``s`` unless the count is one.

    Example:
        >>> plural(1, "model"), plural(3, "table"), plural(0, "key")
        ('1 model', '3 tables', '0 keys')
    """
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"
