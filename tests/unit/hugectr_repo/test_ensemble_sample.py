"""hugectr_backend's hps-triton-ensemble sample (model ``hps_test``) as its notebook writes it:
its version folder ``0`` is translated as folder ``0`` (HugeCTR models of either backend),
its ps.json loads with HugeCTR's reading of a repeated key, and the translated model's load
check names the user's ps.json and logs the warnings ``hps check`` prints for it."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from hugectr_repository import (
    HugeCTRRepository,
    write_ensemble_sample,
    write_hugectr_repository,
)

from hps_core.cli.serve import report_unavailable_models
from hps_core.config import load_ps_config
from hps_core.errors import ConfigError
from hps_core.hugectr_repo import translate_repository, user_paths
from hps_core.infer.model_io import SOURCE_PS_JSON_PARAMETER
from hps_core.model_check import check_model_files, check_ps_json
from hps_core.server.process import ModelState
from hps_core.triton_repo import model_versions, read_config, version_ps_json


def test_the_samples_version_folder_0_is_served_as_version_0(tmp_path: Path) -> None:
    sample = write_ensemble_sample(tmp_path)
    out = tmp_path / "t" / "repo"
    translate_repository(sample.repo, {"hps": sample.ps_json}, out)
    folder = out / "hps_test"
    assert model_versions(folder) == [0]
    assert not (folder / "1").exists() and not (folder / "ps.json").exists()
    config = read_config(folder / "config.pbtxt")
    assert list(config.version_policy.specific.versions) == [0]
    assert config.parameters[SOURCE_PS_JSON_PARAMETER].string_value == str(sample.ps_json)
    served = load_ps_config(version_ps_json(folder, 0)).model("hps_test")
    assert served.tables[0].sparse_file == sample.sparse
    assert served.num_of_refresher_buffer_in_pool == 0  # the last of the two, as HugeCTR


@pytest.mark.parametrize("model", ["hps_embedding", "dlrm"])
def test_a_version_folder_0_of_either_backend_is_served_as_version_0(
    tmp_path: Path, model: str
) -> None:
    hugectr: HugeCTRRepository = write_hugectr_repository(tmp_path)
    (hugectr.repo / model / "1").rename(hugectr.repo / model / "0")
    (hugectr.repo / model / "2").mkdir()  # 0 and 2: each version its own folder and ps.json
    out = tmp_path / "out"
    ps = {"hps": hugectr.hps_ps, "hugectr": hugectr.hugectr_ps}
    translate_repository(hugectr.repo, ps, out)
    assert model_versions(out / model) == [0, 2]
    assert (out / model / "0" / "ps.json").is_file() and (out / model / "2" / "ps.json").is_file()
    assert not (out / model / "1").exists()


def test_the_load_check_names_the_users_ps_json_and_warns_as_hps_check_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The translated ps.json keeps no repeated key and no list HugeCTR fits: the load check
    of the translated model logs the warnings of the user's file (as ``hps check`` words
    them), each naming it; its problems name it too."""
    sample = write_ensemble_sample(tmp_path)
    # Two default values for one table, as other HugeCTR samples write them: fitted, warned.
    text = sample.ps_json.read_text()
    sample.ps_json.write_text(text.replace("[0.0]", "[0.0, 1.0]"))
    out = tmp_path / "t" / "repo"
    translate_repository(sample.repo, {"hps": sample.ps_json}, out)
    copy = version_ps_json(out / "hps_test", 0)
    checked = check_ps_json(sample.ps_json, "hps_test")
    assert [w.split(" ")[0] for w in checked.warnings] == [
        "models[0].num_of_refresher_buffer_in_pool",  # given twice
        "models[0].num_of_worker_buffer_in_pool",  # 3: no effect here
        "models[0].num_of_refresher_buffer_in_pool",  # 0: no effect here
        "models[0].default_value_for_each_table",  # fitted to one table
    ]
    assert f"is given 2 times in {sample.ps_json} (1 then 0): 0 is taken" in checked.warnings[0]
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        check_model_files(copy, "hps_test", network=False, source=sample.ps_json)
    assert [r.getMessage() for r in caplog.records] == [
        f"{sample.ps_json}: {line}" for line in checked.warnings
    ]
    assert not any(str(out) in r.getMessage() for r in caplog.records)

    shutil.rmtree(sample.sparse)
    with pytest.raises(ConfigError) as info:
        check_model_files(copy, "hps_test", network=False, source=sample.ps_json)
    [problem] = info.value.problems
    assert problem.where == f"{sample.ps_json}: models[0].sparse_files[0]"
    assert str(out) not in str(info.value)


def test_tritons_reasons_name_the_users_files(tmp_path: Path, capsys) -> None:
    sample = write_ensemble_sample(tmp_path)
    translation = tmp_path / "t"
    translate_repository(sample.repo, {"hps": sample.ps_json}, translation / "repo")
    repo = translation / "repo"
    text = (
        f"ConfigError: {repo}/hps_test/0/ps.json: bad; {repo}/hps_test/config.pbtxt: worse; "
        f"{repo}/other/ps.json"
    )
    assert user_paths(text, translation, sample.repo) == (
        f"ConfigError: {sample.ps_json}: bad; {sample.repo}/hps_test/config.pbtxt: worse; "
        f"{sample.repo}/other/ps.json"
    )
    states = {"hps_test": ModelState("UNAVAILABLE", text)}
    [line, _] = report_unavailable_models(states, lambda t: user_paths(t, translation, sample.repo))
    assert str(sample.ps_json) in line and str(translation) not in line
    capsys.readouterr()


def test_a_path_given_from_the_servers_folder_as_the_notebook_gives_it_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notebook's hps.json gives its sparse folder from the server's working folder
    (``model/hps_test/0/hps_sparse.model``, tritonserver started in the folder above
    ``model``), which HugeCTR reads from there; here a relative path is read from the
    ps.json's folder: the translation, run where the user starts hps serve, says so."""
    sample = write_ensemble_sample(tmp_path)
    text = sample.ps_json.read_text()
    sample.ps_json.write_text(text.replace('"hps_test/0/', '"model/hps_test/0/'))
    monkeypatch.chdir(tmp_path)
    notes = translate_repository(sample.repo, {"hps": sample.ps_json}, tmp_path / "t" / "repo")
    assert (
        f"model 'hps_test' (backend hps): {sample.ps_json}: models[0].sparse_files[0]: "
        f"{sample.repo / 'model' / 'hps_test' / '0' / 'hps_sparse.model'} does not exist (a "
        f"relative path in a ps.json is read from its folder, {sample.repo}; "
        "model/hps_test/0/hps_sparse.model exists from the current folder: give it from the "
        "ps.json's folder, or absolute)"
    ) in notes
    monkeypatch.chdir(sample.repo)  # from elsewhere, nothing to explain
    assert not any("does not exist" in n for n in translate_repository(
        sample.repo, {"hps": sample.ps_json}, tmp_path / "t2" / "repo"
    ))  # fmt: skip
