"""The translation of a HugeCTR repository follows the repository while serving: an edited
ps.json or config.pbtxt, a new version folder, a model added or removed are translated on the
next scan (the translated folder changes, so Triton's next load reloads it); an edit that
cannot be served leaves the previous translation and says why."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hugectr_repository import HugeCTRRepository, write_hugectr_repository

from hps_core import hugectr_watch
from hps_core.config import load_ps_config
from hps_core.hugectr_watch import SCANNED, STAMP, TranslationWatch, wait_for_scan
from hps_core.triton_repo import read_config, write_config


@pytest.fixture
def hugectr(tmp_path: Path) -> HugeCTRRepository:
    return write_hugectr_repository(tmp_path / "user")


@pytest.fixture
def watch(
    hugectr: HugeCTRRepository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> TranslationWatch:
    monkeypatch.setattr(hugectr_watch, "SETTLE_S", 0.0)  # files written here are whole
    ps = {"hps": hugectr.hps_ps, "hugectr": hugectr.hugectr_ps}
    translation = TranslationWatch(hugectr.repo, ps, tmp_path / "translation")
    translation.translate_all()
    return translation


def edit_ps(path: Path, **fields: object) -> None:
    document = json.loads(path.read_text())
    document["models"][0].update(fields)
    path.write_text(json.dumps(document))


def test_nothing_changed_nothing_written(watch: TranslationWatch) -> None:
    stamps = {p: p.read_text() for p in watch.out.glob(f"*/{STAMP}")}
    assert len(stamps) == 2
    assert watch.scan() == []
    assert {p: p.read_text() for p in watch.out.glob(f"*/{STAMP}")} == stamps


def test_an_edited_ps_json_and_a_new_version_are_translated(
    watch: TranslationWatch, hugectr: HugeCTRRepository
) -> None:
    stamp = (watch.out / "dlrm" / STAMP).read_text()
    edit_ps(hugectr.hugectr_ps, refresh_delay=5.0)
    lines = watch.scan()
    assert any(line.startswith("model 'dlrm' changed in") for line in lines), lines
    assert load_ps_config(watch.out / "dlrm" / "ps.json").model("dlrm").refresh_delay == 5.0
    assert (watch.out / "dlrm" / STAMP).read_text() != stamp

    # HugeCTR's update of a model: a version folder, the config's version policy.
    (hugectr.repo / "hps_embedding" / "2").mkdir()
    config = read_config(hugectr.repo / "hps_embedding" / "config.pbtxt")
    config.version_policy.specific.versions[:] = [2]
    write_config(hugectr.repo / "hps_embedding" / "config.pbtxt", config)
    watch.scan()
    written = read_config(watch.out / "hps_embedding" / "config.pbtxt")
    assert list(written.version_policy.specific.versions) == [2]
    assert (watch.out / "hps_embedding" / "2" / "model.py").is_file()


def test_an_edit_that_cannot_be_served_keeps_the_previous_translation(
    watch: TranslationWatch, hugectr: HugeCTRRepository
) -> None:
    before = (watch.out / "dlrm" / "ps.json").read_text()
    edit_ps(hugectr.hugectr_ps, gpucacheper=7)
    (line,) = [x for x in watch.scan() if "dlrm" in x]
    assert "model 'dlrm' changed in" in line and "keeps its previous translation" in line
    assert "gpucacheper" in line
    assert (watch.out / "dlrm" / "ps.json").read_text() == before
    assert not [x for x in watch.scan() if "dlrm" in x]  # said once per state of the files
    edit_ps(hugectr.hugectr_ps, gpucacheper=0.3, refresh_delay=2.0)
    assert any("model 'dlrm' changed" in x for x in watch.scan())
    assert load_ps_config(watch.out / "dlrm" / "ps.json").model("dlrm").refresh_delay == 2.0


def test_models_added_and_removed(watch: TranslationWatch, hugectr: HugeCTRRepository) -> None:
    other = hugectr.repo / "ranker"
    (other / "1").mkdir(parents=True)
    (other / "config.pbtxt").write_text('name: "ranker"\nbackend: "onnxruntime"\n')
    watch.scan()
    assert (watch.out / "ranker").resolve() == other.resolve()
    (other / "config.pbtxt").unlink()
    (other / "1").rmdir()
    other.rmdir()
    lines = watch.scan()
    assert lines == [f"model 'ranker' left {hugectr.repo}: removed from the translation"]
    assert not (watch.out / "ranker").exists() and not (watch.out / "ranker").is_symlink()


def test_wait_for_scan_waits_for_a_scan_that_started_later(watch: TranslationWatch) -> None:
    started = time.time()
    assert not wait_for_scan(watch.folder, started, timeout_s=0.2)
    watch.scan()
    assert wait_for_scan(watch.folder, started, timeout_s=0.2)
    assert float((watch.folder / SCANNED).read_text()) >= started


def test_the_thread_reports_what_it_translates(
    watch: TranslationWatch, hugectr: HugeCTRRepository
) -> None:
    lines: list[str] = []
    watch.start(lines.append)
    try:
        edit_ps(hugectr.hps_ps, gpucacheper=0.1)
        assert wait_for_scan(watch.folder, time.time())
    finally:
        watch.stop()
    assert any(line.startswith("model 'hps_embedding' changed") for line in lines), lines


def test_files_being_written_are_left_for_a_later_scan(
    watch: TranslationWatch, hugectr: HugeCTRRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change younger than SETTLE_S is not read (it may be half written), and the scanned
    stamp waits for it; a config.pbtxt that does not parse fails its model alone."""
    monkeypatch.setattr(hugectr_watch, "SETTLE_S", 60.0)
    started = time.time()
    edit_ps(hugectr.hugectr_ps, refresh_delay=3.0)
    assert watch.scan() == []
    assert not wait_for_scan(watch.folder, started, timeout_s=0.1)
    monkeypatch.setattr(hugectr_watch, "SETTLE_S", 0.0)
    (hugectr.repo / "hps_embedding" / "config.pbtxt").write_text("name: [broken")
    lines = watch.scan()
    assert any("model 'hps_embedding' changed" in x and "keeps its previous" in x for x in lines)
    assert any(x.startswith("model 'dlrm' changed") for x in lines), lines
    assert load_ps_config(watch.out / "dlrm" / "ps.json").model("dlrm").refresh_delay == 3.0
    assert wait_for_scan(watch.folder, started, timeout_s=0.1)
