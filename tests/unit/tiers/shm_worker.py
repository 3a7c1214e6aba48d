"""Child process of the multi-process shared-memory tests (run as a script, never imported).

Usage: ``python shm_worker.py MODE DIR NAME SIZE [GO_FILE [RELEASE_FILE]]`` with MODE one of

- ``hold``: wait for GO_FILE, open segment NAME of SIZE bytes in DIR (building it with
  :func:`segment_content` if needed), print one JSON line, then wait for RELEASE_FILE (or
  forever when absent) and close;
- ``hang_in_build``: open the segment with a build callback that prints ``building`` and
  then sleeps until killed.
- ``host_table``: NAME is a sparse folder, SIZE its dim, DIR is unused (the table finds its
  segment through ``HPS_SHM_DIR``); attach a SharedHostTable, look up the int64 keys saved in
  GO_FILE (``.npy``), print built_here and the digest of the answer.

Every build appends this process's pid to ``DIR/../builds.log``, so the parent counts builds
independently of ``built_here``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from hps_core.tiers.host_table import SharedHostTable
from hps_core.tiers.shm_segment import SharedSegment


def segment_content(name: str, size: int) -> bytes:
    """The bytes every builder of segment ``name`` writes (a function of name and size)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.005)


def _log_build(directory: Path) -> None:
    with open(directory.parent / "builds.log", "a") as log:
        log.write(f"{os.getpid()}\n")


def hold(directory: Path, name: str, size: int, go: str, release: str | None) -> None:
    _wait_for(go)

    def build(buffer) -> None:
        _log_build(directory)
        time.sleep(0.2)  # a slow build: the other processes must wait, not build again
        buffer[:] = segment_content(name, size)

    segment = SharedSegment.open(name, size, build, directory)
    digest = hashlib.sha256(bytes(segment.buffer)).hexdigest()
    print(json.dumps({"pid": os.getpid(), "built": segment.built_here, "digest": digest}))
    sys.stdout.flush()
    if release is None:
        while True:
            time.sleep(60)
    _wait_for(release)
    segment.close()


def hang_in_build(directory: Path, name: str, size: int) -> None:
    def build(buffer) -> None:
        _log_build(directory)
        print("building", flush=True)
        while True:
            time.sleep(60)

    SharedSegment.open(name, size, build, directory)


def host_table(sparse_dir: Path, dim: int, keys_file: str) -> None:
    table = SharedHostTable(sparse_dir, dim)
    values, found = table.lookup(np.load(keys_file))
    digest = hashlib.sha256(values.tobytes() + found.tobytes()).hexdigest()
    print(json.dumps({"built": table.built_here, "digest": digest}), flush=True)
    table.close()


def main(argv: list[str]) -> None:
    mode, directory, name, size = argv[:4]
    rest = argv[4:]
    if mode == "hold":
        hold(Path(directory), name, int(size), rest[0], rest[1] if len(rest) > 1 else None)
    elif mode == "hang_in_build":
        hang_in_build(Path(directory), name, int(size))
    elif mode == "host_table":
        host_table(Path(name), int(size), rest[0])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
