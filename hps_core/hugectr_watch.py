"""A HugeCTR repository served through its translation, kept in step with it while serving.

HugeCTR users update a served model in place: they edit its ps.json or config.pbtxt, or add a
version folder, then ask Triton to load the model again (``load_model``, HugeCTR's "model
repository extension"), and Triton reloads a model whose folder changed. Here Triton reads the
translation (:func:`hps_core.hugectr_repo.translate_repository`), so :class:`TranslationWatch`
scans the user's repository twice a second and translates again, in place, each model whose
folder or ps.json changed, once its files have rested :data:`SETTLE_S` (a file being written is
not read half way). Its translated folder changes with it (the ``hugectr_source`` stamp at
least), and the next load reloads it. Models added to the repository are translated, models
removed are removed. A model whose new files cannot be served keeps its previous translation;
the reason is reported, and a load keeps serving the previous files.

Each scan writes the time it started to ``scanned`` beside the translation: ``hps reload``
waits for a scan that started after it did, so an edit followed by ``hps reload`` is never
missed. A client's ``load_model`` sent within half a second of an edit may come first.

Example:
    >>> watch = TranslationWatch(Path("repo"), {"hps": Path("ps.json")}, Path("/tmp/t"))
    ... # doctest: +SKIP
    >>> notes = watch.translate_all()  # doctest: +SKIP
    >>> watch.start(print)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hps_core.errors import ConfigError, HPSError
from hps_core.hugectr_repo import BACKENDS, hugectr_models, translate_model, translate_repository
from hps_core.load_record import SETTLE_S as LOAD_SETTLE_S
from hps_core.triton_repo import read_config

SCAN_INTERVAL_S = 0.5
SETTLE_S = LOAD_SETTLE_S
"""A model's files changed more recently than this are left for a later scan (half written):
the rule a model's load follows for the files it reads (:mod:`hps_core.load_record`)."""
STAMP = "hugectr_source"
"""File in each translated model folder naming the state of the files it was translated from."""
SCANNED = "scanned"
"""File beside the translated repository: the start time of the last finished scan."""


def fingerprint(folder: Path, ps_files: Mapping[str, Path]) -> str:
    """What a model's translation depends on: every file under its folder (name, size,
    modification time) and the ps.json files.

    Args:
        folder: the model's folder in the user's repository.
        ps_files: the ps.json of each HugeCTR backend.

    Returns:
        A digest that changes when any of them changes.
    """
    digest = hashlib.sha256()
    paths = [(str(p.relative_to(folder)), p) for p in folder.rglob("*")]
    paths += [(f"ps:{backend}", Path(path)) for backend, path in ps_files.items()]
    for name, path in sorted(paths):
        try:
            status = path.stat()
        except OSError:  # removed meanwhile, or a dangling link: the next scan sees it
            digest.update(f"{name}|gone\n".encode())
            continue
        digest.update(f"{name}|{status.st_size}|{status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def wait_for_scan(translation: Path, since: float, timeout_s: float = 5.0) -> bool:
    """Wait until a scan of the translation in ``translation`` that started after ``since``
    has finished.

    Args:
        translation: the folder holding the translated repository and its ``scanned`` file.
        since: a ``time.time()``.
        timeout_s: how long to wait.

    Returns:
        Whether such a scan finished in time.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if float((translation / SCANNED).read_text()) > since:
                return True
        except (OSError, ValueError):  # not written yet, or being replaced
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(SCAN_INTERVAL_S / 5)


class TranslationWatch:
    """The translation of a HugeCTR repository, kept in step with it (see the module
    docstring).

    Args:
        repo: the user's repository (read only).
        ps_files: the ps.json of each HugeCTR backend (``--backend-config``).
        folder: where the translation lives: ``folder/repo`` is the repository Triton
            serves, ``folder/scanned`` the last scan's start.
        gpu: a GPU is usable here.
    """

    def __init__(
        self, repo: Path, ps_files: Mapping[str, Path], folder: Path, gpu: bool = False
    ) -> None:
        self.repo = repo
        self.ps_files = dict(ps_files)
        self.folder = folder
        self.out = folder / "repo"
        self.gpu = gpu
        self._seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def translate_all(self) -> list[str]:
        """Translate the whole repository (what serving starts from).

        Returns:
            The notes of :func:`~hps_core.hugectr_repo.translate_repository`.

        Raises:
            ConfigError: as :func:`~hps_core.hugectr_repo.translate_repository`.
        """
        started = time.time()
        backends = hugectr_models(self.repo)
        # Taken before translating: a change meanwhile is translated by the first scan.
        seen = {f.name: fingerprint(f, self.ps_files) for f in self._model_folders()}
        notes = translate_repository(self.repo, self.ps_files, self.out, self.gpu)
        for name, digest in seen.items():
            if name in backends:
                (self.out / name / STAMP).write_text(digest + "\n")
        self._seen = seen
        self._write_scanned(started)
        return notes

    def scan(self) -> list[str]:
        """Bring the translation in step with the repository once.

        A model whose files (or the ps.json files) changed within :data:`SETTLE_S` seconds
        is left for a later scan, as it may be half written; the ``scanned`` stamp then
        stays as it was, so ``hps reload`` waits for it.

        Returns:
            A line per model translated again, added, removed or left as it was (with why).
        """
        started = time.time()
        lines: list[str] = []
        folders = {folder.name: folder for folder in self._model_folders()}
        for name in sorted(set(self._seen) - set(folders)):
            _remove(self.out / name)
            del self._seen[name]
            lines.append(f"model '{name}' left {self.repo}: removed from the translation")
        settling = False
        for name, folder in sorted(folders.items()):
            digest = fingerprint(folder, self.ps_files)
            if self._seen.get(name) == digest:
                continue
            if _newest_change(folder, self.ps_files) > started - SETTLE_S:
                settling = True
                continue
            lines += self._bring_in_step(folder, digest)
        if not settling:
            self._write_scanned(started)
        return lines

    def start(self, report: Callable[[str], None]) -> None:
        """Scan every :data:`SCAN_INTERVAL_S` seconds on a thread until :meth:`stop`.

        Args:
            report: called with each line a scan returns.
        """

        def run() -> None:
            while not self._stop.wait(SCAN_INTERVAL_S):
                try:
                    lines = self.scan()
                except (HPSError, OSError) as exc:  # keep watching: the files may settle
                    lines = [f"{self.repo}: scan failed: {exc}"]
                for line in lines:
                    report(line)

        self._thread = threading.Thread(target=run, name="hps-hugectr-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop scanning (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- internals ---------------------------------------------------------------------------

    def _model_folders(self) -> list[Path]:
        return sorted(p for p in self.repo.iterdir() if p.is_dir())

    def _bring_in_step(self, folder: Path, digest: str) -> list[str]:
        """Translate (or link) one changed model again; ``digest``: its files' fingerprint,
        taken before (a change meanwhile comes next)."""
        name = folder.name
        seen = self._seen.get(name)
        config = folder / "config.pbtxt"
        try:
            backend = read_config(config).backend if config.is_file() else None
        except ConfigError as exc:
            return self._not_served(name, digest, exc)
        if backend not in BACKENDS:  # another backend's model: served as it is
            if not (self.out / name).is_symlink():
                _remove(self.out / name)
                os.symlink(folder.resolve(), self.out / name, target_is_directory=True)
            self._seen[name] = digest
            return []
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.folder))
        try:
            try:
                notes = translate_model(folder, backend, self.ps_files, staging, self.gpu)
            except ConfigError as exc:
                return self._not_served(name, digest, exc)
            (staging / name / STAMP).write_text(digest + "\n")
            self._seen[name] = digest
            if (self.out / name).is_symlink():
                (self.out / name).unlink()
            _sync_tree(staging / name, self.out / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        what = "changed" if seen else "appeared"
        return [
            f"model '{name}' {what} in {self.repo}: translated again (a load of it, "
            "load_model or hps reload, serves the new files)",
            *notes,
        ]

    def _not_served(self, name: str, digest: str, exc: ConfigError) -> list[str]:
        """The line of a model whose changed files cannot be served (said once per state of
        its files: the digest is taken as seen)."""
        kept = "keeps its previous translation" if name in self._seen else "is not served"
        self._seen[name] = digest
        return [f"model '{name}' changed in {self.repo} but {kept}: {exc}"]

    def _write_scanned(self, started: float) -> None:
        tmp = self.folder / f".{SCANNED}.tmp"
        tmp.write_text(repr(started))
        os.replace(tmp, self.folder / SCANNED)


def _remove(target: Path) -> None:
    """Remove a translated model: its folder, or the link to another backend's."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)


def _newest_change(folder: Path, ps_files: Mapping[str, Path]) -> float:
    """The latest modification time among a model's files and the ps.json files."""
    newest = 0.0
    for path in [*folder.rglob("*"), folder, *map(Path, ps_files.values())]:
        with contextlib.suppress(OSError):
            newest = max(newest, path.stat().st_mtime)
    return newest


def _sync_tree(source: Path, target: Path) -> None:
    """Make ``target`` hold what ``source`` holds, writing only the files that differ (each
    replaced whole, so a reader never sees half a file) and removing the others."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*")):
        dest = target / path.relative_to(source)
        if path.is_dir():
            if dest.is_file() or dest.is_symlink():
                dest.unlink()
            dest.mkdir(exist_ok=True)
            continue
        if dest.is_file() and filecmp.cmp(path, dest, shallow=False):
            continue
        if dest.is_dir():
            shutil.rmtree(dest)
        tmp = dest.with_name(f".{dest.name}.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)
    for path in sorted(target.rglob("*"), reverse=True):  # deepest first
        if (source / path.relative_to(target)).exists():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
