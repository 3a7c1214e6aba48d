"""What the last load of a served model read, so that a restart can tell what it serves.

A model loads again when Triton is handed its config with :data:`RELOAD_PARAMETER` set (the
stub watchdog's restart after a stub died, ``hps reload``), and the value says which of the
two it is. Each Triton instance of an HPS model reads its files when it loads: the ps.json, every
sparse folder's ``key`` and ``emb_vector``, and a ranking model's dense and network files.
The launcher gives each server a folder of *load records* (:data:`LOAD_RECORDS_ENV`); an
instance that has opened its tables writes there the stamp (size, modification time, inode,
as the host tier names its segments) of every file it read (:class:`LoadRecord`). A load of
the same model version that comes later compares the files as they are now with what the load
before it read (its instances open one after the other: the second compares with the record's
``before``, not with the first one's files):

- a load someone asked for (``hps reload``, a switch to a new version) reads the files that
  changed again, which is its purpose, and says which;
- a restart after a stub died (the stub watchdog's reload) should serve what the last load
  served. Its host-tier copy is built from the files as they are now, so when they changed in
  place since, without a reload, the restart serves other rows than the model served before:
  it says so loudly, naming each table and file (:func:`describe_changes`).

Files being written are not read: a load waits until every file of the model has been
unchanged for :data:`SETTLE_S` (:func:`settled_stamps`), the rule the HugeCTR translation watch
follows (``hps_core.hugectr_watch``), and gives up naming the file after :data:`SETTLE_TIMEOUT_S`.

Example:
    >>> files = model_files(Path("repo/emb/ps.json"), config.model("emb"))  # doctest: +SKIP
    >>> stamps = settled_stamps(files)  # doctest: +SKIP
    >>> changes(records.read("emb", 1).baseline(restart_marker(1)), stamps)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from hps_core.config import ModelConfig
from hps_core.errors import HPSError, ModelFileError
from hps_core.formats.sparse import KEY_FILE, VECTOR_FILE
from hps_core.formats.uris import ModelPath, model_path

RELOAD_PARAMETER = "hps_reload"
"""The config.pbtxt parameter of a load Triton must make although the model folder did not
change (``hps_core.server.control.reload_model``). Its value says why the model loads again:
:func:`restart_marker` (the stub watchdog bringing a model back after a stub died: it should
serve what its last load served) or :func:`load_marker` (a load someone asked for, ``hps
reload``: the files are read again where they changed)."""
_RESTART = "restart-"
_LOAD = "load-"
LOAD_RECORDS_ENV = "HPS_LOAD_RECORDS"
"""Environment variable naming the folder of a server's load records (set by the launcher)."""
SETTLE_S = 1.0
"""A file changed within this many seconds may still be being written: the load waits."""
SETTLE_TIMEOUT_S = 60.0
"""How long a load waits for its files to settle before it fails, naming the file."""
_POLL_S = 0.2


def restart_marker(count: int) -> str:
    """The :data:`RELOAD_PARAMETER` value of the stub watchdog's ``count``-th restart."""
    return f"{_RESTART}{count}"


def load_marker() -> str:
    """A :data:`RELOAD_PARAMETER` value for a load someone asked for (unique per call)."""
    return f"{_LOAD}{secrets.token_hex(4)}"


def is_restart(marker: str | None) -> bool:
    """Whether a :data:`RELOAD_PARAMETER` value is :func:`restart_marker`'s.

    Example:
        >>> is_restart(restart_marker(2)), is_restart(load_marker()), is_restart(None)
        (True, False, False)
    """
    return bool(marker) and str(marker).startswith(_RESTART)


@dataclass(frozen=True)
class FileStamp:
    """What identifies the contents of a file a model read, and what the file is to it.

    Args:
        what: the file's part in the model, e.g. ``table 'table0'`` or ``dense_file``.
        size: bytes.
        mtime_ns: modification time, ns since the epoch.
        inode: inode number (0 for a file named by URI).
        changed_ns: the latest of its modification and inode-change times (a copy that keeps
            the source's modification time still changes the inode's), for :func:`settled_stamps`;
            not part of the identity.
    """

    what: str
    size: int
    mtime_ns: int
    inode: int
    changed_ns: int = 0

    @property
    def identity(self) -> tuple[int, int, int]:
        """``(size, mtime_ns, inode)``: equal identities mean the same contents, as for the
        host tier's segment names (``hps_core.tiers.host_table.segment_name``)."""
        return (self.size, self.mtime_ns, self.inode)


def model_files(ps_json: Path, model: ModelConfig) -> dict[str, tuple[str, ModelPath]]:
    """Every file a model's instance reads when it loads.

    Args:
        ps_json: the ps.json the instance serves.
        model: its model in that ps.json.

    Returns:
        Path (as text) -> ``(what it is, path)``: the ps.json, each table's key and vector
        files, and the dense and network files a ranking model names.
    """
    files: dict[str, tuple[str, ModelPath]] = {str(ps_json): ("ps.json", ps_json)}
    for index, table in enumerate(model.tables):
        folder = model_path(table.sparse_file)
        for name in (KEY_FILE, VECTOR_FILE):
            path = folder / name
            files[str(path)] = (f"table '{table.name}' (sparse_files[{index}])", path)
    for field in ("dense_file", "network_file"):
        value = getattr(model, field)
        if value is not None:
            path = model_path(value)
            files[str(path)] = (field, path)
    return files


def read_stamps(files: Mapping[str, tuple[str, ModelPath]]) -> dict[str, FileStamp]:
    """Stamp each file as it is now; a file that cannot be read is left out (the model's own
    checks name it when it loads).

    Args:
        files: from :func:`model_files`.

    Returns:
        Path (as text) -> its stamp.
    """
    stamps = {}
    for key, (what, path) in files.items():
        try:
            st = path.stat()
        except (OSError, HPSError):
            continue
        changed = max(st.st_mtime_ns, getattr(st, "st_ctime_ns", 0))
        stamps[key] = FileStamp(what, st.st_size, st.st_mtime_ns, st.st_ino, changed)
    return stamps


def settled_stamps(
    files: Mapping[str, tuple[str, ModelPath]],
    settle_s: float = SETTLE_S,
    timeout_s: float = SETTLE_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, FileStamp]:
    """The files' stamps once none of them has changed for ``settle_s``.

    A file changed less than ``settle_s`` ago (by the clock) may be in the middle of being
    written; the stamps are then taken again until they stay equal for ``settle_s`` (which also
    settles files whose times are ahead of this machine's clock, on a network file system).

    Args:
        files: from :func:`model_files`.
        settle_s: how long the files must have been unchanged.
        timeout_s: give up after this many seconds.
        clock: wall-clock seconds (file times are wall-clock times).
        sleep: waits between two looks.

    Returns:
        The stamps (:func:`read_stamps`).

    Raises:
        ModelFileError: a file kept changing for ``timeout_s``, naming it.
    """
    started = quiet_since = clock()
    stamps = read_stamps(files)
    while True:
        now = clock()
        newest = max((s.changed_ns for s in stamps.values()), default=0) / 1e9
        if now - newest >= settle_s or now - quiet_since >= settle_s:
            return stamps
        if now - started >= timeout_s:
            path, stamp = max(stamps.items(), key=lambda item: item[1].changed_ns)
            raise ModelFileError(
                f"{path} ({stamp.what}): still changing {now - started:.0f} s after the model "
                f"began loading (last change {_clock_time(stamp.changed_ns)}); a load waits "
                f"until the model's files have been unchanged for {settle_s:g} s, so that it "
                "never reads a file that is being written. Load it again once it is written."
            )
        sleep(_POLL_S)
        again = read_stamps(files)
        if again != stamps:
            stamps, quiet_since = again, clock()


def changes(before: Mapping[str, FileStamp] | None, now: Mapping[str, FileStamp]) -> dict[str, str]:
    """How the files differ from a record.

    Args:
        before: the record of the last load; ``None`` when there is none (nothing differs).
        now: the stamps now.

    Returns:
        Path (as text) -> what changed, e.g. ``size 640 -> 704 bytes, modified 05:28:30.103
        -> 05:29:02.715``; files whose identity is unchanged are left out.
    """
    if before is None:
        return {}
    found = {}
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if old is None:
            found[key] = "not read by the last load"
        elif new is None:
            found[key] = "unreadable now"
        elif old.identity != new.identity:
            parts = []
            if old.size != new.size:
                parts.append(f"size {old.size} -> {new.size} bytes")
            if old.mtime_ns != new.mtime_ns:
                parts.append(f"modified {_clock_time(old.mtime_ns)} -> {_clock_time(new.mtime_ns)}")
            if old.inode != new.inode:
                parts.append(f"inode {old.inode} -> {new.inode} (replaced)")
            found[key] = ", ".join(parts)
    return found


def describe_changes(found: Mapping[str, str], stamps: Mapping[str, FileStamp]) -> str:
    """One line per changed file, grouped by what the file is to the model.

    Args:
        found: from :func:`changes`.
        stamps: the stamps now (they say what each file is).

    Returns:
        Text such as ``table 'table0' (sparse_files[0]): /m/table0/emb_vector: modified ...``.
    """
    lines = []
    for key, detail in found.items():
        what = stamps[key].what if key in stamps else "file"
        lines.append(f"{what}: {key}: {detail}")
    return "; ".join(lines)


def _clock_time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S.%f")


@dataclass(frozen=True)
class LoadRecord:
    """What one load of a model version read.

    Args:
        load: the :data:`RELOAD_PARAMETER` value of that load (empty for the server's first
            load of the model): the instances of one load share it.
        files: the stamps of the files it read.
        before: the stamps of the load it replaced (``None`` for a first load).
    """

    load: str
    files: dict[str, FileStamp]
    before: dict[str, FileStamp] | None = None

    def baseline(self, load: str) -> dict[str, FileStamp] | None:
        """What the model served before the load ``load``: this record's files, or, when an
        instance of ``load`` itself wrote the record (its instances open one after the
        other), the files of the load before.

        Example:
            >>> record = LoadRecord("load-1", {"a": FileStamp("x", 2, 2, 2)}, {})
            >>> record.baseline("restart-1") is record.files, record.baseline("load-1")
            (True, {})
        """
        return self.before if load == self.load else self.files


class LoadRecords:
    """The load records of one server: a JSON file per model version in a folder.

    Args:
        folder: the folder (the launcher creates it and removes it at stop).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def from_environment(cls) -> LoadRecords | None:
        """The records of the server this process runs under (:data:`LOAD_RECORDS_ENV`), or
        ``None`` for a server started otherwise (no record is kept, no restart compared)."""
        folder = os.environ.get(LOAD_RECORDS_ENV)
        return cls(Path(folder)) if folder else None

    def path(self, model: str, version: int) -> Path:
        """The record of ``model``'s ``version``."""
        return self.folder / f"{urllib.parse.quote(model, safe='')}.{version}.json"

    def read(self, model: str, version: int) -> LoadRecord | None:
        """The record of the model version's last load; ``None`` if it has none (its first
        load in this server) or the record cannot be read.

        Args:
            model: the Triton model.
            version: its version.
        """
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads(self.path(model, version).read_text())
            before = data["before"]
            return LoadRecord(
                str(data["load"]),
                {key: FileStamp(**value) for key, value in data["files"].items()},
                None if before is None else {k: FileStamp(**v) for k, v in before.items()},
            )
        return None

    def write(self, model: str, version: int, record: LoadRecord) -> None:
        """Record a load whose instance opened its tables (replacing the file at once, so that
        an instance reading it sees a whole record).

        Args:
            model: the Triton model.
            version: its version.
            record: what the load read.
        """
        path = self.path(model, version)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        before = record.before
        data = {
            "load": record.load,
            "files": {key: asdict(stamp) for key, stamp in record.files.items()},
            "before": None if before is None else {k: asdict(v) for k, v in before.items()},
        }
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
