"""``hps serve`` adds up the shared memory a repository's models take and refuses, before
Triton starts, when the folder is too small (issue 47: 12 MiB of /dev/shm for 16.5 MiB of
models killed every stub, and the summary said "fix the files").

The host tier's folder here is a tmpfs of a few MiB (``HPS_SHM_DIR``), as Docker's
``--shm-size`` makes ``/dev/shm``; the Python backend's regions are counted against
/dev/shm itself, a filesystem of its own then.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from private_shm import mounted_tmpfs

from hps_core.cli.main import main
from hps_core.cli.serve import report_unavailable_models
from hps_core.cli.shm_space import backend_byte_sizes, check_repository_fits, repository_need
from hps_core.config import load_ps_config
from hps_core.errors import SharedMemoryFullError
from hps_core.footprint import model_footprint
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.process import ModelState, ServerStartError, TritonServer
from hps_core.tiers.host_table import SharedHostTable
from hps_core.tiers.shm_segment import DEV_SHM, folder_space

MiB = 2**20
ROWS = {"emb_0": 20_000, "emb_1": 2_000}  # dim 16: 1.4 MiB and 0.15 MiB of host tier
DIM = 16


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Models emb_0 and emb_1 (one table each, two instances each) and their repository."""
    rng = np.random.default_rng(5)
    models = []
    for name, rows in ROWS.items():
        keys = np.arange(rows, dtype=np.int64)
        write_sparse_table(tmp_path / name, keys, rng.standard_normal((rows, DIM), np.float32))
        models.append({
            "model": name, "sparse_files": [name], "embedding_vecsize_per_table": [DIM],
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [4], "deployed_device_list": [0],
        })  # fmt: skip
    (tmp_path / "ps.json").write_text(json.dumps({"supportlonglong": True, "models": models}))
    argv = ["repo", str(tmp_path / "ps.json"), str(tmp_path / "repo"), "--instances", "2"]
    assert main(argv) == 0
    return tmp_path / "repo"


@pytest.fixture
def small_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 1 MiB tmpfs as the host tier's folder: smaller than emb_0's table."""
    with mounted_tmpfs(tmp_path / "small_shm", "1m") as folder:
        monkeypatch.setenv("HPS_SHM_DIR", str(folder))
        yield folder


def _host_bytes(repo: Path, model: str) -> int:
    config = load_ps_config(repo / model / "ps.json")
    return model_footprint(config, config.model(model)).host


def test_region_sizes_come_from_the_backend_config() -> None:
    assert backend_byte_sizes([]) == (MiB, MiB)
    given = [
        "--backend-config=python,shm-growth-byte-size=2097152",
        "--backend-config=onnxruntime,shm-default-byte-size=5",
        "--backend-config=python,shm-default-byte-size=8388608",
    ]
    assert backend_byte_sizes(given) == (8 * MiB, 2 * MiB)


def test_the_need_is_each_table_once_and_each_instance_a_region(repo: Path) -> None:
    need = repository_need(repo)
    assert need.instances == 4
    assert need.region_total == 4 * MiB
    assert sorted(need.host_tiers.values()) == sorted(_host_bytes(repo, m) for m in ROWS)
    # A second model serving emb_0's table shares its segment: nothing more to build.
    (repo / "emb_0_copy").mkdir()
    for name in ("config.pbtxt", "ps.json"):
        text = (repo / "emb_0" / name).read_text().replace('"emb_0"', '"emb_0_copy"')
        (repo / "emb_0_copy" / name).write_text(text)
    (repo / "emb_0_copy" / "1").mkdir()
    (repo / "emb_0_copy" / "1" / "model.py").write_text((repo / "emb_0/1/model.py").read_text())
    again = repository_need(repo)
    assert again.instances == 6 and again.host_tiers == need.host_tiers


def test_a_segment_already_built_costs_nothing(repo: Path, shm_path: Path) -> None:
    config = load_ps_config(repo / "emb_0" / "ps.json")
    table = SharedHostTable(config.model("emb_0").tables[0].sparse_file, DIM)
    try:
        need = repository_need(repo)
        assert list(need.host_tiers.values()) == [_host_bytes(repo, "emb_1")]
    finally:
        table.close()


def test_too_small_a_folder_is_refused_with_the_numbers(repo: Path, small_shm: Path) -> None:
    needed = _host_bytes(repo, "emb_0") + _host_bytes(repo, "emb_1")
    free = folder_space(small_shm)[0]
    with pytest.raises(SharedMemoryFullError) as err:
        check_repository_fits(repo)
    assert str(err.value) == (
        f"{small_shm} is too small for the models of {repo}: the host tiers of 2 tables not yet "
        f"in shared memory ({needed:,} bytes): {needed:,} bytes ({needed / MiB:.1f} MiB) "
        f"needed, {free:,} bytes (1.0 MiB) free of 1.0 MiB; free space in {small_shm} (a tmpfs "
        f"grows with mount -o remount,size=1G {small_shm}), or set HPS_SHM_DIR to a larger one"
    )
    # Where the user's model control decides what loads, it is a warning.
    (warning,) = check_repository_fits(repo, refuse=False)
    assert warning == f"if every model loads: {err.value}"


def test_hps_serve_stops_before_starting_triton(
    repo: Path,
    small_shm: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started: list[TritonServer] = []

    def start(self: TritonServer) -> TritonServer:
        started.append(self)
        raise ServerStartError("stand-in: no tritonserver in this test")

    monkeypatch.setattr(TritonServer, "start", start)
    ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
    assert main(["serve", "--model-repository", str(repo), *ports]) == 2
    assert started == []
    err = capsys.readouterr().err
    assert err.startswith(f"error: {small_shm} is too small for the models of {repo}")


def test_a_tight_fit_is_a_warning(repo: Path, tmp_path: Path, monkeypatch) -> None:
    # The regions count against the host tier's folder when it is /dev/shm's filesystem:
    # 1.6 MiB of tables and 4 MiB of regions fit 6 MiB, their growth (4 x 1 MiB) does not.
    with mounted_tmpfs(tmp_path / "shm6", "6m") as folder:
        monkeypatch.setattr("hps_core.cli.shm_space.DEV_SHM", folder)
        monkeypatch.setenv("HPS_SHM_DIR", str(folder))
        (warning,) = check_repository_fits(repo)
    assert warning.startswith(f"{folder} may be too small for the models of {repo}: the host ")
    assert "less than the 4 regions grow by when a request or response does not fit" in warning


def test_the_summary_says_what_to_do_by_the_kind_of_reason(capsys) -> None:
    full = (
        "Internal: SharedMemoryFullError: /dev/shm is too small for the host tier of /m/t0: "
        "3,665,664 bytes (3.5 MiB) needed"
    )
    died = "Internal: Stub process 'emb_0_0_1' is not healthy."
    cut = "Internal: ModelFileError: /m/emb_vector looks truncated"
    lines = report_unavailable_models({"a": ModelState("UNAVAILABLE", full)})
    assert lines[-1] == (
        "hps serve: 0 of 1 model serve; give the server the shared memory its error above says "
        "and restart"
    )
    lines = report_unavailable_models({"a": ModelState("UNAVAILABLE", died)})
    assert "fix the files" not in lines[-1]
    free, total = folder_space(DEV_SHM)
    assert lines[-1].startswith(
        "hps serve: 0 of 1 model serve; a stub process died while its model loaded, killed by a "
        f"signal: the OOM killer's, or SIGBUS when shared memory ran out (now /dev/shm: "
        f"{free / MiB:.1f} MiB free of {total / MiB:.1f} MiB"
    )
    lines = report_unavailable_models(
        {"a": ModelState("UNAVAILABLE", cut), "b": ModelState("UNAVAILABLE", full)}
    )
    assert lines[-1].endswith(
        "its error above says and restart; fix the files and restart (or load the model "
        "through the repository API when model control is yours)"
    )
    capsys.readouterr()
