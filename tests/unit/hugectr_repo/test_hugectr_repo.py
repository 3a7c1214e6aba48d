"""A repository written for HugeCTR's hps and hugectr backends, translated for this project's
(``hps_core.hugectr_repo``): what is carried over, what is applied as HugeCTR applies it, what
is refused as HugeCTR refuses it, and that the user's files are never touched."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hugectr_repository import HugeCTRRepository, digest, write_hugectr_repository
from tritonclient.grpc import model_config_pb2 as pb

from hps_core.config import load_ps_config
from hps_core.errors import ConfigError
from hps_core.hugectr_repo import hugectr_models, split_backend_configs, translate_repository
from hps_core.infer.model_io import EMBEDDING_IO, HUGECTR_IO
from hps_core.triton_repo import read_config, write_config


@pytest.fixture
def hugectr(tmp_path: Path) -> HugeCTRRepository:
    return write_hugectr_repository(tmp_path)


def translate(hugectr: HugeCTRRepository, out: Path, gpu: bool = False) -> list[str]:
    ps = {"hps": hugectr.hps_ps, "hugectr": hugectr.hugectr_ps}
    return translate_repository(hugectr.repo, ps, out, gpu=gpu)


def test_backend_configs_are_taken_out_of_the_servers_options(tmp_path: Path) -> None:
    args = [
        "--backend-config=hps,ps=a.json", "--log-info=true", "--backend-config",
        "hugectr,ps=/b.json", "--backend-config=python,shm-default-byte-size=1024",
    ]  # fmt: skip
    found, rest = split_backend_configs(args)
    assert found == {"hps": Path("a.json").resolve(), "hugectr": Path("/b.json")}
    assert rest == ["--log-info=true", "--backend-config=python,shm-default-byte-size=1024"]


def test_models_of_hugectrs_backends_are_found(hugectr: HugeCTRRepository) -> None:
    assert hugectr_models(hugectr.repo) == {"dlrm": "hugectr", "hps_embedding": "hps"}


def test_translation_serves_the_same_contracts_and_leaves_the_repository_as_it_was(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    before = digest(hugectr.repo)
    notes = translate(hugectr, tmp_path / "out")
    assert digest(hugectr.repo) == before
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["dlrm", "hps_embedding"]
    for name, io in (("hps_embedding", EMBEDDING_IO), ("dlrm", HUGECTR_IO)):
        config = read_config(out / name / "config.pbtxt")
        assert config.backend == "python" and config.max_batch_size == 16
        assert [i.name for i in config.input] == [t.name for t in io.inputs]
        assert [o.name for o in config.output] == [t.name for t in io.outputs]
        # No GPU here: the user's KIND_GPU instances run on the CPU, and that is said.
        assert [g.kind for g in config.instance_group] == [config.instance_group[0].KIND_CPU]
        assert (out / name / "1" / "model.py").is_file()
        assert any(f"model '{name}'" in n and "run as KIND_CPU" in n for n in notes)
    emb = read_config(out / "hps_embedding" / "config.pbtxt")
    assert list(emb.version_policy.specific.versions) == [1]  # carried over
    # The network named by the hugectr config.pbtxt's 'config' is the translated ps.json's.
    served = load_ps_config(out / "dlrm" / "ps.json").model("dlrm")
    assert served.network_file == hugectr.network
    # The hps backend reads none of the parameters HugeCTR's older docs put in its config.
    unread = [n for n in notes if "hps_embedding" in n and "not read by HugeCTR's hps" in n]
    assert len(unread) == 1 and unread[0].endswith("embeddingkey_long_type, gpucache, gpucacheper")


def test_a_gpu_keeps_the_users_placement(hugectr: HugeCTRRepository, tmp_path: Path) -> None:
    notes = translate(hugectr, tmp_path / "out", gpu=True)
    config = read_config(tmp_path / "out" / "dlrm" / "config.pbtxt")
    assert [(g.kind, list(g.gpus)) for g in config.instance_group] == [
        (config.instance_group[0].KIND_GPU, [0])
    ]
    assert not any("KIND_CPU" in n for n in notes)


def test_hugectr_parameters_apply_over_the_ps_json(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    path = hugectr.repo / "dlrm" / "config.pbtxt"
    added = (
        '{ key: "mixed_precision" value: { string_value: "true" } },\n'
        '{ key: "refresh_interval" value: { string_value: "30" } },\n'
    )
    text = (
        path.read_text().replace('"0.2"', '"0.1"').replace("parameters [", "parameters [" + added)
    )
    long_keys = 'key: "embeddingkey_long_type" value: { string_value: "true" }'
    path.write_text(text.replace(long_keys, long_keys.replace("true", "false")))
    notes = translate(hugectr, tmp_path / "out")
    served = load_ps_config(tmp_path / "out" / "dlrm" / "ps.json").model("dlrm")
    assert served.gpucacheper == 0.1 and served.refresh_interval == 30
    config = read_config(tmp_path / "out" / "dlrm" / "config.pbtxt")
    assert config.parameters["precision"].string_value == "fp16"
    # 32-bit keys, as HugeCTR's backend reads them: UINT32 CATCOLUMN, a 4-byte key model.
    assert (
        "model 'dlrm' (backend hugectr): 32-bit keys: CATCOLUMN is UINT32, as in HugeCTR's "
        "backend" in notes
    )
    catcolumn = next(i for i in config.input if i.name == "CATCOLUMN")
    assert pb.DataType.Name(catcolumn.data_type) == "TYPE_UINT32"
    assert load_ps_config(tmp_path / "out" / "dlrm" / "ps.json").supportlonglong is False


@pytest.mark.parametrize(
    ("values", "served", "precision", "note"),
    [
        ({"freeze_sparse": "True", "refresh_interval": "20.0", "label_dim": "1.0"},
         {"refresh_interval": 20}, None, None),
        ({"freeze_sparse": "1", "refresh_interval": "0.5", "mixed_precision": "0"},
         {"refresh_interval": 1}, "fp32", "refresh_interval 0.5 runs every 1 s here"),
        ({"embeddingkey_long_type": "0", "mixed_precision": "TRUE"},
         {}, "fp16", "32-bit keys: CATCOLUMN is UINT32"),
    ],
)  # fmt: skip
def test_parameters_are_read_as_hugectrs_backends_read_them(
    hugectr: HugeCTRRepository, tmp_path: Path, values, served, precision, note
) -> None:
    """Booleans in any case or as integers, integers written as floats (triton_helpers.cpp)."""
    path = hugectr.repo / "dlrm" / "config.pbtxt"
    config = read_config(path)
    for key, value in values.items():
        config.parameters[key].string_value = value
    write_config(path, config)
    notes = translate(hugectr, tmp_path / "out")
    written = read_config(tmp_path / "out" / "dlrm" / "config.pbtxt")
    model = load_ps_config(tmp_path / "out" / "dlrm" / "ps.json").model("dlrm")
    assert all(getattr(model, key) == value for key, value in served.items())
    got = (
        written.parameters["precision"].string_value if "precision" in written.parameters else None
    )
    assert got == precision
    if "freeze_sparse" in values:
        assert written.parameters["freeze_sparse"].string_value == "true"
    assert note is None or any(note in n for n in notes), notes


def test_sizing_parameters_that_disagree_with_the_network_are_named(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    """The network decides a sample's widths: a width that differs, or a bound below what
    the network takes, is named; a bound above it (HugeCTR's samples write max_nnz 2 for
    one-hot models) and agreeing widths are not."""
    path = hugectr.repo / "dlrm" / "config.pbtxt"
    text = path.read_text()
    for key, value in (("label_dim", "3"), ("embedding_vector_size", "8"), ("max_nnz", "9")):
        text = re.sub(rf'("{key}" value: {{ string_value: )"\w+"', rf'\1"{value}"', text)
    path.write_text(text)
    notes = [n for n in translate(hugectr, tmp_path / "out") if "is not honoured" in n]
    assert len(notes) == 2, notes
    assert notes[0].startswith("model 'dlrm' (backend hugectr): label_dim 3 is not honoured")
    assert "the network file takes 1 prediction per sample and decides it" in notes[0]
    assert "embedding_vector_size 8 is not honoured: the network file takes 16 floats" in notes[1]
    served = load_ps_config(tmp_path / "out" / "dlrm" / "ps.json").model("dlrm")
    assert served.label_dim == 1  # the ps.json's, as HugeCTR's parser leaves it


@pytest.mark.parametrize(
    "edit, words",
    [
        (('"0.2"', '"0.5"'), ["gpucacheper", "0.5 is more than the ps.json's 0.2"]),
        (
            ('"gpucache" value: { string_value: "true"', '"gpucache" value: { string_value: "0"'),
            ["gpucache", "disagrees with the ps.json's gpucache"],
        ),
    ],
)  # fmt: skip
def test_settings_hugectr_refuses_are_refused_naming_the_file(
    hugectr: HugeCTRRepository, tmp_path: Path, edit: tuple[str, str], words: list[str]
) -> None:
    path = hugectr.repo / "dlrm" / "config.pbtxt"
    path.write_text(path.read_text().replace(*edit))
    with pytest.raises(ConfigError) as info:
        translate(hugectr, tmp_path / "out")
    message = str(info.value)
    assert str(path) in message and all(w in message for w in words), message


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gpucacheper", "abc", "'abc' is not a number"),
        ("label_dim", "1.5", "'1.5' is not an integer"),
        ("freeze_sparse", "yes please", "'yes please' is not true, false or an integer"),
    ],
)
def test_a_parameter_that_does_not_read_is_named(
    hugectr: HugeCTRRepository, tmp_path: Path, key: str, value: str, message: str
) -> None:
    path = hugectr.repo / "dlrm" / "config.pbtxt"
    config = read_config(path)
    config.parameters[key].string_value = value
    write_config(path, config)
    with pytest.raises(ConfigError) as info:
        translate(hugectr, tmp_path / "out")
    assert str(info.value) == f"{path} parameters.{key}: {message}"


def test_cache_settings_above_the_ps_json_pass_where_the_cache_is_off(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    """HugeCTR compares gpucacheper and hit_rate_threshold with the ps.json's only with
    gpucache on."""
    document = json.loads(hugectr.hugectr_ps.read_text())
    document["models"][0]["gpucache"] = False
    hugectr.hugectr_ps.write_text(json.dumps(document))
    path = hugectr.repo / "dlrm" / "config.pbtxt"
    config = read_config(path)
    config.parameters["gpucache"].string_value = "false"
    config.parameters["gpucacheper"].string_value = "0.5"
    write_config(path, config)
    translate(hugectr, tmp_path / "out")
    assert load_ps_config(tmp_path / "out" / "dlrm" / "ps.json").model("dlrm").gpucacheper == 0.5


def test_a_broken_ps_json_is_named_among_the_two_backends(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    document = json.loads(hugectr.hugectr_ps.read_text())
    document["models"][0]["embedding_vecsize_per_table"][0] = "sixteen"
    hugectr.hugectr_ps.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as info:
        translate(hugectr, tmp_path / "out")
    [problem] = info.value.problems
    assert problem.where == f"{hugectr.hugectr_ps}: models[0].embedding_vecsize_per_table[0]"


def test_a_backend_without_its_ps_json_says_how_to_give_it(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"--backend-config=hugectr,ps=PS.json"):
        translate_repository(hugectr.repo, {"hps": hugectr.hps_ps}, tmp_path / "out")


def test_models_of_other_backends_are_linked_unchanged(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    other = hugectr.repo / "ranker"
    (other / "1").mkdir(parents=True)
    (other / "config.pbtxt").write_text('name: "ranker"\nbackend: "onnxruntime"\n')
    translate(hugectr, tmp_path / "out")
    linked = tmp_path / "out" / "ranker"
    assert linked.is_symlink() and linked.resolve() == other.resolve()


def test_an_unbatched_model_stays_unbatched_with_the_users_shapes(
    hugectr: HugeCTRRepository, tmp_path: Path
) -> None:
    """max_batch_size 0 (HugeCTR's HPS ensemble sample): no batching, the user's dims, a
    warm-up request of the same rank (Triton checks it at load)."""
    path = hugectr.repo / "hps_embedding" / "config.pbtxt"
    config = read_config(path)
    config.max_batch_size = 0
    for tensor in config.input:
        tensor.dims[:] = [-1, -1]
    write_config(path, config)
    translate(hugectr, tmp_path / "out")
    written = read_config(tmp_path / "out" / "hps_embedding" / "config.pbtxt")
    assert written.max_batch_size == 0 and not written.HasField("dynamic_batching")
    assert [list(t.dims) for t in written.input] == [[-1, -1], [-1, -1]]
    assert not any(t.allow_ragged_batch for t in written.input)
    assert [list(t.dims) for t in written.output] == [[-1]]
    (warmup,) = written.model_warmup
    assert {name: list(e.dims) for name, e in warmup.inputs.items()} == {
        "KEYS": [1, 2],
        "NUMKEYS": [1, 2],
    }
