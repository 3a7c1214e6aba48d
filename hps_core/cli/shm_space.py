"""Whether the shared-memory folder can hold what a repository's models put there, asked
before ``tritonserver`` starts.

Two things live in ``/dev/shm`` while the server runs:

- the host tier of every table (:mod:`hps_core.tiers.host_table`), one segment per table and
  machine, sized by :mod:`hps_core.footprint`, in :func:`~hps_core.tiers.shm_segment.shm_dir`
  (``HPS_SHM_DIR`` or ``/dev/shm``); a segment already there (another server on this machine
  built it from the same files) costs nothing more;
- one region per model instance of Triton's Python backend, ``shm-default-byte-size`` bytes
  (1 MiB in Triton 2.51 unless ``--backend-config=python,shm-default-byte-size=N`` says),
  always in ``/dev/shm``. A region grows by ``shm-growth-byte-size`` when a request or
  response does not fit it.

A tmpfs does not refuse a write past its size: the process touching the page dies of SIGBUS.
With Docker's default of 64 MiB every stub died ("Stub process ... is not healthy") and
nothing said why. Here the need is added up from the repository's files, as the models will
allocate it, and compared with the free space before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as pb

from hps_core.config import load_ps_config
from hps_core.errors import HPSError, SharedMemoryFullError
from hps_core.footprint import table_footprint
from hps_core.formats.sparse import inspect_sparse_table
from hps_core.infer.model_io import HPS_MODEL_PARAMETER, PS_JSON_PARAMETER
from hps_core.tiers.factory import tier_plan
from hps_core.tiers.file_rows import index_name
from hps_core.tiers.host_table import segment_name
from hps_core.tiers.shm_segment import (
    DEV_SHM,
    PREFIX,
    enlarge_hint,
    folder_space,
    remove_stale_segments,
    shm_dir,
    shortage_message,
)
from hps_core.triton_repo import model_versions, read_config
from hps_core.wording import plural

REGION_BYTES = 1 << 20
"""Triton 2.51's Python backend: ``shm-default-byte-size`` and ``shm-growth-byte-size``."""


@dataclass
class ShmNeed:
    """The shared memory a repository's models will add when they load.

    Attributes:
        host_tiers: bytes of the host-tier segments not built yet, by segment name.
        segments: names of every segment the models open (built or not): a server that
            stopped keeps those for a restart (:mod:`hps_core.tiers.shm_segment`).
        instances: model instances, each a Python backend stub with a region of its own.
        region_bytes: bytes of one region (``shm-default-byte-size``).
        growth_bytes: bytes a region grows by (``shm-growth-byte-size``).
    """

    host_tiers: dict[str, int] = field(default_factory=dict)
    segments: set[str] = field(default_factory=set)
    instances: int = 0
    region_bytes: int = REGION_BYTES
    growth_bytes: int = REGION_BYTES

    @property
    def host_bytes(self) -> int:
        """Bytes of the host-tier segments to build."""
        return sum(self.host_tiers.values())

    @property
    def region_total(self) -> int:
        """Bytes of the Python backend's regions of every instance."""
        return self.instances * self.region_bytes

    def host_text(self) -> str:
        """The host tiers to build, in words."""
        return (
            f"the host tiers of {plural(len(self.host_tiers), 'table')} not yet in shared "
            f"memory ({self.host_bytes:,} bytes)"
        )

    def region_text(self) -> str:
        """The Python backend's regions, in words."""
        return (
            f"the Python backend's regions of {plural(self.instances, 'model instance')} "
            f"({self.region_total:,} bytes, shm-default-byte-size {self.region_bytes:,} each)"
        )


def backend_byte_sizes(extra_args: Sequence[str]) -> tuple[int, int]:
    """The Python backend's region size and growth step that tritonserver options give.

    Args:
        extra_args: options passed to tritonserver (``--backend-config=python,KEY=VALUE``).

    Returns:
        ``(shm-default-byte-size, shm-growth-byte-size)``, Triton's defaults where not given.

    Example:
        >>> backend_byte_sizes(["--backend-config=python,shm-default-byte-size=4194304"])
        (4194304, 1048576)
    """
    sizes = {"shm-default-byte-size": REGION_BYTES, "shm-growth-byte-size": REGION_BYTES}
    for arg in extra_args:
        if not arg.startswith("--backend-config=python,"):
            continue
        key, _, value = arg.removeprefix("--backend-config=python,").partition("=")
        if key in sizes and value.isdigit():
            sizes[key] = int(value)
    return sizes["shm-default-byte-size"], sizes["shm-growth-byte-size"]


def _instances(config: pb.ModelConfig) -> int:
    """Instances of a model: each group's count (1 when unset) on each GPU it names.

    A GPU group that names no GPUs is counted once, so the sum is never above what Triton
    starts (it starts one per visible GPU).
    """
    groups = list(config.instance_group)
    if not groups:
        return 1
    return sum(max(group.count, 1) * max(len(group.gpus), 1) for group in groups)


def _served_ps_json(folder: Path, parameters: dict[str, str], version: int) -> Path:
    # As triton_backend.model_settings.read_settings finds it: the version's own ps.json,
    # else the one the ps_json parameter names, else the model folder's.
    own = folder / str(version) / "ps.json"
    given = parameters.get(PS_JSON_PARAMETER)
    return own if own.is_file() else folder / given if given else folder / "ps.json"


def repository_need(
    repository: Path, extra_args: Sequence[str] = (), directory: Path | None = None
) -> ShmNeed:
    """Add up the shared memory the models of ``repository`` will take when they load.

    Each Python model folder's latest version (Triton's default version policy) is counted:
    its instances' Python backend regions, and the host tier of each of its tables unless a
    segment of the same contents is in ``directory`` already. Tables that several models
    serve (``dlrm`` and ``dlrm_samples``) are counted once, as they share one segment. Not
    counted: models whose config.pbtxt, ps.json or sparse files their load will refuse (it
    names the file), and tables read from a URI (sizing them would reach their store before
    the server starts).

    Args:
        repository: the model repository.
        extra_args: tritonserver options (for the Python backend's region size).
        directory: the host tier's folder; :func:`~hps_core.tiers.shm_segment.shm_dir` when
            ``None``.

    Returns:
        The need.

    Example:
        >>> need = repository_need(Path("model_repository"))  # doctest: +SKIP
        >>> need.instances, need.host_bytes  # doctest: +SKIP
        (14, 17123328)
    """
    directory = directory or shm_dir()
    need = ShmNeed()
    need.region_bytes, need.growth_bytes = backend_byte_sizes(extra_args)
    for folder in sorted(p.parent for p in repository.glob("*/config.pbtxt")):
        versions = model_versions(folder)
        try:
            config = read_config(folder / "config.pbtxt")
        except HPSError:
            continue
        if config.backend != "python" or not versions:
            continue
        need.instances += _instances(config)
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        try:
            ps = load_ps_config(_served_ps_json(folder, parameters, versions[-1]))
            model = ps.model(parameters.get(HPS_MODEL_PARAMETER) or folder.name)
            plan = tier_plan(ps)
            for table in model.tables:
                if not isinstance(table.sparse_file, Path):
                    continue
                rows = inspect_sparse_table(table.sparse_file, table.dim).rows
                name = segment_name(table.sparse_file, table.dim, plan.host_fraction, table.storage)
                need.segments.add(name)
                if plan.model_files:
                    need.segments.add(index_name(table.sparse_file, table.dim))
                nbytes = table_footprint(ps, model, table, rows).host
                data = directory / f"{PREFIX}{name}.data"
                if not (data.is_file() and data.stat().st_size == nbytes):
                    need.host_tiers[name] = nbytes  # one running server mapped: no new pages
        except (HPSError, OSError):
            continue
    return need


def check_repository_fits(
    repository: Path, extra_args: Sequence[str] = (), refuse: bool = True, rebuild: bool = False
) -> list[str]:
    """Refuse a repository whose models would not fit the free shared memory.

    Segments whose users all died are removed first (every load does so too, so their
    space is free for this server), and so are the segments a server kept at its stop that
    this repository's models do not open (another repository's, an older version's); those it
    opens are kept for its models to re-attach, unless ``rebuild``.

    Args:
        repository: the model repository about to be served.
        extra_args: tritonserver options.
        refuse: raise when the models do not fit; ``False`` returns that as a warning (when
            not every model may be loaded).
        rebuild: remove every kept segment, so that the models build their host tiers again.

    Returns:
        Warnings: the models fit, but with less to spare than their regions grow by when a
        request does not fit them (one ``shm-growth-byte-size`` each).

    Raises:
        SharedMemoryFullError: the host tiers still to build and the Python backend's
            regions need more than the free space; the message names the folder, the bytes
            needed and free, what needs them, and Docker's ``--shm-size`` fix.
    """
    directory = shm_dir()
    wanted = repository_need(repository, extra_args, directory).segments
    remove_stale_segments(directory, keep=() if rebuild else wanted)
    need = repository_need(repository, extra_args, directory)
    # One filesystem unless HPS_SHM_DIR names another: the regions are always in /dev/shm.
    if os.stat(directory).st_dev == os.stat(DEV_SHM).st_dev:
        what = f"{need.host_text()} and {need.region_text()}"
        parts = [(directory, need.host_bytes + need.region_total, what, need.instances)]
    else:
        parts = [
            (directory, need.host_bytes, need.host_text(), 0),
            (DEV_SHM, need.region_total, need.region_text(), need.instances),
        ]
    warnings = []
    for folder, needed, what, regions in parts:
        free, total = folder_space(folder)
        if total == 0:  # a tmpfs without a size limit
            continue
        what = f"the models of {repository}: {what}"
        if needed > free:
            message = shortage_message(folder, what, needed, free, total)
            if refuse:
                raise SharedMemoryFullError(message)
            warnings.append(f"if every model loads: {message}")
            continue
        growth = regions * need.growth_bytes
        if needed + growth > free:
            warnings.append(
                f"{folder} may be too small for {what}: {free - needed:,} bytes will be free "
                f"once they load, less than the {plural(regions, 'region')} grow by when a "
                f"request or response does not fit ({need.growth_bytes:,} bytes each), and a "
                f"stub whose region cannot grow dies; to be safe, "
                f"{enlarge_hint(folder, needed + growth, free, total)}"
            )
    return warnings
