"""The results of a benchmark script: a CSV file and the same rows as a Markdown table."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_results(
    path: Path, columns: Sequence[str], rows: Sequence[Mapping], float_format: str = ",.4g"
) -> None:
    """Write ``rows`` to the CSV file ``path`` (``columns`` only, in that order) and print them
    as a Markdown table.

    Args:
        path: the CSV file to write.
        columns: the keys of each row to keep.
        rows: the results, one mapping per row (a missing key prints empty).
        float_format: format spec of floats in the printed table (the CSV keeps full precision).

    Example:
        >>> write_results(Path("/tmp/r.csv"), ["n", "ms"], [{"n": 1024, "ms": 0.12345}])
        <BLANKLINE>
        | n | ms |
        | --- | --- |
        | 1,024 | 0.1235 |
    """
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"\n| {' | '.join(columns)} |")
    print("|" + " --- |" * len(columns))
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column, "")
            if isinstance(value, float):
                cells.append(format(value, float_format))
            elif isinstance(value, int) and not isinstance(value, bool):
                cells.append(f"{value:,}")
            else:
                cells.append(str(value))
        print(f"| {' | '.join(cells)} |")
