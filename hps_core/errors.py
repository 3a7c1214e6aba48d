"""Exception types shared by the engine, the command line and the Triton backend.

Every error names *what* is wrong and *where* (a ps.json path such as
``models[0].embedding_vecsize_per_table``, a file path, or a request input name), so that a
user can fix it without reading a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

OVERWRITE_HINT = "pass --overwrite (overwrite=True) to replace"
"""How to ask for existing files to be replaced: the same functions serve the ``hps`` command
line (its ``--overwrite`` flag) and the Python API (their ``overwrite`` argument)."""


class HPSError(Exception):
    """Base class of every error this package raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One problem found while validating a configuration or a set of files.

    Args:
        where: location, e.g. ``models[0].sparse_files[1]`` or a file path.
        message: what is wrong there.
    """

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class ConfigError(HPSError):
    """A ps.json (or config.pbtxt parameter) is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem] | Problem | str, where: str = "") -> None:
        if isinstance(problems, str):
            problems = [Problem(where or "config", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ModelFileError(HPSError):
    """A sparse or dense model file is missing, truncated or inconsistent."""


class SharedMemoryFullError(HPSError):
    """The shared-memory folder (``/dev/shm``) has too little free space for what is to be
    put there; the message names the folder, the bytes needed and free, and how to give the
    server more (Docker's ``--shm-size``)."""


class NotAvailableError(HPSError):
    """A configuration asks for a feature that parses but is not implemented yet.

    Args:
        message: what is not available.
        problems: where, one :class:`Problem` each (each layer a network cannot run).
    """

    def __init__(self, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.problems: list[Problem] = list(problems or [])


class RequestError(HPSError):
    """A client request is malformed; maps to Triton's INVALID_ARG for that request only."""


class TierUnavailableError(HPSError):
    """A tier below the host tier (a Redis node, a database) did not answer.

    The lookup cascade counts it and answers the keys from the tiers below. When none below
    can say whether a key exists (no tier there holds every row the silent one held), the
    lookup raises it and the request fails ``UNAVAILABLE``: a tier down never turns into
    default vectors answered as if they were the model's.
    """
