"""``hps serve`` names every model that failed to load, with Triton's reason, and how many
models serve."""

from __future__ import annotations

from hps_core.cli.main import build_parser
from hps_core.cli.serve import report_unavailable_models
from hps_core.server.process import ModelState


def test_unavailable_models_are_named_with_their_reason_without_stack_frames(capsys) -> None:
    states = {
        "good": ModelState("READY", ""),
        "bad": ModelState(
            "UNAVAILABLE",
            "Internal: ModelFileError: /m/emb_vector\n looks truncated\n\nAt:\n"
            "  /x/hps_core/model_check.py(164): check_model_files\n"
            "  /x/triton_backend/embedding_model.py(49): initialize\n",
        ),
        "other": ModelState("", ""),
    }
    lines = report_unavailable_models(states)
    err = capsys.readouterr().err
    assert lines == err.splitlines()
    assert lines[0] == (
        "hps serve: model 'bad' is UNAVAILABLE: Internal: ModelFileError: /m/emb_vector looks "
        "truncated"
    )
    assert lines[1] == "hps serve: model 'other' is not loaded: no reason given"
    assert lines[2].startswith("hps serve: 1 of 3 models serve")
    one = report_unavailable_models({"bad": ModelState("UNAVAILABLE", "x")})
    assert one[-1].startswith("hps serve: 0 of 1 model serve")


def test_all_ready_prints_nothing(capsys) -> None:
    assert report_unavailable_models({"a": ModelState("READY", "")}) == []
    assert capsys.readouterr().err == ""


def test_strict_models_is_off_unless_asked() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).strict_models is False
    assert parser.parse_args(["serve", "--strict-models"]).strict_models is True
