"""Bad input to the DLRM exporter: every problem is named with its tensor key, flag, module
part or file, and a failed export writes nothing."""

from __future__ import annotations

import fractions
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from dlrm_reference import ReferenceDLRM
from torch import nn

from hps_core.errors import ConfigError, ModelFileError
from hps_core.export import DlrmArch, export_dlrm, load_checkpoint

ARCH = DlrmArch(4, (10, 6), (3, 4), (5, 1))


def _model(**kwargs) -> ReferenceDLRM:
    return ReferenceDLRM(4, [10, 6], (3, 4), (5, 1), **kwargs)


def _problems(exc: pytest.ExceptionInfo) -> dict[str, str]:
    return {p.where: p.message for p in exc.value.problems}


def test_shapes_that_disagree_with_the_flags_name_key_and_both_shapes(tmp_path: Path):
    arch = DlrmArch(4, (10, 7), (2, 4), (5, 1))
    with pytest.raises(ConfigError) as info:
        export_dlrm(_model().state_dict(), tmp_path / "out", "m", arch=arch)
    problems = _problems(info)
    assert problems["state_dict['emb_l.1.weight']"] == (
        "has shape (6, 4), but --arch-embedding-size 10-7 and --arch-sparse-feature-size 4 "
        "needs shape (7, 4)"
    )
    assert problems["state_dict['bot_l.0.weight']"] == (
        "has shape (4, 3), but --arch-mlp-bot 2-4 needs shape (4, 2)"
    )
    assert len(problems) == 2
    assert not (tmp_path / "out").exists()


def test_top_width_message_explains_the_computed_interaction_width(tmp_path: Path):
    arch = DlrmArch(4, (10, 6, 3), (3, 4), (5, 1))  # a third table: interaction 7 -> 10 wide
    state = _model().state_dict()
    state["emb_l.2.weight"] = torch.zeros(3, 4)
    with pytest.raises(ConfigError) as info:
        export_dlrm(state, tmp_path, "m", arch=arch)
    message = _problems(info)["state_dict['top_l.0.weight']"]
    assert message.startswith("has shape (5, 7), but --arch-mlp-top 5-1 (after the computed")
    assert "interaction width 10 = 4*3/2 + 4" in message and message.endswith("(5, 10)")


def test_missing_and_unexpected_keys_are_all_listed(tmp_path: Path):
    state = dict(_model().state_dict())
    del state["top_l.2.bias"], state["emb_l.1.weight"]
    state["v_W_l.0"] = torch.ones(10)
    state["extra.weight"] = torch.ones(1)
    with pytest.raises(ConfigError) as info:
        export_dlrm(state, tmp_path, "m", arch=ARCH)
    problems = _problems(info)
    assert problems["state_dict['top_l.2.bias']"].startswith("missing; --arch-mlp-top 5-1")
    assert problems["state_dict['emb_l.1.weight']"].startswith("missing; --arch-embedding-size")
    assert "weighted pooling" in problems["state_dict['v_W_l.0']"]
    assert problems["state_dict['extra.weight']"].startswith("unexpected key")
    assert len(problems) == 4


def test_integer_tensor_is_refused(tmp_path: Path):
    state = dict(_model().state_dict())
    state["bot_l.0.bias"] = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ConfigError, match=r"\['bot_l.0.bias'\]: must be floating point, got"):
        export_dlrm(state, tmp_path, "m")


def test_inferring_the_arch_needs_every_part(tmp_path: Path):
    state = {k: v for k, v in _model().state_dict().items() if not k.startswith("emb_l")}
    with pytest.raises(ConfigError, match=r"state_dict: has no 'emb_l.0.weight'"):
        export_dlrm(state, tmp_path, "m")


def test_mean_pooling_and_other_layers_are_refused_for_a_module(tmp_path: Path):
    model = _model()
    model.emb_l[1] = nn.EmbeddingBag(6, 4, mode="mean")
    model.top_l[1] = nn.Tanh()
    model.bot_l.append(nn.Linear(4, 4))
    model.arch_interaction_itself = True
    with pytest.raises(ConfigError) as info:
        export_dlrm(model, tmp_path, "m")
    problems = _problems(info)
    assert "mode='mean'" in problems["model.emb_l[1]"]
    assert problems["model.top_l[1]"].startswith("is Tanh; expected ReLU")
    assert "ends with a Linear without its ReLU" in problems["model.bot_l"]
    assert "without self-interaction" in problems["model.arch_interaction_itself"]


def test_max_norm_and_plain_embedding_are_refused(tmp_path: Path):
    model = _model()
    model.emb_l[0] = nn.EmbeddingBag(10, 4, mode="sum", max_norm=1.0)
    model.emb_l[1] = nn.Embedding(6, 4)
    with pytest.raises(ConfigError) as info:
        export_dlrm(model, tmp_path, "m")
    problems = _problems(info)
    assert "max_norm=1.0" in problems["model.emb_l[0]"]
    assert problems["model.emb_l[1]"] == "is Embedding; expected nn.EmbeddingBag"


@pytest.mark.parametrize(
    ("key_maps", "error", "pattern"),
    [
        ({0: np.arange(9)}, ConfigError, r"key map of table 0: must be a 1-D integer array of 10"),
        ({1: np.arange(6.0)}, ConfigError, r"key map of table 1: .* got float64 \(6,\)"),
        ({2: np.arange(3)}, ConfigError, r"key map of table 2: no such table; .* tables 0..1"),
        ({1: np.array([5, 1, 5, 2, 3, 4])}, ModelFileError, r"key map of table 1: 1 key appears"),
        ({1: np.full(6, 2**63, np.uint64)}, ConfigError, r"does not fit in int64"),
    ],
)
def test_bad_key_maps(tmp_path: Path, key_maps, error, pattern):
    with pytest.raises(error, match=pattern):
        export_dlrm(_model(), tmp_path / "out", "m", key_maps=key_maps)
    assert not (tmp_path / "out").exists()


def test_bad_arguments_are_listed(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        export_dlrm(_model(), tmp_path, "a/b", max_keys_per_table=[1, 0, 2], max_batch_size=0)
    assert set(_problems(info)) == {"model_name", "max_keys_per_table", "max_batch_size"}


def test_existing_files_are_kept_unless_overwrite(tmp_path: Path):
    first = export_dlrm(_model(seed=1), tmp_path, "m")
    before = first.dense_file.read_bytes()
    with pytest.raises(ModelFileError) as info:
        export_dlrm(_model(seed=2), tmp_path, "m")
    message = str(info.value)
    assert str(first.ps_json) in message and str(first.sparse_files[1] / "key") in message
    assert first.dense_file.read_bytes() == before
    second = export_dlrm(_model(seed=2), tmp_path, "m", overwrite=True)
    assert second.dense_file.read_bytes() != before


def test_checkpoint_with_other_objects_needs_allow_pickle(tmp_path: Path):
    path = tmp_path / "c.pt"
    torch.save({"state_dict": _model().state_dict(), "note": fractions.Fraction(1, 3)}, path)
    with pytest.raises(
        ModelFileError, match=r"c.pt: holds objects other than tensors.*--allow-pickle"
    ):
        load_checkpoint(path)
    assert set(load_checkpoint(path, allow_pickle=True)) == set(ARCH.expected_shapes())


# Unpickling looks the missing class up in __main__, which Python 3.11's importlib warns of.
@pytest.mark.filterwarnings("ignore:BuiltinImporter.module_repr:DeprecationWarning")
def test_a_whole_pickled_module_says_to_save_its_state_dict(tmp_path: Path):
    """A module saved whole (``torch.save(model)``) loads only where its class imports."""
    path = tmp_path / "whole.pt"
    script = (
        "import sys, torch\n"
        "class DLRM_Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(2, 1)\n"
        "torch.save(DLRM_Net(), sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    with pytest.raises(ModelFileError) as info:
        load_checkpoint(path, allow_pickle=True)
    message = str(info.value)
    assert "whole.pt: holds a pickled Python object whose class cannot be found" in message
    assert "DLRM_Net" in message and "torch.save(model.state_dict(), path)" in message


def test_files_that_are_not_state_dicts(tmp_path: Path):
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(ConfigError, match=r"tensor.pt: expected a state dict .* got Tensor"):
        load_checkpoint(tmp_path / "tensor.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ModelFileError, match=r"junk.pt: cannot load as a PyTorch file"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(ModelFileError, match=r"absent.pt: cannot load"):
        load_checkpoint(tmp_path / "absent.pt")
