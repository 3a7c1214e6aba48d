"""Multi-hot tables of a fixed hotness on the GPU pipeline (the zoo's DLRM-v2: 26 tables of
MLPerf's 1 to 100 keys per sample, a DCN v2 cross network) against the NumPy path and the
float64 reference of the tests.

The same samples reach the pipeline in every form a batch can take: the request's ``[B, K]``
key matrix (staged sample-major, in one copy), per-table keys without offsets (table-major),
HugeCTR's CSR offsets, and CuPy arrays already on the GPU; with a dynamic cache, a cache too
small for a batch's misses (rows read in place beyond its staging rows), static tables and
no cache. A batch's repeated missed keys cross PCIe once and are inserted once.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranking_reference import encode_hugectr, encode_samples  # noqa: E402
from test_model_zoo import ZooModel  # noqa: E402
from test_pipeline_gpu import on_gpu  # noqa: E402

from hps_core.demo import ZOO_MODELS  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession, SparseBatch  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract, SamplesContract  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402

NAME = "dlrm_v2"
VARIANTS = {
    "dynamic": {"gpucacheper": 0.5},
    "tiny": {"gpucacheper": 0.01},  # one 64-way set: most of a batch's misses overflow
    "static": {"embedding_cache_type": "static"},
    "host": {"gpucache": False},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gpu_multi_hot")
    ZOO_MODELS[NAME](root, ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),)))
    yield root
    HPS.close_all()


def variant(repo: Path, kind: str, tag: str = "") -> Path:
    ps = json.loads((repo / NAME / "ps.json").read_text())
    ps["models"][0].update(VARIANTS[kind])
    path = repo / NAME / f"ps_{kind}{tag}.json"
    path.write_text(json.dumps(ps))
    return path


def table_major(batch: SparseBatch) -> SparseBatch:
    """The same samples with each table's keys on their own (no key matrix)."""
    keys = tuple(np.ascontiguousarray(batch.flat_keys(t)) for t in range(len(batch.keys)))
    return SparseBatch(batch.dense, keys, batch.row_offsets, batch.hotness)


def uneven(keys: list, rng: np.random.Generator) -> list:
    """``keys`` with one key dropped from some multi-hot slots: no fixed hotness any more."""
    for sample in keys:
        for table in sample:
            for slot in table:
                if len(slot) > 1 and rng.random() < 0.3:
                    slot.pop()
    return keys


@pytest.mark.parametrize("kind", VARIANTS)
def test_every_batch_form_equals_numpy_and_the_reference(repo: Path, kind: str) -> None:
    model = ZooModel(repo, NAME)
    ps = variant(repo, kind)
    gpu = RankingSession.open(ps, NAME, device_id=0)
    cpu = RankingSession.open(ps, NAME)
    samples, hugectr = SamplesContract(gpu.layout), HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(51)
    for batch in (1, 3, 64, 200, 64):
        dense, keys = model.samples(rng, batch)
        parsed = samples.parse(*encode_samples(dense, keys))
        assert parsed.sample_keys is not None and gpu.pipeline._uploader.sample_major(parsed)
        want = cpu.predict(parsed)
        model.check(want, dense, keys)
        from_hugectr = hugectr.parse(*encode_hugectr(dense, keys))
        assert all(o is None for o in from_hugectr.row_offsets)  # fixed hotness: no offsets
        for form in (parsed, table_major(parsed), from_hugectr, on_gpu(parsed)):
            np.testing.assert_allclose(gpu.predict(form), want, rtol=1e-5, atol=1e-6)
        # Slots of uneven length come with offsets (CSR) and take the table-major path.
        dense, keys = model.samples(rng, batch)
        keys = uneven(keys, rng)
        ragged = hugectr.parse(*encode_hugectr(dense, keys))
        got = gpu.predict(ragged)
        np.testing.assert_allclose(got, cpu.predict(ragged), rtol=1e-5, atol=1e-6)
        model.check(got, dense, keys)


def test_a_repeated_miss_crosses_pcie_once_and_is_inserted_once(repo: Path) -> None:
    """A fresh cache misses every key: each distinct key of a table is read from host memory
    once and inserted once, however often the batch repeats it; the second pass hits all."""
    model = ZooModel(repo, NAME)
    gpu = RankingSession.open(variant(repo, "dynamic", "_dedupe"), NAME, device_id=0)
    contract = SamplesContract(gpu.layout)
    rng = np.random.default_rng(53)
    few = [rng.choice(sorted(table), 6, replace=False) for table in model.tables]
    dense, keys = model.samples(rng, 100)
    for sample in keys:
        for t, table in enumerate(sample):
            for slot in table:
                slot[:] = [int(k) for k in rng.choice(few[t], len(slot))]
    parsed = contract.parse(*encode_samples(dense, keys))
    model.check(gpu.predict(parsed), dense, keys)
    first = gpu.lookup.counters()
    for t, counters in enumerate(first):
        distinct = len(np.unique(parsed.flat_keys(t)))
        assert counters.keys == parsed.keys[t].size
        assert counters.cache_misses == counters.keys  # every occurrence missed ...
        assert counters.host_rows == distinct  # ... but each row crossed PCIe once
        assert counters.inserted_keys == distinct
    model.check(gpu.predict(parsed), dense, keys)
    second = gpu.lookup.counters()
    for a, b in zip(second, first, strict=True):
        assert a.cache_hits - b.cache_hits == b.keys and a.host_rows == b.host_rows


@pytest.mark.parametrize("threaded", [False, True])
def test_large_sample_major_batches_staged_in_parts(
    repo: Path, threaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grouped bucket stages a sample-major batch part by part of its samples (threads fill
    each part from _THREADED_STAGING_BYTES on), and looks each part up as soon as it is
    copied, with a graph per part; the same batch table-major takes the groups of tables."""
    from hps_core.infer.gpu import buckets, uploads
    from hps_core.infer.gpu import schedule as gpu_schedule

    monkeypatch.setattr(buckets, "_GROUPED_STAGING_SAMPLES", 8)
    monkeypatch.setattr(uploads, "_THREADED_STAGING_BYTES", 0 if threaded else 1 << 62)
    # Scored whole: every form's scores then come from products of the same shapes, bit for
    # bit (scoring part by part: test_sample_major_batches_scored_part_by_part_equal_numpy).
    monkeypatch.setattr(gpu_schedule, "_DENSE_BY_PART", False)
    model = ZooModel(repo, NAME)
    ps = variant(repo, "dynamic", f"_large{threaded}")
    gpu = RankingSession.open(ps, NAME, device_id=0)
    cpu = RankingSession.open(ps, NAME)
    contract = SamplesContract(gpu.layout)
    rng = np.random.default_rng(57 + threaded)
    for batch in (8, 200, 256):
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_samples(dense, keys))
        got = gpu.predict(parsed)
        np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(gpu.predict(table_major(parsed)), got)
        np.testing.assert_array_equal(gpu.predict(on_gpu(parsed)), got)
        model.check(got, dense, keys)
    pipe = gpu.pipeline
    for bucket in pipe._buckets.values():
        parts = pipe.placement.row_parts(bucket.layout.size, buckets.grouped(bucket))
        assert len(bucket.graphs.row_lookups) == len(parts) > 1
        samples = [r for *_, (first, stop) in parts for r in range(first, stop)]
        assert samples == list(range(bucket.layout.size))  # every sample in exactly one part


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("by_part", [True, False, None])
def test_sample_major_batches_scored_part_by_part_equal_numpy(
    repo: Path,
    kind: str,
    by_part: bool | None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A grouped bucket (lowered here to 8 samples) scores a sample-major host batch part by
    part of its rows (each part's dense network, bottom MLP included, and download as soon as
    its lookup is done, from a graph per part), whole, or (``None``) by whichever of the two
    its first batches ran faster by: the scores equal the NumPy path's, padded last parts and
    batches of one part included; table-major batches and batches on the GPU are scored
    whole."""
    from hps_core.infer.gpu import buckets
    from hps_core.infer.gpu import schedule as gpu_schedule

    monkeypatch.setattr(buckets, "_GROUPED_STAGING_SAMPLES", 8)
    monkeypatch.setattr(gpu_schedule, "_DENSE_BY_PART", by_part)
    monkeypatch.setattr(gpu_schedule, "_SCHEDULE_TRIALS", 2)
    caplog.set_level(logging.INFO, logger="hps_core")
    model = ZooModel(repo, NAME)
    ps = variant(repo, kind, f"_by_part{by_part}")
    gpu = RankingSession.open(ps, NAME, device_id=0)
    cpu = RankingSession.open(ps, NAME)
    contract = SamplesContract(gpu.layout)
    rng = np.random.default_rng(71)
    for batch in (5, 8, 100, 256, 256, 256, 256, 256, 256):
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_samples(dense, keys))
        want = cpu.predict(parsed)
        model.check(want, dense, keys)
        for form in (parsed, table_major(parsed), on_gpu(parsed)):
            np.testing.assert_allclose(gpu.predict(form), want, rtol=1e-5, atol=1e-6)
    pipe = gpu.pipeline
    for bucket in pipe._buckets.values():
        assert len(bucket.graphs.row_dense) == len(pipe._row_parts(bucket)) > 1
        if by_part is not None:  # a fixed choice: nothing timed
            assert bucket.by_part.chosen is by_part and bucket.by_part.times == ([], [])
    if by_part is None:  # the first batch untimed, then 2 of each schedule
        trial = pipe._buckets[256].by_part
        assert trial.chosen is not None and list(map(len, trial.times)) == [2, 2]
        chosen = "by parts" if trial.chosen else "whole"
        assert f"batch bucket 256 scores {chosen} (median" in caplog.text


@pytest.mark.parametrize("kind", ["dynamic", "tiny"])
def test_sample_major_batches_in_any_find_order_and_parts_equal_numpy(
    repo: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bank_find`` takes a sample-major batch column by column (the default) or sample by
    sample, and a grouped bucket (lowered here to 8 samples) looks it up by ranges of samples
    as they are copied (the default) or by groups of tables after the whole copy: whichever
    occurrence of a missed key claims it, the scores equal the NumPy path's and are the same
    bit for bit under every setting."""
    from hps_core.infer.gpu import buckets
    from hps_core.infer.gpu import kernel_steps as gpu_steps
    from hps_core.infer.gpu import pipeline as gpu_pipeline
    from hps_core.infer.gpu import schedule as gpu_schedule

    monkeypatch.setattr(buckets, "_GROUPED_STAGING_SAMPLES", 8)
    # Scored whole: every form's scores then come from products of the same shapes, bit for
    # bit (scoring part by part: test_sample_major_batches_scored_part_by_part_equal_numpy).
    monkeypatch.setattr(gpu_schedule, "_DENSE_BY_PART", False)
    model = ZooModel(repo, NAME)
    cpu = RankingSession.open(variant(repo, kind), NAME)
    scores = {}
    for by_column, row_parts in ((True, True), (False, True), (True, False), (False, False)):
        monkeypatch.setattr(gpu_steps, "_FIND_BY_COLUMN", by_column)
        monkeypatch.setattr(gpu_pipeline, "_ROW_PARTS", row_parts)
        ps = variant(repo, kind, f"_order{by_column}{row_parts}")
        gpu = RankingSession.open(ps, NAME, device_id=0)
        contract = SamplesContract(gpu.layout)
        rng = np.random.default_rng(67)
        got = []
        for batch in (1, 8, 100, 256, 256):
            dense, keys = model.samples(rng, batch)
            parsed = contract.parse(*encode_samples(dense, keys))
            got.append(gpu.predict(parsed))
            np.testing.assert_allclose(got[-1], cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        scores[by_column, row_parts] = got
    first = scores.pop((True, True))
    for got in scores.values():
        for a, b in zip(first, got, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["dynamic", "tiny"])
def test_pooling_beside_the_next_find_equals_pooling_after_it(
    repo: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grouped buckets (lowered here to 8 samples) pool each part on the pool stream while the
    next part's bank_find runs: the scores equal those of the pooling on the cache stream after
    each find, bit for bit, and the NumPy path's, for parts of tables (table-major batches,
    with misses claimed by one part and read by a later one) and parts of samples."""
    from hps_core.infer.gpu import buckets
    from hps_core.infer.gpu import pipeline as gpu_pipeline
    from hps_core.infer.gpu import schedule as gpu_schedule

    monkeypatch.setattr(buckets, "_GROUPED_STAGING_SAMPLES", 8)
    # Scored whole: every form's scores then come from products of the same shapes, bit for
    # bit (scoring part by part: test_sample_major_batches_scored_part_by_part_equal_numpy).
    monkeypatch.setattr(gpu_schedule, "_DENSE_BY_PART", False)
    model = ZooModel(repo, NAME)
    cpu = RankingSession.open(variant(repo, kind), NAME)
    sessions = {}
    for beside in (True, False):
        monkeypatch.setattr(gpu_pipeline, "_POOL_BESIDE_FIND", beside)
        ps = variant(repo, kind, f"_beside{beside}")
        sessions[beside] = RankingSession.open(ps, NAME, device_id=0)
        contract = SamplesContract(sessions[beside].layout)
        rng = np.random.default_rng(61)
        got = []
        for batch in (8, 100, 256, 256):
            dense, keys = model.samples(rng, batch)
            parsed = contract.parse(*encode_samples(dense, keys))
            got += [sessions[beside].predict(parsed), sessions[beside].predict(table_major(parsed))]
            np.testing.assert_allclose(got[-1], cpu.predict(parsed), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(got[-2], got[-1])
        sessions[beside] = got
    for a, b in zip(sessions[True], sessions[False], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_large_host_batches_run_as_pipelined_chunks(
    repo: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host batch with many keys runs as chunks of samples on two lanes of buckets (the
    thresholds lowered here: chunks of 16 samples): its scores equal the NumPy path's in every
    host form, a last chunk shorter than the others included; a batch on the GPU runs whole."""
    from hps_core.infer.gpu import chunks as gpu_chunks

    monkeypatch.setattr(gpu_chunks, "_CHUNKED_KEY_BYTES", 0)
    monkeypatch.setattr(gpu_chunks, "_CHUNKS_WITH_DYNAMIC_CACHES", True)
    monkeypatch.setattr(gpu_chunks, "_CHUNK_KEY_BYTES", 1)
    monkeypatch.setattr(gpu_chunks, "_MIN_CHUNK_SAMPLES", 16)
    model = ZooModel(repo, NAME)
    ps = variant(repo, kind, "_chunks")
    gpu = RankingSession.open(ps, NAME, device_id=0)
    cpu = RankingSession.open(ps, NAME)
    samples, hugectr = SamplesContract(gpu.layout), HugeCTRContract(gpu.layout)
    pipe = gpu.pipeline
    rng = np.random.default_rng(59)
    for batch in (40, 64, 100):
        dense, keys = model.samples(rng, batch)
        parsed = samples.parse(*encode_samples(dense, keys))
        assert pipe._chunk_samples(parsed) == 16
        want = cpu.predict(parsed)
        model.check(want, dense, keys)
        for form in (parsed, table_major(parsed), hugectr.parse(*encode_hugectr(dense, keys))):
            np.testing.assert_allclose(gpu.predict(form), want, rtol=1e-5, atol=1e-6)
        ragged = hugectr.parse(*encode_hugectr(dense, uneven(keys, rng)))
        np.testing.assert_allclose(gpu.predict(ragged), cpu.predict(ragged), rtol=1e-5, atol=1e-6)
    assert set(pipe._lanes[1]) == {16} and max(pipe._buckets) == 16
    np.testing.assert_allclose(gpu.predict(on_gpu(parsed)), want, rtol=1e-5, atol=1e-6)
    assert max(pipe._buckets) == 128  # on the GPU: the batch of 100 whole


def test_host_batches_of_a_model_with_dynamic_caches_run_whole(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the chunk thresholds lowered as above, a model whose tables have dynamic caches
    still runs a large host batch whole (chunks each read and insert their own misses), and
    its scores equal the NumPy path's."""
    from hps_core.infer.gpu import chunks as gpu_chunks

    monkeypatch.setattr(gpu_chunks, "_CHUNKED_KEY_BYTES", 0)
    monkeypatch.setattr(gpu_chunks, "_CHUNK_KEY_BYTES", 1)
    monkeypatch.setattr(gpu_chunks, "_MIN_CHUNK_SAMPLES", 16)
    model = ZooModel(repo, NAME)
    ps = variant(repo, "dynamic", "_whole")
    gpu = RankingSession.open(ps, NAME, device_id=0)
    cpu = RankingSession.open(ps, NAME)
    dense, keys = model.samples(np.random.default_rng(60), 100)
    parsed = SamplesContract(gpu.layout).parse(*encode_samples(dense, keys))
    np.testing.assert_allclose(gpu.predict(parsed), cpu.predict(parsed), rtol=1e-5, atol=1e-6)
    assert gpu.pipeline._chunk_samples(parsed) is None
    assert not gpu.pipeline._lanes[1] and max(gpu.pipeline._buckets) == 128


@pytest.mark.parametrize("split", [1, 2, 4])
def test_long_bags_pool_alike_in_one_group_or_shared_by_several(
    repo: Path, split: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bank_pool`` pools a bag in one group of lanes, or (slots of long bags) in up to
    ``split`` groups that add their sums: the scores equal the NumPy path's either way."""
    from hps_core.infer.gpu import placement as gpu_placement

    monkeypatch.setattr(gpu_placement, "_MAX_SPLIT", split)
    model = ZooModel(repo, NAME)
    gpu = RankingSession.open(variant(repo, "dynamic", f"_split{split}"), NAME, device_id=0)
    cpu = RankingSession.open(variant(repo, "dynamic", f"_split{split}"), NAME)
    # DLRM-v2's table of 100 keys per sample is shared by `split` groups.
    assert max(gpu.pipeline.placement.slot_split) == split
    contract = SamplesContract(gpu.layout)
    rng = np.random.default_rng(61 + split)
    for batch in (1, 37, 200):
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_samples(dense, keys))
        got = gpu.predict(parsed)
        np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        model.check(got, dense, keys)


COMPRESSED = {
    "fp16-dynamic": {"gpucacheper": 0.5, "storage_precision": "fp16"},
    "int8-tiny": {"gpucacheper": 0.01, "storage_precision": "int8"},
    "fp8-static": {"embedding_cache_type": "static", "fp8_quant": True},
    "int8-host": {"gpucache": False, "storage_precision": "int8"},
}


NEAR_FP32 = {"fp16": 2e-3, "int8": 2e-2, "fp8": 1e-1}  # bounds of the relative L2 change


@pytest.mark.parametrize("kind", COMPRESSED)
@pytest.mark.parametrize("as_bags", [False, True])
def test_compressed_tables_pool_their_quantised_rows(
    repo: Path, kind: str, as_bags: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables stored in fp16, int8 or fp8: the GPU pipeline (rows decoded in the pooling
    kernels, from the cache, the host tier in place, the staged misses, or static tables)
    scores what the NumPy path scores from the same quantised host tier; both stay near the
    FP32 model. The one-key tables' slots are copied as rows, or (``as_bags``) pooled as bags
    of a group of lanes each."""
    from hps_core.infer.gpu import placement as gpu_placement

    if as_bags:
        split = gpu_placement.pool_split
        monkeypatch.setattr(gpu_placement, "pool_split", lambda feed: max(split(feed), 1))
    model = ZooModel(repo, NAME)
    ps = json.loads((repo / NAME / "ps.json").read_text())
    ps["models"][0].update(COMPRESSED[kind])
    path = repo / NAME / f"ps_{kind}_bags{as_bags}.json"
    path.write_text(json.dumps(ps))
    gpu = RankingSession.open(path, NAME, device_id=0)
    cpu = RankingSession.open(path, NAME)
    fp32 = RankingSession.open(variant(repo, "host", "_fp32_" + kind), NAME)
    precision = kind.split("-")[0]
    assert {t.storage.value for t in gpu.lookup.model.tables} == {precision}
    samples, hugectr = SamplesContract(gpu.layout), HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(57)
    for batch in (1, 64, 200, 64):
        dense, keys = model.samples(rng, batch)
        parsed = samples.parse(*encode_samples(dense, keys))
        want = cpu.predict(parsed)
        for form in (parsed, hugectr.parse(*encode_hugectr(dense, keys)), on_gpu(parsed)):
            np.testing.assert_allclose(gpu.predict(form), want, rtol=1e-5, atol=1e-6)
        # Quantisation moves the scores a little, not a lot (benchmarks/storage_accuracy.py
        # measures how little: relative L2 4e-4, 6e-3 and 4e-2 on this model).
        exact = fp32.predict(parsed)
        assert np.linalg.norm(want - exact) <= NEAR_FP32[precision] * np.linalg.norm(exact)


@pytest.mark.parametrize("staged", ["timed", "whole", "too many keys"])
def test_large_batches_staged_whole_or_in_parts_equal_numpy(
    repo: Path, staged: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bucket that stages in parts (lowered here to 8 samples) times its host batches in
    parts against the same batches staged whole in a second bucket of its size, then keeps
    the faster (``timed``), or stages them whole (``whole``), or, with more keys than a trial
    is allowed (``too many keys``), always in parts: the scores equal the NumPy path's and,
    bit for bit, those of the batches in parts, in both batch forms."""
    from hps_core.infer.gpu import buckets
    from hps_core.infer.gpu import schedule as gpu_schedule

    monkeypatch.setattr(buckets, "_GROUPED_STAGING_SAMPLES", 8)
    monkeypatch.setattr(gpu_schedule, "_DENSE_BY_PART", False)  # the choice the trial waits for
    monkeypatch.setattr(gpu_schedule, "_SCHEDULE_TRIALS", 2)
    caplog.set_level(logging.INFO, logger="hps_core")
    model = ZooModel(repo, NAME)
    cpu = RankingSession.open(variant(repo, "dynamic"), NAME)
    scores = {}
    for setting in (True, {"timed": None, "whole": False, "too many keys": None}[staged]):
        monkeypatch.setattr(gpu_schedule, "_STAGED_IN_PARTS", setting)
        if staged == "too many keys":
            monkeypatch.setattr(gpu_schedule, "_PARTS_TRIAL_KEY_BYTES", 0)
        ps = variant(repo, "dynamic", f"_staged_{staged.replace(' ', '_')}{setting}")
        gpu = RankingSession.open(ps, NAME, device_id=0)
        contract = SamplesContract(gpu.layout)
        rng = np.random.default_rng(73)
        got = []
        for batch in (256,) * 12 + (100, 5):
            dense, keys = model.samples(rng, batch)
            parsed = contract.parse(*encode_samples(dense, keys))
            want = cpu.predict(parsed)
            got += [gpu.predict(parsed), gpu.predict(table_major(parsed))]
            for form in got[-2:]:
                np.testing.assert_allclose(form, want, rtol=1e-5, atol=1e-6)
        scores[setting] = got
    pipe = gpu.pipeline
    for a, b in zip(*scores.values(), strict=True):
        np.testing.assert_array_equal(a, b)
    if staged == "too many keys":
        assert not pipe._whole_buckets
        assert all(pipe._schedules.staging_trial(size) is None for size in (8, 128, 256))
        return
    assert 256 in pipe._whole_buckets
    assert not any(b.in_parts for b in pipe._whole_buckets.values())
    assert all(pipe._buckets[size].in_parts for size in pipe._whole_buckets)
    trial = pipe._schedules.staging_trial(256)
    assert trial is not None
    if staged == "whole":
        assert set(pipe._whole_buckets) == {8, 128, 256}  # batches of 5, 100 and 256
        assert trial.chosen is False and trial.times == ([], [])
        assert pipe._buckets[256].batches == 0  # made (and recorded), never run
    else:
        assert trial.chosen is not None and list(map(len, trial.times)) == [2, 2]
        chosen = "in parts" if trial.chosen else "whole"
        assert f"batch bucket 256 stages {chosen} (median" in caplog.text
