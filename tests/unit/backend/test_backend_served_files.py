"""A model instance's files around its load: waited for while written, refused when they change
while its tables are read, compared with the last load's: read again on purpose by a load
someone asked for, said loudly (ERROR and gauge) by a restart after a stub died (on
tritonserver: tests/integration/test_files_changed_in_place.py)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
import types
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from hps_core.config import load_ps_config
from hps_core.errors import ModelFileError
from hps_core.load_record import (
    LOAD_RECORDS_ENV,
    RELOAD_PARAMETER,
    LoadRecords,
    load_marker,
    restart_marker,
)
from triton_backend.model_settings import ModelSettings
from triton_backend.served_files import CHANGED_AT_RESTART, ServedFiles


class _Gauges:
    """Stands for Triton's metric families: records the value each metric is set to."""

    COUNTER, GAUGE = 0, 1
    set: ClassVar[list[tuple[str, dict, float]]] = []

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name

    def Metric(self, labels: dict) -> _Metric:  # Triton's name
        return _Metric(self.name, labels)


class _Metric:
    def __init__(self, name: str, labels: dict) -> None:
        self.name, self.labels = name, labels

    def set(self, value: float) -> None:
        _Gauges.set.append((self.name, self.labels, value))

    def __getattr__(self, name: str) -> object:  # the counters' increments
        return lambda *args, **kwargs: None


@pytest.fixture(autouse=True)
def gauges(monkeypatch: pytest.MonkeyPatch) -> list:
    _Gauges.set = []
    monkeypatch.setitem(
        sys.modules, "triton_python_backend_utils", types.SimpleNamespace(MetricFamily=_Gauges)
    )
    return _Gauges.set


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LoadRecords:
    """The server's load records, as the launcher hands them to its stubs."""
    folder = tmp_path / "loads"
    folder.mkdir()
    monkeypatch.setenv(LOAD_RECORDS_ENV, str(folder))
    return LoadRecords(folder)


def _instance(settings: ModelSettings, marker: str | None, name: str = "wdl_0") -> ModelSettings:
    """The settings of an instance of a load marked ``marker`` (none: the server's first)."""
    config = {} if marker is None else {"parameters": {RELOAD_PARAMETER: {"string_value": marker}}}
    return dataclasses.replace(settings, config=config, instance_name=name)


def _load(settings: ModelSettings) -> ServedFiles:
    """What an instance does: settle the files in initialize, then open its tables."""
    files = ServedFiles.settle(settings)
    files.before_opening()
    files.opened("cpu")
    return files


def _rewrite_in_place(settings: ModelSettings, table: int = 0) -> Path:
    sparse = load_ps_config(settings.ps_json).model("wdl").tables[table].sparse_file
    vectors = sparse / "emb_vector"
    data = np.fromfile(vectors, dtype="<f4")
    with vectors.open("r+b") as f:
        f.write((data + 1).astype("<f4").tobytes())
    return vectors


def test_a_first_load_records_what_it_read(settings, records, gauges) -> None:
    files = _load(_instance(settings, None))
    assert not files.restart and files.changed == {}
    record = records.read("wdl", 1)
    assert record is not None and record.load == "" and record.before is None
    assert record.files == files.stamps and len(files.stamps) == len(files.files) > 3
    labels = {"model": "wdl", "instance": "wdl_0", "device": "cpu"}
    assert gauges == [(CHANGED_AT_RESTART[0], labels, 0)]


def test_a_load_asked_for_reads_changed_files_again_and_says_which(
    settings, records, gauges, caplog
) -> None:
    _load(_instance(settings, None))
    vectors = _rewrite_in_place(settings)
    with caplog.at_level(logging.INFO, logger="hps_core"):
        files = _load(_instance(settings, load_marker()))
    assert list(files.changed) == [str(vectors)]
    [said] = [r for r in caplog.records if "read again" in r.getMessage()]
    table = load_ps_config(settings.ps_json).model("wdl").tables[0].name
    assert said.levelno == logging.INFO and said.getMessage().startswith(
        f"model 'wdl' version 1: read again 1 file changed since its last load: table "
        f"'{table}' (sparse_files[0]): {vectors}: modified "
    )
    assert gauges[-1][2] == 0  # not a restart
    assert records.read("wdl", 1).files == files.stamps


def test_a_ps_json_translated_from_the_users_is_named_by_the_users(
    settings, records, caplog
) -> None:
    """A HugeCTR repository's translation (source_ps_json): its ps.json, rewritten when the
    user's changes, is named as the translation of the user's file."""
    translated = dataclasses.replace(settings, source_ps_json=Path("/user/hps.json"))
    _load(_instance(translated, None))
    settings.ps_json.write_text(settings.ps_json.read_text() + "\n")
    with caplog.at_level(logging.INFO, logger="hps_core"):
        _load(_instance(translated, load_marker()))
    [said] = [r.getMessage() for r in caplog.records if "read again" in r.getMessage()]
    assert "ps.json: the translation of /user/hps.json: " in said
    assert str(settings.ps_json) not in said


def test_a_restart_serving_files_changed_since_the_last_load_says_so_on_every_instance(
    settings, records, gauges, caplog
) -> None:
    _load(_instance(settings, None))
    vectors = _rewrite_in_place(settings, table=1)
    marker = restart_marker(1)
    with caplog.at_level(logging.INFO, logger="hps_core"):
        # The watchdog restarts every instance; they open one after the other, and the second
        # compares with the load before the restart, not with its sibling's record.
        first = _load(_instance(settings, marker, "wdl_0"))
        second = _load(_instance(settings, marker, "wdl_1"))
    assert first.restart and list(first.changed) == list(second.changed) == [str(vectors)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    for instance, said in zip(("wdl_0", "wdl_1"), errors, strict=True):
        assert said.startswith(f"model 'wdl' version 1, instance {instance}: restarted after a ")
        assert f"(sparse_files[1]): {vectors}: modified " in said and "hps reload wdl" in said
    assert [value for _, _, value in gauges[-2:]] == [1, 1]
    # A later restart with the same files serves what the last load served: nothing to say.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hps_core"):
        again = _load(_instance(settings, restart_marker(2)))
    assert again.changed == {} and not caplog.records and gauges[-1][2] == 0


def test_files_changed_while_the_tables_were_read_fail_the_load_and_every_later_opening(
    settings, records
) -> None:
    files = ServedFiles.settle(_instance(settings, None))
    files.before_opening()
    vectors = _rewrite_in_place(settings)  # while the tables open
    with pytest.raises(ModelFileError) as refused:
        files.opened("cpu")
    message = str(refused.value)
    assert message.startswith("model 'wdl': files changed while the instance read them")
    assert str(vectors) in message and message.endswith("once the files are written")
    with pytest.raises(ModelFileError):  # a model without a warm-up: every later request
        files.before_opening()
    assert records.read("wdl", 1) is None  # not a load that served


def test_a_dense_file_changed_after_initialize_read_it_fails_the_opening(settings, records):
    files = ServedFiles.settle(_instance(settings, None))  # initialize reads the dense file
    dense = load_ps_config(settings.ps_json).model("wdl").dense_file
    data = dense.read_bytes()
    dense.write_bytes(data)  # rewritten, the same bytes: a new modification time
    files.before_opening()  # the tables would be read from now on
    with pytest.raises(ModelFileError, match=rf"dense_file: {dense}: modified "):
        files.opened("cpu")


def test_without_records_or_a_readable_ps_json_nothing_is_compared(
    settings, monkeypatch, tmp_path
) -> None:
    monkeypatch.delenv(LOAD_RECORDS_ENV, raising=False)
    files = _load(_instance(settings, restart_marker(1)))
    assert files.records is None and files.changed == {}
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    files = ServedFiles.settle(dataclasses.replace(settings, ps_json=broken))
    assert files.files == {} and files.stamps == {}  # the model's own checks say why


def test_the_lookup_service_settles_before_opening_and_records_once_opened(
    settings, records, monkeypatch
) -> None:
    for name in ("triton_backend.metrics", "triton_backend.lookup_service"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    service_type = importlib.import_module("triton_backend.lookup_service").LookupService
    service = service_type(settings, ServedFiles.settle(settings))
    try:
        assert records.read("wdl", 1) is None
        service.start()
        assert records.read("wdl", 1) is not None
    finally:
        service.close()
