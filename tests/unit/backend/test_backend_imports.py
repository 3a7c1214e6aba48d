"""What a Triton stub loads with the models' code: each stub is a process of its own, so a
heavy optional library imported with the serving modules costs its memory once per instance."""

from __future__ import annotations

import subprocess
import sys

# Libraries the serving path needs only on request: pyarrow (Parquet, URIs; about 40 MiB
# resident), confluent-kafka (made with a consumer), redis and rocksdict (with their tiers).
LAZY = ("pyarrow", "confluent_kafka", "redis", "rocksdict")

PROBE = f"""
import sys, types
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
import triton_backend.embedding_model, triton_backend.ranking_model, hps_core.updates.apply
print(",".join(m for m in {LAZY!r} if m in sys.modules))
"""


def test_serving_modules_do_not_import_optional_libraries() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "", f"imported with the serving modules: {done.stdout}"
