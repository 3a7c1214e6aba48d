"""TorchRec-shaped tables over the HPS (hps_core.hps_torchrec): EmbeddingBagCollection and
EmbeddingCollection answer as a NumPy float64 reference over the converted weights, on CPU
tensors, with hps_core.jagged's stand-ins for TorchRec's types (as where TorchRec is not
installed); then against TorchRec's own modules where TorchRec is installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hps_core import hps_torchrec  # noqa: E402
from hps_core.cli.main import main  # noqa: E402
from hps_core.errors import RequestError  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.jagged import _KeyedJaggedTensor  # noqa: E402

ROWS = {"t_user": 40, "t_item": 25, "t_seq": 30}
DIMS = {"t_user": 8, "t_item": 4, "t_seq": 16}


def _converted(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A TorchRec-named state dict of three tables, converted by hps convert torchrec."""
    torch.manual_seed(5)
    weights = {name: torch.randn(rows, DIMS[name]) for name, rows in ROWS.items()}
    state = {f"sparse.embedding_bags.{n}.weight": weights[n] for n in ("t_user", "t_item")}
    state["seq.embeddings.t_seq.weight"] = weights["t_seq"]
    torch.save(state, tmp_path / "model.pt")
    out = tmp_path / "out"
    assert main(["convert", "torchrec", "--state-dict", str(tmp_path / "model.pt"),
                 "--model-name", "rec", "--out", str(out)]) == 0  # fmt: skip
    return out / "ps.json", {n: w.numpy() for n, w in weights.items()}


def _features(rng: np.random.Generator, names: list[str], samples: int, rows: dict[str, int]):
    """A KeyedJaggedTensor of bags of 0-4 ids per sample (some beyond the table: unknown),
    and the bags as lists."""
    values, lengths, bags = [], [], {}
    for name in names:
        bags[name] = []
        for _ in range(samples):
            n = int(rng.integers(0, 5))
            ids = rng.integers(0, rows[name] + 3, n)
            bags[name].append(ids)
            values.extend(ids.tolist())
            lengths.append(n)
    kjt = _KeyedJaggedTensor.from_lengths_sync(
        keys=names, values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
    )  # fmt: skip
    return kjt, bags


def _rows(weight: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """float64 rows of ``ids``; 0.0 beyond the table (the converted ps.json's default)."""
    found = np.zeros((len(ids), weight.shape[1]))
    known = ids < len(weight)
    found[known] = weight[ids[known]]
    return found


def test_bag_collection_pools_each_feature_as_the_reference(tmp_path: Path) -> None:
    ps, weights = _converted(tmp_path)
    tables = [
        hps_torchrec.TableSpec("t_user", 8, ("user", "friend"), "sum"),  # two features
        hps_torchrec.TableSpec("t_item", 4, ("item",), "mean"),
    ]
    ebc = hps_torchrec.EmbeddingBagCollection(ps, "rec", tables)
    rows = {"user": ROWS["t_user"], "friend": ROWS["t_user"], "item": ROWS["t_item"]}
    rng = np.random.default_rng(0)
    for samples in (1, 7, 64):
        # The input's own order and an extra feature that no table reads.
        kjt, bags = _features(rng, ["item", "extra", "friend", "user"], samples,
                              rows | {"extra": 5})  # fmt: skip
        pooled = ebc(kjt)
        assert pooled.keys() == ["user", "friend", "item"]
        assert pooled.length_per_key() == [8, 8, 4]
        got = pooled.values()
        assert got.dtype == torch.float32 and tuple(got.shape) == (samples, 20)
        for feature, table, mean in (("user", "t_user", False), ("friend", "t_user", False),
                                     ("item", "t_item", True)):  # fmt: skip
            want = np.stack([
                (_rows(weights[table], b).mean(axis=0) if mean else
                 _rows(weights[table], b).sum(axis=0)) if len(b) else
                np.zeros(DIMS[table]) for b in bags[feature]
            ])  # fmt: skip
            np.testing.assert_allclose(pooled[feature].numpy(), want, rtol=1e-5, atol=1e-6)
    HPS.close_all()


def test_weighted_bags_and_sequences(tmp_path: Path) -> None:
    ps, weights = _converted(tmp_path)
    rng = np.random.default_rng(1)
    kjt, bags = _features(rng, ["user", "seq"], 9, {"user": 40, "seq": 30})
    scale = torch.from_numpy(rng.standard_normal(kjt.values().shape[0]).astype(np.float32))
    weighted = _KeyedJaggedTensor(["user", "seq"], kjt.values(), scale, lengths=kjt.lengths())
    ebc = hps_torchrec.EmbeddingBagCollection(
        ps, "rec", [hps_torchrec.TableSpec("t_user", 8, ("user",))], is_weighted=True
    )
    user = weighted["user"]
    w = user.weights_or_none().numpy().astype(np.float64)
    starts = user.offsets().numpy()
    want = np.stack([
        (_rows(weights["t_user"], b) * w[starts[i] : starts[i + 1], None]).sum(axis=0)
        for i, b in enumerate(bags["user"])
    ])  # fmt: skip
    np.testing.assert_allclose(ebc(weighted).values().numpy(), want, rtol=1e-5, atol=1e-6)

    seq_table = hps_torchrec.TableSpec("t_seq", 16, ("seq",))
    ec = hps_torchrec.EmbeddingCollection(ps, "rec", [seq_table])
    found = ec(kjt)
    assert list(found) == ["seq"]
    seq = found["seq"]
    np.testing.assert_array_equal(seq.lengths().numpy(), [len(b) for b in bags["seq"]])
    want = _rows(weights["t_seq"], np.concatenate(bags["seq"]))
    np.testing.assert_array_equal(seq.values().numpy(), want.astype(np.float32))
    HPS.close_all()


def test_what_does_not_fit_is_refused_by_name(tmp_path: Path) -> None:
    ps, _ = _converted(tmp_path)
    kjt, _ = _features(np.random.default_rng(2), ["user"], 3, {"user": 40})
    spec = hps_torchrec.TableSpec
    with pytest.raises(RequestError, match="table 't_nope' is not in model 'rec'"):
        hps_torchrec.EmbeddingBagCollection(ps, "rec", [spec("t_nope", 8, ("user",))])(kjt)
    with pytest.raises(RequestError, match="'t_user' is 6 wide here and 8 in"):
        hps_torchrec.EmbeddingBagCollection(ps, "rec", [spec("t_user", 6, ("user",))])(kjt)
    with pytest.raises(RequestError, match=r"features \['item'\] not in the input"):
        hps_torchrec.EmbeddingBagCollection(ps, "rec", [spec("t_item", 4, ("item",))])(kjt)
    with pytest.raises(ValueError, match="features in more than one table"):
        hps_torchrec.EmbeddingBagCollection(
            ps, "rec", [spec("t_user", 8, ("user",)), spec("t_item", 4, ("user",))]
        )
    with pytest.raises(ValueError, match="weighted bags pool by sum only"):
        hps_torchrec.EmbeddingBagCollection(
            ps, "rec", [spec("t_user", 8, ("user",), "mean")], is_weighted=True
        )
    floats = _KeyedJaggedTensor(["user"], kjt.values().float(), lengths=kjt.lengths())
    with pytest.raises(RequestError, match="feature ids must be int32 or int64"):
        hps_torchrec.EmbeddingBagCollection(ps, "rec", [spec("t_user", 8, ("user",))])(floats)
    HPS.close_all()


def _torchrec_tables(tmp_path: Path, *modules: torch.nn.Module) -> Path:
    """hps convert torchrec of the modules' tables (their state dicts under one prefix each)."""
    state = {}
    for i, module in enumerate(modules):
        state |= {f"m{i}.{k}": v for k, v in module.state_dict().items()}
    torch.save(state, tmp_path / "tables.pt")
    out = tmp_path / "converted"
    assert main(["convert", "torchrec", "--state-dict", str(tmp_path / "tables.pt"),
                 "--model-name", "rec", "--out", str(out)]) == 0  # fmt: skip
    return out / "ps.json"


def _torchrec_features(rng: np.random.Generator, tables, samples: int, weighted: bool = False):
    """A TorchRec KeyedJaggedTensor of bags of 0-5 known ids per sample of each feature."""
    from torchrec import KeyedJaggedTensor

    keys, values, lengths = [], [], []
    for table in tables:
        for name in table.feature_names:
            keys.append(name)
            for _ in range(samples):
                n = int(rng.integers(0, 6))
                values.extend(rng.integers(0, table.num_embeddings, n).tolist())
                lengths.append(n)
    weights = torch.from_numpy(rng.random(len(values), dtype=np.float32)) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int32), weights=weights,
    )  # fmt: skip


def test_torchrec_collections_are_swapped_for_the_hps_and_answer_alike(tmp_path: Path) -> None:
    torchrec = pytest.importorskip("torchrec")
    from torchrec import EmbeddingBagConfig, EmbeddingConfig, PoolingType

    torch.manual_seed(7)
    bag_tables = [
        EmbeddingBagConfig(name="t_a", embedding_dim=16, num_embeddings=100,
                           feature_names=["a", "a2"]),
        EmbeddingBagConfig(name="t_b", embedding_dim=8, num_embeddings=33, feature_names=["b"],
                           pooling=PoolingType.MEAN),
    ]  # fmt: skip
    weighted_tables = [EmbeddingBagConfig(name="t_w", embedding_dim=4, num_embeddings=20,
                                          feature_names=["w"])]  # fmt: skip
    seq_tables = [EmbeddingConfig(name="t_s", embedding_dim=12, num_embeddings=50,
                                  feature_names=["s"])]  # fmt: skip
    cpu = torch.device("cpu")
    ebc = torchrec.EmbeddingBagCollection(tables=bag_tables, device=cpu)
    wbc = torchrec.EmbeddingBagCollection(tables=weighted_tables, is_weighted=True, device=cpu)
    ec = torchrec.EmbeddingCollection(tables=seq_tables, device=cpu)
    ps = _torchrec_tables(tmp_path, ebc, wbc, ec)
    ours = [hps_torchrec.EmbeddingBagCollection.from_torchrec(ebc, ps, "rec"),
            hps_torchrec.EmbeddingBagCollection.from_torchrec(wbc, ps, "rec"),
            hps_torchrec.EmbeddingCollection.from_torchrec(ec, ps, "rec")]  # fmt: skip
    assert ours[1].is_weighted()
    rng = np.random.default_rng(3)
    with torch.no_grad():
        for samples in (1, 5, 128):
            kjt = _torchrec_features(rng, bag_tables, samples)
            want, got = ebc(kjt), ours[0](kjt)
            assert isinstance(got, torchrec.KeyedTensor) and got.keys() == want.keys()
            assert got.length_per_key() == want.length_per_key()
            torch.testing.assert_close(got.values(), want.values(), rtol=1e-5, atol=1e-6)
            kjt = _torchrec_features(rng, weighted_tables, samples, weighted=True)
            torch.testing.assert_close(ours[1](kjt).values(), wbc(kjt).values(), rtol=1e-5,
                                       atol=1e-6)  # fmt: skip
            kjt = _torchrec_features(rng, seq_tables, samples)
            want, got = ec(kjt), ours[2](kjt)
            assert list(got) == list(want) == ["s"]
            torch.testing.assert_close(got["s"].values(), want["s"].values())
            assert torch.equal(got["s"].lengths().long(), want["s"].lengths().long())
    HPS.close_all()


def test_torchrec_dlrm_dcn_with_the_hps_tables_predicts_as_with_its_own(tmp_path: Path) -> None:
    """TorchRec's DLRM_DCN (a small one of its shape), its EmbeddingBagCollection swapped."""
    torchrec = pytest.importorskip("torchrec")
    from torchrec import EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM_DCN

    torch.manual_seed(11)
    tables = [EmbeddingBagConfig(name=f"t_cat_{i}", embedding_dim=16, num_embeddings=rows,
                                 feature_names=[f"cat_{i}"])
              for i, rows in enumerate((1000, 40, 7, 300))]  # fmt: skip
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    model = DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=13,
                     dense_arch_layer_sizes=[32, 16], over_arch_layer_sizes=[32, 1],
                     dcn_num_layers=3, dcn_low_rank_dim=8).eval()  # fmt: skip
    ps = _torchrec_tables(tmp_path, ebc)
    rng = np.random.default_rng(4)
    dense = torch.from_numpy(rng.standard_normal((64, 13), dtype=np.float32))
    kjt = _torchrec_features(rng, tables, 64)
    with torch.no_grad():
        want = model(dense, kjt)
        arch = model.sparse_arch
        arch.embedding_bag_collection = hps_torchrec.EmbeddingBagCollection.from_torchrec(
            arch.embedding_bag_collection, ps, "rec"
        )
        got = model(dense, kjt)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    HPS.close_all()


def test_a_compiled_model_calls_the_collection_between_its_graphs(tmp_path: Path) -> None:
    """torch.compile does not trace into a collection's lookup (it runs between graphs): the
    compiled model answers as the eager one."""
    ps, _ = _converted(tmp_path)
    ebc = hps_torchrec.EmbeddingBagCollection(
        ps, "rec", [hps_torchrec.TableSpec("t_user", 8, ("user",)),
                    hps_torchrec.TableSpec("t_item", 4, ("item",), "mean")],
    )  # fmt: skip

    class Ranker(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tables, self.linear = ebc, torch.nn.Linear(12, 1)

        def forward(self, features) -> torch.Tensor:
            return torch.sigmoid(self.linear(self.tables(features).values()))

    model = Ranker().eval()
    compiled = torch.compile(model, backend="aot_eager")
    rng = np.random.default_rng(6)
    for samples in (3, 16):
        kjt, _ = _features(rng, ["user", "item"], samples, {"user": 40, "item": 25})
        with torch.no_grad():
            torch.testing.assert_close(compiled(kjt), model(kjt), rtol=0, atol=0)
    HPS.close_all()
