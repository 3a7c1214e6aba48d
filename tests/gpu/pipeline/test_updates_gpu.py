"""Online updates reach the GPU pipeline's caches (``hps_core.updates.apply``).

A demo ranking model served by ``RankingSession.open(ps, name, device_id=0)`` with an update
source in its ps.json (its tables open as cascades: a writable shared tier and the update
overlay). After warm-up batches have filled the GPU cache, one update message per table
changes rows the batch uses (existing keys) and adds keys the files lack; the batch is then
rewritten to use the new keys too. The next predictions must equal the NumPy path given the
same update (another process's view: its own updater, the same shared segment), differ from
the scores before the update, and the updated rows must be in the GPU cache with their new
values (dynamic cache: rows it held overwritten, nothing inserted by the update; static
table: rows overwritten in GPU memory, new keys answered through the overlay). No Kafka here:
the updater is called as the consumer would call it.

Tables stored compressed (fp16, int8) get the update quantised once: the GPU cache, the shared
tier and the NumPy path all answer the reference quantiser's rows (tests/quant_reference.py)
of the message's FP32 vectors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "infer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_reference import reference_decoded  # noqa: E402
from ranking_reference import encode_hugectr  # noqa: E402
from test_ranking_models import Model  # noqa: E402

from hps_core.demo import DEMO_MODELS  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession, SparseBatch  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract  # noqa: E402
from hps_core.lookup.table_lookup import CachedTableLookup  # noqa: E402
from hps_core.quant import RowFormat  # noqa: E402
from hps_core.tiers.backing import table_tag  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402
from hps_core.updates.apply import ModelUpdater  # noqa: E402

NAME = "dcn"
CACHES = {
    "dynamic": {"gpucacheper": 0.5},
    "static": {"embedding_cache_type": "static"},
}
NEW_KEY_BASE = 7 * 10**15  # far from every demo key


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gpu_updates")
    DEMO_MODELS[NAME](root, ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),)))
    yield root
    HPS.close_all()


def with_updates(repo: Path, cache: str, precision: str) -> Path:
    ps = json.loads((repo / NAME / "ps.json").read_text())
    ps["models"][0].update(CACHES[cache])
    ps["models"][0]["storage_precision"] = precision
    # Never reached: the test applies messages itself, no consumer is started.
    ps["update_source"] = {"type": "kafka_message_queue", "brokers": "127.0.0.1:9"}
    path = repo / NAME / f"ps_updates_{cache}_{precision}.json"
    path.write_text(json.dumps(ps))
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("cache", CACHES)
def test_updates_reach_the_gpu_cache_and_the_next_predictions(
    repo: Path, cache: str, precision: str
) -> None:
    ps = with_updates(repo, cache, precision)
    model = Model(repo, NAME)
    gpu = RankingSession.open(ps, NAME, device_id=0)
    cpu = RankingSession.open(ps, NAME)
    contract = HugeCTRContract(gpu.layout)
    rng = np.random.default_rng(5)
    dense, keys = model.samples(rng, 64)
    # Vectors of the update differ per variant: the variants share the host tier's segment,
    # and an update of the same rows with the same values would change nothing.
    vector_rng = np.random.default_rng(list(CACHES).index(cache) + 100)
    formats = [RowFormat(precision, table.dim) for table in gpu.lookup.model.tables]
    batch = contract.parse(*encode_hugectr(dense, keys))
    for _ in range(3):  # warm-up: the batch's rows are in the GPU cache afterwards
        before = gpu.predict(batch)
    np.testing.assert_allclose(before, cpu.predict(batch), rtol=1e-5, atol=1e-6)
    assert gpu.pipeline.bank is not None and gpu.pipeline._lower  # the overlay is below

    updaters = [ModelUpdater(gpu.lookup), ModelUpdater(cpu.lookup)]  # two instances' view
    new_rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    cached_before: dict[int, np.ndarray] = {}  # which changed keys the cache held
    new_batch_keys = []
    for t, table in enumerate(gpu.lookup.model.tables):
        used = np.unique(batch.keys[t])
        held = used[gpu.lookup.table(t).host.shared.find(used) >= 0]  # not the unknown keys
        changed = held[: max(1, len(held) // 2)]
        with cupy.cuda.Device(0), gpu.lookup.cache_section():
            cached_before[t] = gpu.lookup.table(t).cache.query(cupy.asarray(changed))[1].get()
        added = NEW_KEY_BASE + t * 1000 + np.arange(8, dtype=np.int64)
        message_keys = np.concatenate([changed, added])
        vectors = vector_rng.uniform(-2, 2, (len(message_keys), table.dim)).astype(np.float32)
        for updater in updaters:
            updater.apply(table_tag(NAME, table.name), message_keys, vectors)
        new_rows[t] = (message_keys, vectors)
        # The batch now also uses the new keys (in place of some of its other keys).
        rewritten = batch.keys[t].copy()
        rewritten[-len(added) :] = added[: len(rewritten[-len(added) :])]
        new_batch_keys.append(rewritten)
    updated = SparseBatch(batch.dense, tuple(new_batch_keys), batch.row_offsets)

    # The cached rows of the changed keys hold the new values now.
    for t, (message_keys, vectors) in new_rows.items():
        lookup = gpu.lookup.table(t)
        assert isinstance(lookup, CachedTableLookup)
        existing = len(message_keys) - 8
        with cupy.cuda.Device(0), gpu.lookup.cache_section():
            got, hit = lookup.cache.query(cupy.asarray(message_keys))
            got, hit = got.get(), hit.get()
        # Rows cached before the update are still cached, overwritten in place; the update
        # inserts nothing (a dynamic cache need not have held every row of the batch).
        was = cached_before[t]
        assert was.any() and (hit[:existing] == was).all()
        assert not hit[existing:].any()
        quantised = reference_decoded(formats[t], vectors)
        np.testing.assert_array_equal(got[:existing][was], quantised[:existing][was])
        # The shared tier holds the same quantised rows (the NumPy path reads them).
        shared = lookup.host.shared
        np.testing.assert_array_equal(
            shared.read_rows(shared.find(message_keys[:existing])), quantised[:existing]
        )

    after = gpu.predict(batch)
    np.testing.assert_allclose(after, cpu.predict(batch), rtol=1e-5, atol=1e-6)
    assert not np.allclose(after, before)  # the new rows were used
    with_new = gpu.predict(updated)  # new keys: through the overlay (lower tiers' path)
    np.testing.assert_allclose(with_new, cpu.predict(updated), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gpu.predict(updated), with_new, rtol=1e-6, atol=1e-7)
    counters = gpu.lookup.counters()
    assert sum(c.tier_overlay_hits for c in counters) > 0
    for updater in updaters:
        assert updater.stats.failed == 0
        updater.flush()  # the settling pass writes the same rows again: still equal
        updater.close()
    np.testing.assert_allclose(gpu.predict(batch), after, rtol=1e-6, atol=1e-7)
    HPS.close_all()
