"""``hps convert dlrm``: from a ``torch.save`` file to a ps.json that ``hps check`` accepts,
that ``hps repo`` serves, and whose files predict what the PyTorch model predicts."""

from __future__ import annotations

import fractions
from pathlib import Path

import numpy as np
import pytest
import torch
from dlrm_reference import ReferenceDLRM, hps_predict, random_batch, torch_predict

from hps_core.cli.main import main
from hps_core.model_check import check_ps_json

ROWS = [1000, 500, 20]
FLAGS = [
    "--arch-sparse-feature-size",
    "16",
    "--arch-embedding-size",
    "1000-500-20",
    "--arch-mlp-bot",
    "13-64-16",
    "--arch-mlp-top",
    "64-32-1",
]


@pytest.fixture
def model() -> ReferenceDLRM:
    return ReferenceDLRM(16, ROWS, (13, 64, 16), (64, 32, 1), seed=4)


def _convert(tmp_path: Path, *extra: str, state: str = "m.pt") -> int:
    argv = ["convert", "dlrm", "--state-dict", str(tmp_path / state), "--model-name", "dlrm"]
    return main([*argv, "--out", str(tmp_path / "out"), *extra])


def _assert_predicts_like(model: ReferenceDLRM, ps_json: Path, max_hot: int = 1, key_maps=None):
    inputs = random_batch(np.random.default_rng(max_hot), 32, 13, ROWS, max_hot)
    np.testing.assert_allclose(
        hps_predict(ps_json, "dlrm", inputs, key_maps), torch_predict(model, inputs), rtol=1e-5
    )


def test_state_dict_file_to_checked_servable_model(tmp_path: Path, model, capsys):
    torch.save(model.state_dict(), tmp_path / "m.pt")
    assert _convert(tmp_path, *FLAGS) == 0
    out = capsys.readouterr().out
    ps_json = tmp_path / "out" / "ps.json"
    assert f"wrote {ps_json}" in out and "table 1: 500 rows x 16 (key = row)" in out
    report = check_ps_json(ps_json)
    assert report.ok, report.problems
    assert [t.rows for t in report.models[0].tables] == ROWS
    _assert_predicts_like(model, ps_json)
    assert main(["repo", str(ps_json), str(tmp_path / "repo")]) == 0
    assert (tmp_path / "repo" / "dlrm" / "config.pbtxt").is_file()


def test_dlrm_checkpoint_without_flags_key_maps_and_multi_hot(tmp_path: Path, model):
    checkpoint = {"state_dict": model.state_dict(), "train_acc": np.float64(0.7), "iter": 9}
    torch.save(checkpoint, tmp_path / "m.pt")
    rng = np.random.default_rng(0)
    key_maps = {1: rng.choice(2**40, 500, replace=False), 2: np.arange(20)[::-1] * 7 - 50}
    for t, keys in key_maps.items():
        np.save(tmp_path / f"keys{t}.npy", keys)
    extra = ["--max-keys-per-table", "3-3-3", "--max-batch-size", "256"]
    for t in key_maps:
        extra += ["--key-map", f"{t}={tmp_path / f'keys{t}.npy'}"]
    assert _convert(tmp_path, *extra, "--arch-mlp-bot", "13-64-16") == 0
    ps_json = tmp_path / "out" / "ps.json"
    report = check_ps_json(ps_json)
    assert report.ok, report.problems
    config = report.models[0].model
    assert config.max_batch_size == 256
    assert [t.max_query_per_sample for t in config.tables] == [3, 3, 3]
    _assert_predicts_like(model, ps_json, max_hot=3, key_maps=key_maps)


def _error_lines(capsys) -> str:
    return capsys.readouterr().err


def test_shape_mismatch_is_reported_with_the_file_key_and_shapes(tmp_path: Path, model, capsys):
    torch.save(model.state_dict(), tmp_path / "m.pt")
    flags = [*FLAGS]
    flags[flags.index("13-64-16")] = "12-64-16"
    assert _convert(tmp_path, *flags) == 2
    err = _error_lines(capsys)
    assert f"error: {tmp_path / 'm.pt'}['bot_l.0.weight']: has shape (64, 13)" in err
    assert "--arch-mlp-bot 12-64-16 needs shape (64, 12)" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--arch-interaction-itself"], "--arch-interaction-itself: HugeCTR's Interaction"),
        (["--arch-mlp-top", "64-x"], "--arch-mlp-top: must be positive integers"),
        (["--max-keys-per-table", "1-2"], "max_keys_per_table: needs one value >= 1 or 3"),
        (["--key-map", "0=a.npy", "--key-map", "0=b.npy"], "--key-map: table 0 is given twice"),
        (["--key-map", "1=absent.npy"], "absent.npy: cannot read the key map of table 1"),
    ],
)
def test_bad_flags(tmp_path: Path, model, capsys, extra, message):
    torch.save(model.state_dict(), tmp_path / "m.pt")
    assert _convert(tmp_path, *extra) == 2
    assert message in _error_lines(capsys)


def test_key_map_flag_syntax_is_checked_by_argparse(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        _convert(tmp_path, "--key-map", "keys.npy")
    assert "must be TABLE=FILE.npy" in _error_lines(capsys)


def test_pickled_objects_need_allow_pickle(tmp_path: Path, model, capsys):
    torch.save({"state_dict": model.state_dict(), "x": fractions.Fraction(1, 3)}, tmp_path / "m.pt")
    assert _convert(tmp_path) == 2
    assert "pass --allow-pickle" in _error_lines(capsys)
    assert _convert(tmp_path, "--allow-pickle") == 0
    _assert_predicts_like(model, tmp_path / "out" / "ps.json")
