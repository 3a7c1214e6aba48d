"""Named shared-memory segments that every process of a machine maps once.

Triton runs each model instance in its own stub process. The host tier must exist once per
machine, not once per stub, so a table lives in a file under ``/dev/shm`` (tmpfs: its pages
are RAM, shared by every process that maps the file) and is reference counted with ``flock``:

- ``<name>.build``: held exclusively while a process creates the segment or decides to remove
  it; this serialises builders, attachers and removers.
- ``<name>.users``: every process that maps the segment holds a shared lock on it. The kernel
  drops the lock when a process exits for any reason, ``kill -9`` included, so the count can
  never leak.
- ``<name>.data``: the segment itself, created under a temporary name and renamed into place
  when complete, so a reader never sees a half-built table. Its pages are allocated before
  it is filled: a tmpfs kills a process that touches a page past its size (SIGBUS), so a
  ``/dev/shm`` too small (Docker's default is 64 MiB) is a :class:`SharedMemoryFullError`
  naming the bytes needed and free instead.

The last user to detach removes all three files, also at a normal exit of a process that
never called ``close()`` (an ``atexit`` hook detaches what the process opened; a forked child
leaves its parent's segments alone). If every user died without detaching (the server was
killed), the files stay until the next :func:`remove_stale_segments`, which runs whenever a
segment is opened and when ``hps serve`` stops: a segment whose ``users`` lock can be taken
exclusively has no user left and is removed.

**Kept across a restart.** A server that stops keeps the segments built from files (the host
tiers), so that a restart whose files did not change re-attaches them instead of reading the
files again. While its launcher stops it, the launcher holds a marker file named by
:data:`KEEP_ENV` in the stubs' environment; the last user of a segment opened with ``sources``
then leaves it in place with ``<name>.source``, the identity (path, size, modification time,
inode) of each source file. :func:`remove_stale_segments` removes such a segment when a
source no longer has that identity (the files changed or vanished), when a list of the
segments to keep is given without it (``hps serve`` gives its repository's), or always when
asked to rebuild; it keeps it otherwise. Segments of a version unloaded while the server runs
are released as before: only a stop keeps them.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import math
import mmap
import os
import re
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from hps_core.errors import SharedMemoryFullError

logger = logging.getLogger("hps_core")

PREFIX = "hps-triton."
KEEP_ENV = "HPS_KEEP_SEGMENTS_WHILE"
"""Environment variable naming a file: while it exists, the last user of a segment built from
files keeps the segment (its launcher is stopping the server; see the module docstring)."""
DEV_SHM = Path("/dev/shm")
"""The folder Docker's ``--shm-size`` sizes, and where Triton's Python backend keeps its
regions whatever ``HPS_SHM_DIR`` says."""
_TMP_RE = re.compile(r"\.tmp-(\d+)$")


def shm_dir() -> Path:
    """Directory holding the segments: ``$HPS_SHM_DIR`` or ``/dev/shm``.

    Returns:
        The directory (created if ``HPS_SHM_DIR`` names one that does not exist).
    """
    path = Path(os.environ.get("HPS_SHM_DIR", "/dev/shm"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def folder_space(directory: Path) -> tuple[int, int]:
    """Free and total bytes of the filesystem holding ``directory``.

    Args:
        directory: a folder, e.g. :func:`shm_dir`.

    Returns:
        ``(free, total)``: bytes an unprivileged process may still allocate there, and the
        filesystem's size (0 for a tmpfs mounted without a size limit).
    """
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def _amount(nbytes: int) -> str:
    return f"{nbytes:,} bytes ({nbytes / 2**20:.1f} MiB)"


def enlarge_hint(directory: Path, needed: int, free: int, total: int) -> str:
    """How to give ``directory`` room for ``needed`` bytes when ``free`` of its ``total`` are.

    Args:
        directory: the shared-memory folder.
        needed: bytes needed.
        free: bytes free (:func:`folder_space`).
        total: the filesystem's size.

    Returns:
        Docker's ``--shm-size`` (and a remount) for ``/dev/shm``, a remount elsewhere, sized
        to hold what is there and what is needed, in whole GiB.

    Example:
        >>> enlarge_hint(Path("/dev/shm"), 18 * 2**20, 12 * 2**20, 12 * 2**20)[-66:]
        'docker run --shm-size=1g ..., or mount -o remount,size=1G /dev/shm'
    """
    gib = max(1, math.ceil((total + needed - free) / 2**30))
    mount = _mount_point(directory)
    if mount == DEV_SHM:
        return (
            f"give the server more shared memory: docker run --shm-size={gib}g ..., or mount "
            f"-o remount,size={gib}G {DEV_SHM}"
        )
    return (
        f"free space in {mount} (a tmpfs grows with mount -o remount,size={gib}G {mount}), or "
        f"set HPS_SHM_DIR to a larger one"
    )


def shortage_message(directory: Path, what: str, needed: int, free: int, total: int) -> str:
    """Say that ``directory`` lacks the space ``what`` needs, and how to give it more.

    Args:
        directory: the shared-memory folder.
        what: what needs the space, e.g. ``"the host tier of /models/t0"``.
        needed: bytes needed.
        free: bytes free (:func:`folder_space`).
        total: the filesystem's size.

    Returns:
        The message: the folder, the bytes needed and free, and :func:`enlarge_hint`.

    Example:
        ``shortage_message(Path("/dev/shm"), "3 tables", 18 * 2**20, 12 * 2**20, 12 * 2**20)``::

            /dev/shm is too small for 3 tables: 18,874,368 bytes (18.0 MiB) needed, 12,582,912
            bytes (12.0 MiB) free of 12.0 MiB; give the server more shared memory: docker run
            --shm-size=1g ..., or mount -o remount,size=1G /dev/shm
    """
    return (
        f"{directory} is too small for {what}: {_amount(needed)} needed, {_amount(free)} free "
        f"of {total / 2**20:.1f} MiB; {enlarge_hint(directory, needed, free, total)}"
    )


def _reserve(fd: int, size: int, directory: Path, what: str, offset: int = 0) -> None:
    """Allocate ``size`` bytes from byte ``offset`` of the open file ``fd`` in ``directory``
    now.

    Writing to a tmpfs past its size does not fail: the process that touches the page dies of
    SIGBUS (a Triton stub: "Stub process ... is not healthy", no reason given). Allocating up
    front turns that into an error that says what is short.

    Args:
        fd: the file, open for writing; it is extended to ``offset + size`` bytes.
        size: bytes to allocate (positive).
        directory: the file's folder (named in the error).
        what: what the file holds (named in the error).
        offset: where they start.

    Raises:
        SharedMemoryFullError: the filesystem has less than ``size`` bytes free.
    """
    free, total = folder_space(directory)
    try:
        os.posix_fallocate(fd, offset, size)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise SharedMemoryFullError(shortage_message(directory, what, size, free, total)) from None


def file_identity(path: Any) -> str:
    """``path:size:mtime_ns:inode`` of a file (local, or an
    :class:`~hps_core.formats.uris.FsPath`): equal strings mean the same file contents."""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _keeping() -> bool:
    marker = os.environ.get(KEEP_ENV)
    return bool(marker) and os.path.exists(marker)


def _sources_unchanged(sidecar: Path) -> bool:
    """Whether every source file a kept segment records still has its identity."""
    try:
        sources = json.loads(sidecar.read_text())
        return bool(sources) and all(
            file_identity(Path(path)) == identity for path, identity in sources
        )
    except (OSError, ValueError, TypeError):
        return False


def _same_file(fd: int, path: Path) -> bool:
    # A lock taken on a file that was unlinked meanwhile protects nothing: compare inodes.
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev)


@contextlib.contextmanager
def file_lock(path: Path, blocking: bool = True) -> Iterator[int | None]:
    """Hold an exclusive flock on ``path`` (created if needed); yields None if busy."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield None
                return
            raise
        if _same_file(fd, path):
            break
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


class SharedSegment:
    """One reference-counted shared-memory file, mapped into this process.

    Use :meth:`open` to attach to the segment, building it first if no process has.

    Args:
        name: segment name (a digest of what it holds); files are ``PREFIX + name + suffix``.
        directory: where the files live; defaults to :func:`shm_dir`.
    """

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.name = name
        self.directory = directory or shm_dir()
        base = self.directory / f"{PREFIX}{name}"
        self.data_path = base.with_name(base.name + ".data")
        self.build_path = base.with_name(base.name + ".build")
        self.users_path = base.with_name(base.name + ".users")
        self.source_path = base.with_name(base.name + ".source")
        self._sources: list[tuple[str, str]] = []  # (path, identity) of the files it holds
        self._users_fd: int | None = None
        self.buffer: mmap.mmap | None = None
        self.built_here = False
        self._owner_pid = os.getpid()

    @classmethod
    def open(
        cls,
        name: str,
        size: int,
        build: Callable[..., None],
        directory: Path | None = None,
        writable: bool = False,
        what: str = "",
        reserve_first: int | None = None,
        sources: Sequence[Any] = (),
    ) -> SharedSegment:
        """Attach to segment ``name``, building it with ``build`` if it does not exist yet.

        Args:
            name: segment name; equal names must mean equal contents.
            size: size in bytes of the segment.
            build: fills a writable mapping of ``size`` bytes; called in one process only.
            directory: where the files live; defaults to :func:`shm_dir`.
            writable: map the segment read-write (for online updates) instead of read-only.
            what: what the segment holds, for messages (e.g. ``"the host tier of /m/t0"``);
                by default the segment's name.
            reserve_first: allocate only the first this many bytes before ``build`` runs, and
                call it as ``build(mapping, reserve)``: it calls ``reserve(offset, length)``
                for the rest before it touches them (a build that reads a table straight into
                place allocates each chunk just ahead of its read, instead of zeroing every
                page first); ``None``: every byte is allocated first, ``build(mapping)``.
            sources: the local files the segment is built from: a server that stops keeps it
                for a restart while they do not change (see the module docstring). Files
                named by URI are not kept (checking them would reach their store).

        Returns:
            The attached segment; ``buffer`` is the mapping.

        Raises:
            SharedMemoryFullError: the segment must be built and its folder lacks the space.
        """
        seg = cls(name, directory)
        if sources and all(isinstance(path, Path) for path in sources):
            seg._sources = [(str(path.resolve()), file_identity(path)) for path in sources]
        remove_stale_segments(seg.directory)
        with file_lock(seg.build_path) as _:
            users_fd = os.open(seg.users_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(users_fd, fcntl.LOCK_SH)
            seg._users_fd = users_fd
            try:
                if not (seg.data_path.exists() and seg.data_path.stat().st_size == size):
                    seg._build(size, build, what or f"shared-memory segment {name}", reserve_first)
                    seg.built_here = True
                seg._map(size, writable)
            except BaseException:
                # Leave nothing behind unless another process still uses the segment.
                seg._release_users(remove_if_last=True)
                raise
        _attached.add(seg)
        return seg

    def _build(
        self, size: int, build: Callable[..., None], what: str, reserve_first: int | None
    ) -> None:
        tmp = self.data_path.with_name(f"{self.data_path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if size:
                first = size if reserve_first is None else min(reserve_first, size)
                free, total = folder_space(self.directory)
                if free < size:  # said for the whole segment, not the first chunk short
                    raise SharedMemoryFullError(
                        shortage_message(self.directory, what, size, free, total)
                    )
                os.ftruncate(fd, size)
                if first:
                    _reserve(fd, first, self.directory, what)
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                try:
                    if reserve_first is None:
                        build(mm)
                    else:
                        build(mm, lambda offset, length: _reserve(
                            fd, length, self.directory, what, offset))  # fmt: skip
                finally:
                    # A failing build may still hold array views of the mapping (in its
                    # traceback); closing must not replace its error with a BufferError.
                    with contextlib.suppress(BufferError):
                        mm.close()
            os.rename(tmp, self.data_path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        finally:
            os.close(fd)

    def _map(self, size: int, writable: bool) -> None:
        if size == 0:
            self.buffer = None
            return
        flags = os.O_RDWR if writable else os.O_RDONLY
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # Populate the page table now, so the first requests do not pay a page fault per 4 KiB.
        map_flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        fd = os.open(self.data_path, flags)
        try:
            self.buffer = mmap.mmap(fd, size, map_flags, prot)
        finally:
            os.close(fd)

    def _release_users(self, remove_if_last: bool = False) -> bool:
        """Drop this process's use; with ``remove_if_last``, remove the files if it was the last.

        The caller holds the build lock, so no process can attach meanwhile.
        """
        if self._users_fd is None:
            return False
        removed = False
        if remove_if_last:
            try:
                # Upgrading our shared lock succeeds only if nobody else holds one.
                fcntl.flock(self._users_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            else:
                if self._sources and _keeping():
                    self.source_path.write_text(json.dumps(self._sources))
                    logger.info("kept shared-memory segment %s for a restart", self.name)
                else:
                    _unlink_segment_files(self)
                    removed = True
        os.close(self._users_fd)
        self._users_fd = None
        return removed

    @property
    def attached(self) -> bool:
        """Whether this process still holds the segment."""
        return self._users_fd is not None

    def close(self) -> bool:
        """Detach; remove the files if no other process uses the segment.

        Array views of ``buffer`` must be dropped first, or the mapping stays until they are.

        Returns:
            True if this call removed the segment.
        """
        if self._users_fd is None:
            return False
        if self.buffer is not None:
            with contextlib.suppress(BufferError):  # views still alive: unmapped when freed
                self.buffer.close()
            self.buffer = None
        with file_lock(self.build_path) as _:
            return self._release_users(remove_if_last=True)

    def __enter__(self) -> SharedSegment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_attached: weakref.WeakSet[SharedSegment] = weakref.WeakSet()


def _detach_at_exit() -> None:
    """Detach from every segment this process opened and still holds (at interpreter exit).

    A forked child inherits the parent's descriptors, and with them its lock: it must not
    detach (it would see itself as the last user and remove files the parent still maps).
    """
    for seg in list(_attached):
        if seg.attached and seg._owner_pid == os.getpid():
            with contextlib.suppress(Exception):  # exiting anyway; the next start cleans up
                seg.close()


atexit.register(_detach_at_exit)


def _unlink_segment_files(seg: SharedSegment) -> None:
    for path in (seg.data_path, seg.source_path, seg.users_path, seg.build_path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one that belongs to another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_segments(
    directory: Path | None = None, keep: Collection[str] | None = None
) -> list[str]:
    """Remove segments that no live process uses (their users all died, or they were kept by
    a server that stopped and are not to be kept any more).

    Also removes half-built temporary files whose builder process is gone.

    Args:
        directory: where the segments live; defaults to :func:`shm_dir`.
        keep: names of kept segments to keep still (while their sources are unchanged);
            ``None`` keeps every kept segment whose sources are unchanged, an empty
            collection none.

    Returns:
        Names of the segments (and temporary files) removed.
    """
    directory = directory or shm_dir()
    removed: list[str] = []
    for path in sorted(directory.glob(f"{PREFIX}*")):
        tmp = _TMP_RE.search(path.name)
        if tmp is not None:
            if not pid_alive(int(tmp.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                removed.append(path.name)
            continue
        if not path.name.endswith(".build"):
            continue
        seg = SharedSegment(path.name[len(PREFIX) : -len(".build")], directory)
        with file_lock(seg.build_path, blocking=False) as fd:
            if fd is None:  # someone is building, attaching or detaching right now
                continue
            users_fd = os.open(seg.users_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(users_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                continue
            finally:
                os.close(users_fd)
            wanted = keep is None or seg.name in keep
            if wanted and seg.source_path.exists() and _sources_unchanged(seg.source_path):
                continue  # kept by a server that stopped, for its restart
            _unlink_segment_files(seg)
            removed.append(seg.name)
    for path in directory.glob(f"{PREFIX}*.data"):
        # A data file whose lock files are gone was left by a removal that was interrupted.
        if not path.with_name(path.name[: -len(".data")] + ".build").exists():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path.name)
    if removed:
        logger.info("removed stale shared-memory segments: %s", ", ".join(removed))
    return removed
