"""What a model's load read, and how a later load tells what changed: the files of a model,
their stamps, the wait for files being written, the differences said by file, the records of
a server and the markers that say why a model loads again (served on tritonserver:
tests/integration/test_files_changed_in_place.py)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS
from hps_core.errors import ModelFileError
from hps_core.load_record import (
    LOAD_RECORDS_ENV,
    FileStamp,
    LoadRecord,
    LoadRecords,
    changes,
    describe_changes,
    is_restart,
    load_marker,
    model_files,
    read_stamps,
    restart_marker,
    settled_stamps,
)
from hps_core.triton_repo import ServingOptions


@pytest.fixture
def wdl(tmp_path: Path) -> tuple[Path, dict]:
    """The demo W&D model's ps.json (sparse, dense and network files) and its files."""
    ps_json = DEMO_MODELS["wdl"](tmp_path, ServingOptions()) / "ps.json"
    return ps_json, model_files(ps_json, load_ps_config(ps_json).model("wdl"))


def test_a_model_reads_its_ps_json_each_tables_two_files_and_its_dense_and_network(wdl) -> None:
    ps_json, files = wdl
    model = load_ps_config(ps_json).model("wdl")
    whats = [what for what, _ in files.values()]
    assert whats[0] == "ps.json" and whats[-2:] == ["dense_file", "network_file"]
    assert len(files) == 3 + 2 * len(model.tables)
    table = model.tables[1]
    assert (
        files[str(table.sparse_file / "emb_vector")][0] == f"table '{table.name}' (sparse_files[1])"
    )
    assert all(path.is_file() for _, path in files.values())


def test_stamps_are_what_names_a_host_tier_copy_and_a_missing_file_is_left_out(wdl) -> None:
    ps_json, files = wdl
    stamps = read_stamps(files)
    st = ps_json.stat()
    assert stamps[str(ps_json)].identity == (st.st_size, st.st_mtime_ns, st.st_ino)
    vectors = next(path for what, path in files.values() if what.startswith("table"))
    vectors.unlink()
    assert str(vectors) not in read_stamps(files) and len(read_stamps(files)) == len(files) - 1


def test_files_unchanged_for_a_second_are_taken_at_once(wdl) -> None:
    _, files = wdl
    slept: list[float] = []
    later = time.time() + 10  # the fixture wrote them just now
    assert settled_stamps(files, settle_s=1.0, clock=lambda: later, sleep=slept.append)
    assert slept == []
    # A copy that keeps the source's modification time still changes the inode's: waited for.
    old = 1_000_000_000.0
    for _, path in files.values():
        os.utime(path, (old, old))
    with pytest.raises(ModelFileError):
        settled_stamps(files, settle_s=1.0, timeout_s=0, clock=time.time, sleep=slept.append)


def test_a_file_being_written_is_waited_for_and_one_that_keeps_changing_is_named(wdl) -> None:
    _, files = wdl
    what, path = next(iter(files.values()))
    path.touch()  # changed just now: waited for until it stays unchanged for the settle time
    started = time.monotonic()
    assert settled_stamps(files, settle_s=0.5) == read_stamps(files)
    assert 0.3 < time.monotonic() - started < 2.0

    def writing(seconds: float) -> None:  # a copy under way: the file grows between looks
        time.sleep(seconds)
        with path.open("ab") as f:
            f.write(b" ")

    writing(0)
    with pytest.raises(ModelFileError) as refused:
        settled_stamps(files, settle_s=0.5, timeout_s=1.0, sleep=writing)
    message = str(refused.value)
    assert message.startswith(f"{path} ({what}): still changing 1 s after the model began")
    assert "unchanged for 0.5 s" in message and "Load it again once it is written" in message


def test_changes_say_per_file_what_changed(tmp_path: Path) -> None:
    before = {
        "/m/t0/emb_vector": FileStamp("table 't0' (sparse_files[0])", 640, 10**18, 7),
        "/m/t1/emb_vector": FileStamp("table 't1' (sparse_files[1])", 64, 10**18, 8),
        "/m/ps.json": FileStamp("ps.json", 100, 10**18, 9),
    }
    now = {
        "/m/t0/emb_vector": FileStamp("table 't0' (sparse_files[0])", 640, 10**18 + 5000, 7, 1),
        "/m/t1/emb_vector": FileStamp("table 't1' (sparse_files[1])", 64, 10**18, 8, 2),
        "/m/ps.json": FileStamp("ps.json", 120, 10**18 + 5000, 11),
    }
    found = changes(before, now)
    assert set(found) == {"/m/t0/emb_vector", "/m/ps.json"}  # times of inode changes aside
    assert re.fullmatch(
        r"modified 2001-09-09 \S+40.000000 -> 2001-09-09 \S+40.000005", found["/m/t0/emb_vector"]
    )
    assert found["/m/ps.json"].startswith("size 100 -> 120 bytes, modified ")
    assert found["/m/ps.json"].endswith(", inode 9 -> 11 (replaced)")
    said = describe_changes(found, now)
    assert said.startswith("ps.json: /m/ps.json: size 100 -> 120 bytes, modified ")
    assert "; table 't0' (sparse_files[0]): /m/t0/emb_vector: modified " in said
    assert changes(None, now) == {}  # no earlier load: nothing to compare with
    assert changes({}, {"/x": now["/m/ps.json"]}) == {"/x": "not read by the last load"}
    assert changes({"/x": now["/m/ps.json"]}, {}) == {"/x": "unreadable now"}


def test_records_round_trip_per_model_version(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(LOAD_RECORDS_ENV, raising=False)
    assert LoadRecords.from_environment() is None
    monkeypatch.setenv(LOAD_RECORDS_ENV, str(tmp_path))
    records = LoadRecords.from_environment()
    assert records is not None and records.folder == tmp_path
    assert records.read("m/x", 1) is None
    stamp = FileStamp("ps.json", 1, 2, 3, 4)
    records.write("m/x", 1, LoadRecord("load-ab", {"/p": stamp}, None))
    assert records.path("m/x", 1).name == "m%2Fx.1.json"
    assert records.read("m/x", 1) == LoadRecord("load-ab", {"/p": stamp}, None)
    assert records.read("m/x", 2) is None
    records.path("m/x", 2).write_text("{")
    assert records.read("m/x", 2) is None  # unreadable: as if none
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m%2Fx.1.json", "m%2Fx.2.json"]


def test_the_instances_of_one_load_compare_with_the_load_before_it() -> None:
    first = {"/p": FileStamp("ps.json", 1, 1, 1)}
    second = {"/p": FileStamp("ps.json", 1, 2, 1)}
    # The first instance of a restart recorded it; its sibling compares with what was served.
    record = LoadRecord(restart_marker(1), second, first)
    assert record.baseline(restart_marker(1)) == first
    assert record.baseline(restart_marker(2)) == second and record.baseline("") == second


def test_markers_tell_a_restart_from_a_load_asked_for() -> None:
    assert is_restart(restart_marker(3)) and restart_marker(3) != restart_marker(4)
    assert not is_restart(load_marker()) and load_marker() != load_marker()
    assert not is_restart(None) and not is_restart("")
    assert np.unique([load_marker() for _ in range(50)]).size == 50
