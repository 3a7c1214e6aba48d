"""Files named by URI (``s3://``, ``hdfs://``, HugeCTR's ``https://<bucket>.s3.<region>.
amazonaws.com/...``), opened through :mod:`pyarrow.fs`.

HugeCTR infers the file system from a path's URI; so does this module. S3 takes the standard
AWS settings from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for an S3-compatible server, ...); they never
appear in messages. HDFS needs Hadoop's ``libhdfs`` and a Java runtime, which a failed
connection names.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hps_core.errors import ModelFileError, NotAvailableError

if TYPE_CHECKING:  # pyarrow is imported when a URI is opened, not with the engine
    import pyarrow as pa
    import pyarrow.fs as pafs

# HugeCTR's S3 HTTPS forms: virtual-hosted (bucket first) and path style.
_VIRTUAL_HOSTED = re.compile(r"^https?://([^./]+)\.s3[.-]([a-z0-9-]+)\.amazonaws\.com/(.*)$")
_PATH_STYLE = re.compile(r"^https?://s3[.-]([a-z0-9-]+)\.amazonaws\.com/([^/]+)/(.*)$")
_SCHEMES = ("s3://", "hdfs://", "viewfs://", "gs://", "file://")

HDFS_HINT = (
    "reading hdfs:// needs Hadoop's libhdfs and a Java runtime: install a JRE and Hadoop, set "
    "JAVA_HOME and HADOOP_HOME (or ARROW_LIBHDFS_DIR to the folder of libhdfs.so) and "
    "CLASSPATH=$(hadoop classpath --glob)"
)


def is_uri(text: str | os.PathLike[str]) -> bool:
    """Whether ``text`` names a file by URI rather than a local path."""
    value = str(text)
    return value.startswith(_SCHEMES) or bool(
        _VIRTUAL_HOSTED.match(value) or _PATH_STYLE.match(value)
    )


@dataclass(frozen=True)
class FileStat:
    """What :meth:`FsPath.stat` answers (the fields readers of model files use)."""

    st_size: int
    st_mtime_ns: int
    st_ino: int = 0


@dataclass(frozen=True)
class FsPath:
    """A file or folder of a :mod:`pyarrow.fs` file system (local paths too, so callers read
    both the same way). It answers the part of :class:`pathlib.Path` that the model-file
    readers use (``/``, ``exists``, ``is_file``, ``is_dir``, ``stat``, ``open("rb")``,
    ``read_text``, ``resolve``), so a remote sparse folder, dense file or network file is read
    where a local one is, in chunks, without a local copy.

    Args:
        path: the path in its file system (``bucket/key`` for S3).
        uri: what the user wrote, for messages.
        connect: returns the file system, connecting on first use (shared by every path
            derived from this one): naming a file never touches the network.
    """

    path: str
    uri: str
    connect: Callable[[], pafs.FileSystem] = field(compare=False, repr=False)

    def __str__(self) -> str:
        return self.uri

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The file system (connected on first use).

        Raises:
            NotAvailableError: HDFS without libhdfs or Java (the message says what to
                install).
            ModelFileError: the file system cannot be reached (naming the URI).
        """
        return self.connect()

    @property
    def name(self) -> str:
        """The last component."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> FsPath:
        """The folder holding it."""
        path = self.path.rstrip("/").rsplit("/", 1)[0]
        uri = self.uri.rstrip("/").rsplit("/", 1)[0]
        return FsPath(path, uri, self.connect)

    def __truediv__(self, name: str) -> FsPath:
        return self.joinpath(name)

    def resolve(self) -> FsPath:
        """Itself (a URI is already absolute)."""
        return self

    def exists(self) -> bool:
        """Whether it exists."""
        return self.file_type().name != "NotFound"

    def is_dir(self) -> bool:
        """Whether it is a folder (an S3 prefix holding objects)."""
        return self.file_type().name == "Directory"

    def stat(self) -> FileStat:
        """Size and modification time.

        Raises:
            ModelFileError: it does not exist or cannot be asked about.
        """
        try:
            info = self.filesystem.get_file_info(self.path)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot read ({_first_line(exc)})") from None
        if info.type.name == "NotFound":
            raise ModelFileError(f"{self}: does not exist")
        return FileStat(int(info.size or 0), int(info.mtime_ns or 0))

    def open(self, mode: str = "rb", buffering: int = -1) -> pa.NativeFile:
        """The file as a read stream (``mode`` must be ``"rb"``; ``buffering`` is ignored:
        the stream reads what is asked)."""
        if mode != "rb":
            raise ValueError(f"{self}: only reading is supported, not mode {mode!r}")
        try:
            return self.filesystem.open_input_stream(self.path)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot open ({_first_line(exc)})") from None

    def read_bytes(self) -> bytes:
        """The file's bytes."""
        with self.open() as stream:
            return stream.read()

    def joinpath(self, name: str) -> FsPath:
        """A path inside this folder."""
        return FsPath(
            f"{self.path.rstrip('/')}/{name}", f"{self.uri.rstrip('/')}/{name}", self.connect
        )

    def file_type(self) -> pafs.FileType:
        """``File``, ``Directory`` or ``NotFound``.

        Raises:
            ModelFileError: the file system cannot be asked (no credentials, no network).
        """
        try:
            return self.filesystem.get_file_info(self.path).type
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot read ({_first_line(exc)})") from None

    def is_file(self) -> bool:
        """Whether it is a file."""
        return self.file_type().name == "File"

    def files_below(self) -> list[FsPath]:
        """Every file under this folder, at any depth, in path order."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path, recursive=True)
        try:
            infos = self.filesystem.get_file_info(selector)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot list ({_first_line(exc)})") from None
        base = self.path.rstrip("/")
        return [
            self.joinpath(info.path[len(base) :].lstrip("/"))
            for info in sorted(infos, key=lambda i: i.path)
            if info.type.name == "File"
        ]

    def read_text(self, encoding: str = "utf-8") -> str:
        """The file's text."""
        try:
            with self.filesystem.open_input_stream(self.path) as stream:
                return stream.read().decode(encoding)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot read ({_first_line(exc)})") from None

    def open_input_file(self) -> pa.NativeFile:
        """The file, for random access (Parquet)."""
        try:
            return self.filesystem.open_input_file(self.path)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot open ({_first_line(exc)})") from None


ModelPath = Path | FsPath
"""A model file or folder: on the local disk, or named by URI."""


def model_path(source: str | os.PathLike[str] | FsPath) -> ModelPath:
    """``source`` as a :class:`~pathlib.Path`, or as an :class:`FsPath` when it is a URI (or
    already one)."""
    if isinstance(source, FsPath):
        return source
    return open_uri(str(source)) if is_uri(source) else Path(source)


def open_uri(uri: str) -> FsPath:
    """The path of ``uri`` in its file system, which connects on first use.

    Args:
        uri: an ``s3://``, ``hdfs://`` (or ``viewfs://``), ``gs://`` or ``file://`` URI, or
            an S3 HTTPS URL (``https://<bucket>.s3.<region>.amazonaws.com/<key>`` or
            ``https://s3.<region>.amazonaws.com/<bucket>/<key>``).

    Returns:
        The path (not checked to exist).
    """
    region = None
    if match := _VIRTUAL_HOSTED.match(uri):
        bucket, region, key = match.groups()
        target = f"s3://{bucket}/{key}"
    elif match := _PATH_STYLE.match(uri):
        region, bucket, key = match.groups()
        target = f"s3://{bucket}/{key}"
    else:
        target = uri
    parts = urlsplit(target)
    # S3 and GCS paths are bucket/key; the others are the URI's path.
    path = f"{parts.netloc}{parts.path}" if parts.scheme in ("s3", "gs") else parts.path or "/"
    return FsPath(path, uri, functools.cache(partial(_connect, target, uri, region)))


def _connect(target: str, uri: str, region: str | None) -> pafs.FileSystem:
    import pyarrow.fs as pafs

    try:
        if region is not None:
            endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
            return pafs.S3FileSystem(region=region, endpoint_override=endpoint)
        return pafs.FileSystem.from_uri(target)[0]
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        if target.startswith(("hdfs://", "viewfs://")):
            raise NotAvailableError(f"{uri}: {HDFS_HINT} ({_first_line(exc)})") from None
        raise ModelFileError(f"{uri}: cannot open ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
