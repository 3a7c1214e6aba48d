"""Argument types the ``hps`` subcommands share: a bad value is a usage error naming the
option, not a traceback."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def device_choice(text: str) -> str | int:
    """An argparse type: ``auto``, ``cpu`` or a GPU id (an integer of at least 0)."""
    if text in ("auto", "cpu"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not 'auto', 'cpu' or a GPU id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a GPU id is at least 0, got {value}")
    return value
