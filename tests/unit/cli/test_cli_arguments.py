"""Bad option values are usage errors naming the option, and a --out that cannot be written
is refused before anything is scored (both exit 2, as every error of hps): never a
traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps_core.cli.main import main


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["predict", "ps.json", "d.parquet", "--batch-size", "-5"], ["--batch-size", "at least 1"]),
        (["predict", "ps.json", "d.parquet", "--batch-size", "x"], ["--batch-size", "integer"]),
        (["predict", "ps.json", "d.parquet", "--device", "gpu"], ["--device", "'gpu'"]),
        (["predict", "ps.json", "d.parquet", "--device", "-1"], ["--device", "at least 0"]),
        (["graph", "n.json", "--random-inputs", "0"], ["--random-inputs", "at least 1"]),
        (["prepare", "repo", "--sample-rows", "-5"], ["--sample-rows", "at least 1"]),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_its_option(
    args: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(w in err for w in words), err


def test_an_out_that_cannot_be_written_is_refused_before_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The ps.json does not exist: the --out check comes before anything is read.
    for out, words in (
        (str(tmp_path), "is a folder; give the Parquet file to write"),
        ("s3://bucket/out/pred.parquet", "predictions are written to a local file"),
    ):
        assert main(["predict", "missing.json", "d.parquet", "--out", out, "--overwrite"]) == 2
        assert words in capsys.readouterr().err
    assert not Path("s3:").exists()
