"""The pipeline's tests lower ``_GROUPED_STAGING_SAMPLES`` to exercise the parts of large
batches on small ones: pin such batches to staging in parts, so that no timed trial sends some
of them whole (the trial between parts and whole is tested on its own, in
``test_multi_hot_gpu.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _staged_in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    from hps_core.infer.gpu import schedule

    monkeypatch.setattr(schedule, "_STAGED_IN_PARTS", True)
