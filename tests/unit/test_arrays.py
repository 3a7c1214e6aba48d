"""``hps_core.arrays``: ``distinct_keys`` against Python sets, on random keys with repeats, the
int64 extremes and empty input; ``array_module``'s reason when a GPU asked for is not there
(no GPU, no CuPy, CUDA unusable or hiding devices), with a stand-in CuPy."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
from private_shm import private_shm_dir

from hps_core import HPS, arrays
from hps_core.arrays import HASHED_KEYS, array_module, distinct_keys, gpu_devices
from hps_core.errors import NotAvailableError
from hps_core.formats.sparse_writer import write_sparse_table

INT64 = np.iinfo(np.int64)


@pytest.mark.parametrize("n", [0, 1, 1000, HASHED_KEYS, 300_000])
def test_distinct_keys_index_back_to_every_key(n):
    rng = np.random.default_rng(n)
    keys = rng.integers(INT64.min, INT64.max, max(n // 3, 1), dtype=np.int64, endpoint=True)
    keys = rng.choice(np.concatenate([keys, [INT64.min, INT64.max, 0, -1]]), n)
    unique, index = distinct_keys(keys)
    assert unique.dtype == np.int64 and index.shape == keys.shape
    assert len(unique) == len(set(keys.tolist())) == len(np.unique(unique))
    np.testing.assert_array_equal(unique[index], keys)


@pytest.mark.parametrize("n", [12, HASHED_KEYS + 2])
def test_distinct_keys_take_a_strided_view(n):
    keys = (np.arange(2 * n, dtype=np.int64) % 3)[::2]
    unique, index = distinct_keys(keys)
    assert sorted(unique.tolist()) == [0, 1, 2] and unique[index].tolist() == keys.tolist()


# -- array_module: why a GPU asked for is not there -------------------------------------------


def _fake_cupy(count=None, error=None):
    """A stand-in for ``cupy`` whose runtime reports ``count`` devices or raises ``error``."""

    class CUDARuntimeError(RuntimeError):
        pass

    def get_device_count():
        if error is not None:
            raise CUDARuntimeError(error)
        return count

    runtime = types.SimpleNamespace(
        getDeviceCount=get_device_count, CUDARuntimeError=CUDARuntimeError
    )
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


def _without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError


def test_a_gpu_on_a_machine_without_one_says_so_not_that_cupy_is_missing(monkeypatch):
    _without_cupy(monkeypatch)
    monkeypatch.setattr(arrays, "gpu_devices", list)
    with pytest.raises(NotAvailableError) as caught:
        array_module(0)
    message = str(caught.value)
    assert "GPU 0 requested, but this machine has no GPU" in message
    assert "leave device_id out (None) to run on the CPU" in message
    assert "CuPy" not in message


def test_a_gpu_machine_without_cupy_says_to_install_it(monkeypatch):
    _without_cupy(monkeypatch)
    monkeypatch.setattr(arrays, "gpu_devices", lambda: ["/dev/nvidia0"])
    with pytest.raises(NotAvailableError, match=r"GPU 1 requested, but CuPy is not installed"):
        array_module(1)


def test_cupy_without_a_gpu_and_cuda_errors_name_the_cause(monkeypatch):
    monkeypatch.setattr(arrays, "gpu_devices", list)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(error="cudaErrorNoDevice"))
    with pytest.raises(NotAvailableError, match=r"has no GPU .*CUDA says cudaErrorNoDevice"):
        array_module(0)
    monkeypatch.setattr(arrays, "gpu_devices", lambda: ["/dev/nvidia0"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(
        NotAvailableError,
        match=r"CUDA is unusable: cudaErrorNoDevice \(CUDA_VISIBLE_DEVICES='7'\)",
    ):
        array_module(0)


def test_hidden_and_missing_devices_are_counted(monkeypatch):
    monkeypatch.setattr(arrays, "gpu_devices", lambda: ["/dev/nvidia0"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count=0))
    with pytest.raises(NotAvailableError, match=r"CUDA sees no GPU \(CUDA_VISIBLE_DEVICES=''\)"):
        array_module(0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    fake = _fake_cupy(count=2)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(
        NotAvailableError, match=r"GPU 2 requested, but 2 CUDA devices are visible$"
    ):
        array_module(2)
    assert array_module(1) is fake and array_module(None) is np


@pytest.mark.skipif(bool(gpu_devices()), reason="this machine has a GPU")
def test_lookup_on_gpu_0_of_this_machine_says_it_has_no_gpu(tmp_path, monkeypatch):
    # The case as a user meets it: HPS.lookup(..., device_id=0) on a CPU machine.
    shm = private_shm_dir(tmp_path, monkeypatch)
    write_sparse_table(tmp_path / "t0", np.arange(4, dtype=np.int64), np.ones((4, 2), np.float32))
    model = {
        "model": "m",
        "sparse_files": ["t0"],
        "deployed_device_list": [0],
        "default_value_for_each_table": [0.0],
        "maxnum_catfeature_query_per_table_per_sample": [1],
        "embedding_vecsize_per_table": [2],
    }
    ps_json = tmp_path / "ps.json"
    ps_json.write_text(json.dumps({"supportlonglong": True, "models": [model]}))
    hps = HPS(ps_json)
    try:
        with pytest.raises(NotAvailableError, match="GPU 0 requested, but this machine has no GPU"):
            hps.lookup(np.array([1, 2], dtype=np.int64), "m", 0, device_id=0)
        assert hps.lookup(np.array([1], dtype=np.int64), "m", 0).tolist() == [[1.0, 1.0]]
    finally:
        hps.close()
    assert list(shm.iterdir()) == []
