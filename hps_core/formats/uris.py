"""Files named by URI (``s3://``, ``hdfs://``, HugeCTR's ``https://<bucket>.s3.<region>.
amazonaws.com/...``), opened through :mod:`pyarrow.fs`.

HugeCTR infers the file system from a path's URI; so does this module. S3 takes the standard
AWS settings from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for an S3-compatible server, ...); they never
appear in messages. HDFS needs Hadoop's ``libhdfs`` and a Java runtime, which a failed
connection names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from hps_core.errors import ModelFileError, NotAvailableError

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
class FsPath:
    """A file or folder of a :mod:`pyarrow.fs` file system (local paths too, so callers read
    both the same way).

    Args:
        filesystem: the file system.
        path: the path in it (``bucket/key`` for S3).
        uri: what the user wrote, for messages.
    """

    filesystem: pafs.FileSystem
    path: str
    uri: str

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        """The last component."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> FsPath:
        """The folder holding it."""
        path = self.path.rstrip("/").rsplit("/", 1)[0]
        uri = self.uri.rstrip("/").rsplit("/", 1)[0]
        return FsPath(self.filesystem, path, uri)

    def joinpath(self, name: str) -> FsPath:
        """A path inside this folder."""
        return FsPath(
            self.filesystem, f"{self.path.rstrip('/')}/{name}", f"{self.uri.rstrip('/')}/{name}"
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
        return self.file_type() == pafs.FileType.File

    def files_below(self) -> list[FsPath]:
        """Every file under this folder, at any depth, in path order."""
        selector = pafs.FileSelector(self.path, recursive=True)
        try:
            infos = self.filesystem.get_file_info(selector)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot list ({_first_line(exc)})") from None
        base = self.path.rstrip("/")
        return [
            self.joinpath(info.path[len(base) :].lstrip("/"))
            for info in sorted(infos, key=lambda i: i.path)
            if info.type == pafs.FileType.File
        ]

    def read_text(self) -> str:
        """The file's text (UTF-8)."""
        try:
            with self.filesystem.open_input_stream(self.path) as stream:
                return stream.read().decode("utf-8")
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot read ({_first_line(exc)})") from None

    def open_input_file(self) -> pafs.NativeFile:
        """The file, for random access (Parquet)."""
        try:
            return self.filesystem.open_input_file(self.path)
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{self}: cannot open ({_first_line(exc)})") from None


def fs_path(source: str | os.PathLike[str]) -> FsPath:
    """A local path or a URI (see :func:`open_uri`) as an :class:`FsPath`."""
    if is_uri(source):
        return open_uri(str(source))
    return FsPath(pafs.LocalFileSystem(), str(Path(source).absolute()), str(source))


def open_uri(uri: str) -> FsPath:
    """The file system and path of ``uri``.

    Args:
        uri: an ``s3://``, ``hdfs://`` (or ``viewfs://``), ``gs://`` or ``file://`` URI, or
            an S3 HTTPS URL (``https://<bucket>.s3.<region>.amazonaws.com/<key>`` or
            ``https://s3.<region>.amazonaws.com/<bucket>/<key>``).

    Returns:
        The remote file (not checked to exist).

    Raises:
        NotAvailableError: HDFS without libhdfs or Java (the message says what to install).
        ModelFileError: another URI pyarrow cannot open (naming it).
    """
    region = None
    match = _VIRTUAL_HOSTED.match(uri)
    if match:
        bucket, region, key = match.groups()
        target = f"s3://{bucket}/{key}"
    elif match := _PATH_STYLE.match(uri):
        region, bucket, key = match.groups()
        target = f"s3://{bucket}/{key}"
    else:
        target = uri
    try:
        if region is not None:
            bucket_key = target.removeprefix("s3://")
            endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
            filesystem = pafs.S3FileSystem(region=region, endpoint_override=endpoint)
            return FsPath(filesystem, bucket_key, uri)
        filesystem, path = pafs.FileSystem.from_uri(target)
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        if target.startswith(("hdfs://", "viewfs://")):
            raise NotAvailableError(f"{uri}: {HDFS_HINT} ({_first_line(exc)})") from None
        raise ModelFileError(f"{uri}: cannot open ({_first_line(exc)})") from None
    return FsPath(filesystem, path, uri)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
