"""The GPU ranking pipeline (``hps_core.infer.gpu``) against the NumPy path and the references.

The NumPy path (host tier lookups, ``pool_embeddings``, the dense network on NumPy) is the
pipeline's twin: on the same batches both must give the same scores, and both must equal the
independent references (PyTorch for the DLRM, float64 NumPy for DCN and W&D). Batches cover
multi-hot and empty slots, unknown keys, padded size buckets and repeated buckets (graph
replays), for each kind of table: a small dynamic cache (misses, inserts, evictions), a
static table, and no cache (host tier read in place).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from ranking_reference import encode_hugectr, encode_samples  # noqa: E402
from test_ranking_models import MODELS, Model  # noqa: E402

from hps_core.cache.layout import EMPTY_KEY  # noqa: E402
from hps_core.demo import DEMO_MODELS  # noqa: E402
from hps_core.errors import RequestError  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession, SparseBatch  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract, SamplesContract  # noqa: E402
from hps_core.infer.gpu.constants import POOL_ROWS  # noqa: E402
from hps_core.lookup import LookupOptions  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402

VARIANTS = {
    "dynamic": {"gpucacheper": 0.05},  # a small cache: misses, inserts and evictions
    "static": {"embedding_cache_type": "static"},
    "host": {"gpucache": False},
}
BATCHES = (1, 5, 64, 200, 256, 3)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gpu_pipeline")
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    for name in MODELS:
        DEMO_MODELS[name](root, options)
    yield root
    HPS.close_all()


def variant(repo: Path, name: str, kind: str, **extra: object) -> Path:
    """A copy of the model's ps.json (same folder, same files) with the variant's settings."""
    ps = json.loads((repo / name / "ps.json").read_text())
    ps["models"][0].update(VARIANTS[kind], **extra)
    tag = "_".join([kind, *(f"{k}{v}" for k, v in extra.items())])
    path = repo / name / f"ps_{tag}.json"
    path.write_text(json.dumps(ps))
    return path


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("name", MODELS)
def test_pipeline_equals_numpy_path_and_reference(repo: Path, name: str, kind: str) -> None:
    ps = variant(repo, name, kind)
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    cpu = RankingSession.open(ps, name)
    assert gpu.pipeline is not None and cpu.pipeline is None
    contract = HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(7)
    for batch in BATCHES:
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_hugectr(dense, keys))
        got = gpu.predict(parsed)
        assert isinstance(got, np.ndarray) and got.shape == (batch, gpu.layout.label_dim)
        np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        model.check(got, dense, keys)
    buckets = gpu.pipeline._buckets
    assert set(buckets) == {1, 4, 8, 64, 256}
    assert all(b.graphs is not None for b in buckets.values())
    assert buckets[256].batches == 2  # the second batch of 256 replayed the graphs


@pytest.mark.parametrize("name", MODELS)
def test_graphs_equal_eager_launches(repo: Path, name: str) -> None:
    ps = variant(repo, name, "dynamic")
    model = Model(repo, name)
    graphed = RankingSession.open(ps, name, device_id=0)
    eager = RankingSession.open(ps, name, device_id=0, graphs=False)
    contract = SamplesContract(graphed.layout)
    rng = np.random.default_rng(11)
    for batch in (1, 33, 128):
        dense, keys = model.samples(rng, batch, one_hot=True)
        parsed = contract.parse(*encode_samples(dense, keys))
        np.testing.assert_array_equal(graphed.predict(parsed), eager.predict(parsed))
    assert all(b.graphs is None for b in eager.pipeline._buckets.values())


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_reduced_precisions_agree_with_numpy(repo: Path, name: str, precision: str) -> None:
    ps = variant(repo, name, "dynamic")
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0, precision=precision)
    cpu = RankingSession.open(ps, name, precision=precision)
    contract = HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(5)
    # On probabilities: each side is within ~1e-4 (TF32) or ~1e-3 (FP16) of float64 (see
    # hps_core.nn.spec.precision); cuBLAS and the NumPy emulation round in different places.
    tolerance = 1e-3 if precision == "tf32" else 5e-3
    for batch in (1, 64, 256):
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_hugectr(dense, keys))
        np.testing.assert_allclose(gpu.predict(parsed), cpu.predict(parsed), atol=tolerance)


def test_counters_and_cache_contents(repo: Path) -> None:
    name = "dcn"
    ps = variant(repo, name, "dynamic", hit_rate_threshold=0.5)  # a session of its own
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    contract = HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(3)
    dense, keys = model.samples(rng, 256)
    parsed = contract.parse(*encode_hugectr(dense, keys))
    flat = parsed.keys[0]
    unknown = int(np.count_nonzero(~np.isin(flat, model.known[0])))
    first = gpu.predict(parsed)
    after_one = gpu.lookup.counters()[0]
    second = gpu.predict(parsed)
    after_two = gpu.lookup.counters()[0]
    np.testing.assert_array_equal(first, second)
    assert after_one.keys == len(flat) and after_two.keys == 2 * len(flat)
    assert after_one.cache_hits + after_one.cache_misses == after_one.keys
    assert after_one.unknown_keys == unknown and after_two.unknown_keys == 2 * unknown
    assert after_one.inserted_keys > 0
    # The second pass finds what the first inserted (minus what a full set evicted).
    assert after_two.cache_hits - after_one.cache_hits > after_one.cache_hits
    # Every cached row is the host tier's row of its key; no key is cached twice.
    table = gpu.lookup.table(0)
    state = table.cache.export_state()
    stored = state.keys.ravel()
    slots = np.flatnonzero(stored != EMPTY_KEY)
    assert len(np.unique(stored[slots])) == len(slots) > 0
    want, found = table.host.lookup(stored[slots])
    assert found.all()
    np.testing.assert_array_equal(state.values[slots], want)


def test_keys_beyond_the_per_sample_limit_take_a_larger_bucket(repo: Path) -> None:
    name = "dcn"
    ps = variant(repo, name, "host")
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    cpu = RankingSession.open(ps, name)
    rng = np.random.default_rng(1)
    # One sample whose first slot holds 200 keys (the ps.json allows 52 per sample).
    dense, keys = model.samples(rng, 1, one_hot=True)
    keys[0][0][0] = [int(k) for k in rng.choice(model.known[0], 200)]
    parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
    np.testing.assert_allclose(gpu.predict(parsed), cpu.predict(parsed), rtol=1e-5, atol=1e-6)
    model.check(gpu.predict(parsed), dense, keys)
    # 225 keys (200 + 25 one-hot slots) at 52 per sample need 5 samples' room: bucket 8.
    assert max(gpu.pipeline._buckets) == 8


@pytest.mark.parametrize("kind", VARIANTS)
def test_one_key_slots_copied_as_rows_or_pooled_as_bags_alike(
    repo: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&D's first table (2 slots, at most 2 keys a sample) is pooled as rows (a group of
    lanes per 8 samples of a slot; its plan's last segment): empty slots, unknown keys, groups
    of fewer than 8 samples, and a sample that puts both its keys in one slot (the group then
    pools its bags one by one) give what pooling them as bags (a group per bag) and the NumPy
    path give."""
    from hps_core.infer.gpu import placement as gpu_placement

    name = "wdl"
    ps = variant(repo, name, kind, hit_rate_threshold=0.25)  # sessions of their own
    model = Model(repo, name)
    rows = RankingSession.open(ps, name, device_id=0)
    plan = rows.pipeline.placement.pool_plan(0, 28)
    assert plan.segments == ((1, tuple(range(2, 28))), (POOL_ROWS, (0, 1)))
    cpu = RankingSession.open(ps, name)
    contract = HugeCTRContract(rows.layout)
    rng = np.random.default_rng(17)
    batches = []
    for batch in (3, 21, 64):
        dense, keys = model.samples(rng, batch)
        sample = keys[batch // 2]  # [table][slot] -> keys
        sample[0][0] = [int(k) for k in rng.choice(model.known[0], 2)]
        sample[0][1] = []
        batches.append((dense, keys))
    got = []
    for dense, keys in batches:
        parsed = contract.parse(*encode_hugectr(dense, keys))
        got.append(rows.predict(parsed))
        np.testing.assert_allclose(got[-1], cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        model.check(got[-1], dense, keys)
    split = gpu_placement.pool_split
    monkeypatch.setattr(gpu_placement, "pool_split", lambda feed: max(split(feed), 1))
    ps = variant(repo, name, kind, hit_rate_threshold=0.35)
    bags = RankingSession.open(ps, name, device_id=0)
    assert bags.pipeline.placement.pool_plan(0, 28).segments == ((1, tuple(range(28))),)
    for (dense, keys), want in zip(batches, got, strict=True):
        parsed = contract.parse(*encode_hugectr(dense, keys))
        np.testing.assert_array_equal(bags.predict(parsed), want)


def test_shared_caches(repo: Path) -> None:
    name = "dlrm"
    ps = variant(repo, name, "dynamic", hit_rate_threshold=0.5)  # a session of its own
    model = Model(repo, name)
    options = LookupOptions(share_caches=True, share_scope=f"pipeline-test-{os.getpid()}")
    gpu = RankingSession.open(ps, name, device_id=0, options=options)
    contract = SamplesContract(gpu.layout)
    rng = np.random.default_rng(13)
    for batch in (1, 100, 100):
        dense, keys = model.samples(rng, batch, one_hot=True)
        got = gpu.predict(contract.parse(*encode_samples(dense, keys)))
        model.check(got, dense, keys)
    assert gpu.lookup.shares_caches


def test_profile_times_every_step_and_changes_no_answer(repo: Path) -> None:
    name = "dcn"
    ps = variant(repo, name, "dynamic")
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    contract = HugeCTRContract(gpu.layout)
    dense, keys = model.samples(np.random.default_rng(21), 40)
    parsed = contract.parse(*encode_hugectr(dense, keys))
    steps = gpu.pipeline.profile(parsed)
    assert list(steps) == ["upload", "lookup", "insert", "forward", "download"]
    assert all(ms >= 0 for ms in steps.values()) and steps["forward"] > 0
    model.check(gpu.predict(parsed), dense, keys)


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_large_batches_staged_and_copied_in_groups(
    repo: Path, name: str, threaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets from _GROUPED_STAGING_SAMPLES on are copied and looked up group of tables by
    group (one lookup graph per group, each after its group's copy), filled by threads from
    _THREADED_STAGING_BYTES on (both lowered here so small batches take them); the same
    batch handed over on the GPU takes the grouped graphs too."""
    from hps_core.infer.gpu import buckets, schedule, uploads

    monkeypatch.setattr(buckets, "_GROUPED_STAGING_SAMPLES", 8)
    monkeypatch.setattr(uploads, "_THREADED_STAGING_BYTES", 0 if threaded else 1 << 62)
    # Scored whole, so that a batch on the GPU and on the host share products, bit for bit.
    monkeypatch.setattr(schedule, "_DENSE_BY_PART", False)
    ps = variant(repo, name, "dynamic")
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    cpu = RankingSession.open(ps, name)
    assert (
        1
        <= len(gpu.pipeline.placement.group_keys)
        <= min(len(gpu.pipeline.feeds), uploads.STAGING_GROUPS)
    )
    contract = HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(17 + threaded)
    for batch in (8, 200, 5, 256):
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_hugectr(dense, keys))
        got = gpu.predict(parsed)
        np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        model.check(got, dense, keys)
        np.testing.assert_array_equal(gpu.predict(on_gpu(parsed)), gpu.predict(parsed))
    pipe = gpu.pipeline
    assert all(
        len(b.graphs.lookups) == len(pipe.placement.group_slots) for b in pipe._buckets.values()
    )
    slots = [s for first, stop in pipe.placement.group_slots for s in range(first, stop)]
    assert slots == list(range(len(pipe.placement.slot_table)))  # every slot in exactly one group


def on_gpu(batch: SparseBatch, strided: bool = False) -> SparseBatch:
    """``batch`` as CuPy arrays; ``strided``: every array a view with a step (not contiguous)."""

    def put(array: np.ndarray) -> cupy.ndarray:
        if not strided:
            return cupy.asarray(array)
        doubled = cupy.asarray(np.repeat(array, 2, axis=0))
        return doubled[::2]

    if batch.sample_keys is not None and not strided:
        widths = [k.shape[1] for k in batch.keys]
        return SparseBatch.from_sample_keys(
            put(batch.dense), put(batch.sample_keys), widths, batch.hotness
        )
    return SparseBatch(
        put(batch.dense),
        tuple(put(k) for k in batch.keys),
        tuple(None if o is None else put(o) for o in batch.row_offsets),
        batch.hotness,
    )


@pytest.mark.parametrize("name", MODELS)
def test_batches_on_the_gpu_equal_host_batches(repo: Path, name: str) -> None:
    """CuPy batches (as lookup_fromdlpack takes keys) are copied in place on the device and
    score exactly as the same batch from the host, multi-hot and one-hot, in every bucket,
    from contiguous arrays (one memcpy each) and from strided views (CuPy copies)."""
    ps = variant(repo, name, "dynamic")
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    rng = np.random.default_rng(23)
    for batch, one_hot in ((1, False), (64, True), (200, False), (64, False), (5, True)):
        dense, keys = model.samples(rng, batch, one_hot=one_hot)
        if one_hot:
            parsed = SamplesContract(gpu.layout).parse(*encode_samples(dense, keys))
        else:
            parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
        got = gpu.predict(on_gpu(parsed))
        np.testing.assert_array_equal(got, gpu.predict(parsed))
        np.testing.assert_array_equal(gpu.predict(on_gpu(parsed, strided=True)), got)
        model.check(got, dense, keys)
    steps = gpu.pipeline.profile(on_gpu(parsed))
    assert list(steps) == ["upload", "lookup", "insert", "forward", "download"]


def test_batch_on_the_gpu_with_bad_offsets_stays_in_bounds(repo: Path) -> None:
    """Offsets of a device batch are not read back; out-of-range ones are clamped by the
    lookup, so the batch gets finite scores and the next batch is right."""
    name = "dcn"
    ps = variant(repo, name, "dynamic")
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    contract = HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(29)
    dense, keys = model.samples(rng, 64)
    parsed = contract.parse(*encode_hugectr(dense, keys))
    table = next(t for t, o in enumerate(parsed.row_offsets) if o is not None)
    bad = parsed.row_offsets[table].copy()
    bad[1], bad[2], bad[-1] = 10**9, -5, 2**31 - 1
    offsets = list(parsed.row_offsets)
    offsets[table] = bad
    broken = SparseBatch(parsed.dense, parsed.keys, tuple(offsets))
    assert np.isfinite(gpu.predict(on_gpu(broken))).all()
    model.check(gpu.predict(on_gpu(parsed)), dense, keys)


def test_batch_split_between_host_and_gpu_is_refused(repo: Path) -> None:
    name = "dcn"
    gpu = RankingSession.open(variant(repo, name, "dynamic"), name, device_id=0)
    dense, keys = Model(repo, name).samples(np.random.default_rng(31), 4)
    parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
    mixed = SparseBatch(cupy.asarray(parsed.dense), parsed.keys, parsed.row_offsets)
    with pytest.raises(RequestError, match="every array on the GPU"):
        gpu.predict(mixed)
