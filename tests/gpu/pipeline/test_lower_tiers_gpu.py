"""The GPU pipeline with tiers below the host tier: keys the GPU cannot answer go through the host.

The host tier holds 30% of each table (``initial_cache_rate``) and RocksDB all of it, so most
keys of a batch are found by neither the GPU cache nor the host tier: ``bank_probe`` lists
them, the host fetches them from RocksDB, ``bank_find`` stages them, ``bank_pool`` pools them
and ``bank_insert`` puts them in the cache. Scores must equal the NumPy path (which reads the
same cascade) and the independent references, for dynamic and static caches, host and device
batches, repeated batches (the second finds the rows in the cache), and large batches (staged
whole: the grouped staging is for models without lower tiers). A model without lower tiers
never probes.
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
from ranking_reference import encode_hugectr  # noqa: E402
from test_pipeline_gpu import on_gpu  # noqa: E402
from test_ranking_models import MODELS, Model  # noqa: E402

from hps_core.demo import DEMO_MODELS  # noqa: E402
from hps_core.errors import TierUnavailableError  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.infer import RankingSession  # noqa: E402
from hps_core.infer.contracts import HugeCTRContract  # noqa: E402
from hps_core.quant import RowFormat  # noqa: E402
from hps_core.triton_repo import InstanceGroup, ServingOptions  # noqa: E402

CACHES = {
    "dynamic": {"gpucacheper": 0.2},
    "static": {"embedding_cache_type": "static"},
    # Stored in int8: RocksDB's FP32 rows are quantised on the host before they go up.
    "int8-dynamic": {"gpucacheper": 0.2, "storage_precision": "int8"},
    # RocksDB holds the int8 rows themselves (store_compressed): they go up as stored.
    "int8-stored": {"gpucacheper": 0.2, "storage_precision": "int8", "store_compressed": True},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gpu_lower_tiers")
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    for name in MODELS:
        DEMO_MODELS[name](root, options)
    yield root
    HPS.close_all()


def tiered(repo: Path, name: str, cache: str, tmp: Path) -> Path:
    """The model's ps.json with 30% of each table in the host tier and all of it in RocksDB."""
    ps = json.loads((repo / name / "ps.json").read_text())
    model = ps["models"][0]
    settings = dict(CACHES[cache])
    compressed = settings.pop("store_compressed", False)
    model.update(settings, hit_rate_threshold=0.5)
    if "storage_precision" in model:  # W&D's wide table (dim 1) is smaller in FP32
        precision = model.pop("storage_precision")
        model["storage_precision_per_table"] = [
            precision if RowFormat(precision, dim).row_bytes < 4 * dim else "fp32"
            for dim in model["embedding_vecsize_per_table"]
        ]
    ps["volatile_db"] = {"type": "hash_map", "initial_cache_rate": 0.3}
    ps["persistent_db"] = {
        "type": "rocks_db", "path": str(tmp / "rocksdb"), "store_compressed": compressed,
    }  # fmt: skip
    path = repo / name / f"ps_lower_{cache}_{tmp.name}.json"
    path.write_text(json.dumps(ps))
    return path


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("name", MODELS)
def test_keys_below_the_host_tier_are_fetched_through_the_host(
    repo: Path, name: str, cache: str, tmp_path: Path
) -> None:
    ps = tiered(repo, name, cache, tmp_path)
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    cpu = RankingSession.open(ps, name)
    contract = HugeCTRContract(gpu.layout)
    bank = gpu.pipeline.bank
    fetched: list[int] = []  # keys asked of the lower tiers, per table and batch
    ask = bank.lookup_lower
    bank.lookup_lower = lambda position, keys: (fetched.append(len(keys)), ask(position, keys))[1]
    rng = np.random.default_rng(23)
    for batch in (1, 64, 200, 64):
        dense, keys = model.samples(rng, batch)
        parsed = contract.parse(*encode_hugectr(dense, keys))
        got = gpu.predict(parsed)
        np.testing.assert_allclose(got, cpu.predict(parsed), rtol=1e-5, atol=1e-6)
        if "storage_precision" not in CACHES[cache]:  # the references hold FP32 rows
            model.check(got, dense, keys)
        # Again, now partly from the cache, and handed over on the GPU.
        np.testing.assert_allclose(gpu.predict(on_gpu(parsed)), got, rtol=1e-6, atol=1e-7)
    assert gpu.pipeline._lower
    counters = gpu.lookup.counters()
    rocks_hits = sum(c.tier_rocks_db_hits for c in counters)
    if cache != "static":
        # Most keys live below the host tier: fetched, answered by RocksDB, then cached.
        assert sum(fetched) > 0 and rocks_hits > 0
        assert sum(c.inserted_keys for c in counters) > 0
    else:
        # A static table holds the whole table on the GPU: only keys no tier holds (the
        # unknown keys of DCN's and W&D's samples) are asked of the lower tiers, in vain.
        assert rocks_hits == 0


def test_a_model_without_lower_tiers_never_probes(repo: Path) -> None:
    name = "dcn"
    ps = json.loads((repo / name / "ps.json").read_text())
    path = repo / name / "ps_no_lower.json"
    path.write_text(json.dumps(ps))
    model = Model(repo, name)
    gpu = RankingSession.open(path, name, device_id=0)
    dense, keys = model.samples(np.random.default_rng(2), 32)
    parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
    model.check(gpu.predict(parsed), dense, keys)
    pipe = gpu.pipeline
    assert not pipe._lower and pipe._lower_tiers.extras is None
    assert all(b.pending is None for b in pipe._buckets.values())


def test_an_empty_update_overlay_costs_no_round_trip(repo: Path) -> None:
    """A model with online updates has the update overlay below its host tier; until updates
    bring a key the host tier lacks, no batch probes or waits for the host."""
    name = "dcn"
    ps = json.loads((repo / name / "ps.json").read_text())
    ps["update_source"] = {"type": "kafka_message_queue", "brokers": "127.0.0.1:9"}
    path = repo / name / "ps_overlay_only.json"
    path.write_text(json.dumps(ps))
    model = Model(repo, name)
    gpu = RankingSession.open(path, name, device_id=0)
    pipe = gpu.pipeline
    fetches: list[int] = []
    fetch = pipe._lower_tiers.fetch

    def counted(bucket, *state) -> None:
        fetches.append(bucket.layout.size)
        fetch(bucket, *state)

    pipe._lower_tiers.fetch = counted
    dense, keys = model.samples(np.random.default_rng(4), 48)
    parsed = HugeCTRContract(gpu.layout).parse(*encode_hugectr(dense, keys))
    model.check(gpu.predict(parsed), dense, keys)
    assert pipe._lower and not pipe.bank.lower_may_answer() and fetches == []


def test_a_lower_tier_that_cannot_answer_fails_its_batch_alone(repo: Path, tmp_path: Path) -> None:
    """A tier below the host tier that cannot answer (a Redis node down, nothing below that
    holds its rows) fails the batch with TierUnavailableError; the descriptors then no longer
    point at the last batch's freed extra rows, and the next batches score right."""
    name = "dcn"
    ps = tiered(repo, name, "dynamic", tmp_path)
    model = Model(repo, name)
    gpu = RankingSession.open(ps, name, device_id=0)
    contract = HugeCTRContract(gpu.layout)
    bank = gpu.pipeline.bank
    rng = np.random.default_rng(31)
    dense, keys = model.samples(rng, 64)
    model.check(gpu.predict(contract.parse(*encode_hugectr(dense, keys))), dense, keys)
    assert gpu.pipeline._lower_tiers.extras is not None  # this batch fetched rows below
    ask = bank.lookup_lower

    def down(position: int, keys: np.ndarray):
        raise TierUnavailableError("table dcn.t0: redis_cluster node 10.0.0.7:7001 down")

    bank.lookup_lower = down
    dense, keys = model.samples(rng, 64)
    parsed = contract.parse(*encode_hugectr(dense, keys))
    with pytest.raises(TierUnavailableError, match=r"10\.0\.0\.7:7001 down"):
        gpu.predict(parsed)
    bank.lookup_lower = ask
    model.check(gpu.predict(parsed), dense, keys)
    dense, keys = model.samples(rng, 200)
    model.check(gpu.predict(contract.parse(*encode_hugectr(dense, keys))), dense, keys)
