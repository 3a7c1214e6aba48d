"""Fixtures of the backend tests: a private shared-memory folder for any table opened, and the
settings of an instance of the demo W&D model."""

from __future__ import annotations

from pathlib import Path

import pytest
from private_shm import private_shm_dir

from hps_core.demo import DEMO_MODELS
from hps_core.hps import HPS
from hps_core.triton_repo import ServingOptions
from triton_backend.model_settings import ModelSettings


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test, never at /dev/shm."""
    return private_shm_dir(tmp_path, monkeypatch)


@pytest.fixture
def settings(tmp_path: Path) -> ModelSettings:
    """A CPU instance of the demo W&D model (every table closed after the test)."""
    folder = DEMO_MODELS["wdl"](tmp_path, ServingOptions())
    settings = ModelSettings(
        triton_model="wdl", hps_model="wdl", ps_json=folder / "ps.json", instance_kind="CPU",
        device_id=0, config={}, instance_name="wdl_0", miss_policy="default",
    )  # fmt: skip
    yield settings
    HPS.close_all()
