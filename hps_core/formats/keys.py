"""Checks on the keys of an embedding table.

Every int64 value is a valid key (negative ones and the int64 extremes included): HugeCTR
keys are hashes or ids, not indices. A key may appear only once in a table, since a lookup
has to return one vector; HugeCTR does not check this and keeps whichever row its hash map
inserted last.
"""

from __future__ import annotations

import numpy as np

from hps_core.errors import ModelFileError
from hps_core.wording import plural

# How many duplicated keys an error message lists.
_SHOWN_DUPLICATES = 5


def _repeats(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Return the sorted distinct repeated keys and the number of extra rows they take."""
    ordered = np.sort(np.asarray(keys).ravel())
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size == 0:
        return repeated, 0
    # ``repeated`` is sorted, so its distinct values start where it changes.
    first = np.concatenate(([True], repeated[1:] != repeated[:-1]))
    return repeated[first], int(repeated.size)


def find_duplicate_keys(keys: np.ndarray) -> np.ndarray:
    """Find the keys that appear more than once.

    Args:
        keys: integer array of any shape.

    Returns:
        Sorted array of the distinct keys that occur at least twice (empty if none), of the
        same dtype as ``keys``.

    Example:
        >>> find_duplicate_keys(np.array([5, -1, 5, 7, -1, 5]))
        array([-1,  5])
    """
    return _repeats(keys)[0]


def check_unique_keys(keys: np.ndarray, where: str) -> None:
    """Raise if a key appears more than once.

    Args:
        keys: integer array of any shape.
        where: what holds the keys (a file or folder path), named in the message.

    Raises:
        ModelFileError: naming ``where``, how many keys repeat, how many rows are extra,
            and up to five of the repeated keys.
    """
    duplicates, extra_rows = _repeats(keys)
    if duplicates.size == 0:
        return
    shown = ", ".join(str(int(k)) for k in duplicates[:_SHOWN_DUPLICATES])
    more = ", ..." if duplicates.size > _SHOWN_DUPLICATES else ""
    raise ModelFileError(
        f"{where}: {plural(duplicates.size, 'key')} "
        f"{'appears' if duplicates.size == 1 else 'appear'} more than once "
        f"({plural(extra_rows, 'extra row')}): {shown}{more}"
    )
