"""README's walk-through to offline scoring runs as written: the ``bash`` block of its "Offline
scoring" section, line by line, in a fresh folder holding what ``scripts/setup.sh`` leaves (the
``.venv`` and the default ``dlrm`` model), and its files and output are what the README says.

The block is read from README.md, so a README edit that breaks the walk-through fails here.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

README = Path(__file__).resolve().parents[3] / "README.md"
VENV = Path(sys.prefix)
HPS = VENV / "bin" / "hps"


def readme_block(marker: str) -> list[str]:
    """The command lines (comments dropped) of README's one ``bash`` block holding ``marker``."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    [block] = [b for b in blocks if marker in b]
    lines = [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder as a newcomer's checkout is after set-up: ``.venv`` and the default dlrm."""
    if not HPS.is_file():
        pytest.skip(f"{HPS} is not installed (scripts/setup.sh installs it)")
    (tmp_path / ".venv").symlink_to(VENV, target_is_directory=True)
    # What scripts/setup.sh runs for every default model; the walk-through uses dlrm only.
    run(tmp_path, f"{HPS} prepare model_repository --model dlrm")
    return tmp_path


def run(folder: Path, line: str) -> str:
    done = subprocess.run(
        ["bash", "-c", line], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stderr[-2000:]}"
    return done.stdout + done.stderr


def test_offline_scoring_walkthrough_runs_as_written(checkout: Path) -> None:
    lines = readme_block("--sample-data")
    assert [shlex.split(line)[:2] for line in lines] == [
        [".venv/bin/hps", "prepare"], [".venv/bin/hps", "predict"]
    ]  # fmt: skip
    printed = "\n".join(run(checkout, line) for line in lines)

    # "writes 10,000 labelled samples ... in Criteo's column names and NVTabular's types"
    samples = pq.read_table(checkout / "sample_data" / "dlrm.parquet")
    assert samples.num_rows == 10_000
    schema = {field.name: str(field.type) for field in samples.schema}
    assert schema == {
        "label": "int32",
        **{f"I{i}": "float" for i in range(1, 14)},
        **{f"C{i}": "int64" for i in range(1, 27)},
    }
    labels = samples.column("label").to_numpy()
    assert set(np.unique(labels)) == {0, 1}

    # "prints samples/s and the AUC, and writes the labels next to the predictions"
    assert re.search(
        r"scored 10,000 samples on the (CPU|GPU \d+) in [\d.]+ s \([\d,]+/s\)$", printed, re.M
    )
    [auc] = re.findall(r"^AUC (\S+)$", printed, flags=re.MULTILINE)
    assert 0.6 < float(auc) < 0.8, f"README says about 0.7 for the demo DLRM, got {auc}"
    scored = pq.read_table(checkout / "dlrm_pred.parquet")
    assert scored.column_names == ["label", "prediction"]
    np.testing.assert_array_equal(scored.column("label").to_numpy(), labels)
    predictions = scored.column("prediction").to_numpy()
    assert np.all((predictions > 0) & (predictions < 1))
