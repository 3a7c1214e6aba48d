"""Fuzzed model files: every reader answers a bad file with its own error type, never a crash.

Hypothesis mutates valid documents and files the way damage and mistakes do: a value replaced
by one of another type or an extreme number (huge sizes included), a key deleted, the text cut
at any byte, a binary file truncated or extended. The ps.json parser must answer with a
``ConfigError``, the network JSON parser and graph builder with a ``ConfigError`` (or, for a
layer type it cannot run, a ``NotAvailableError`` naming it), the dense and sparse file checks
with a ``ModelFileError`` (all ``HPSError``), or accept the document. No other exception
(``KeyError``, ``TypeError``, ``MemoryError``, ...) may escape, and nothing may be allocated
from a size read in a file before it is checked against the file's length.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ps_samples import REALISTIC_PS

from hps_core.config import load_ps_config, parse_ps_config
from hps_core.demo.zoo_networks import bst_network, din_network, mmoe_network
from hps_core.errors import ConfigError, HPSError, ModelFileError
from hps_core.formats.sparse import inspect_sparse_table
from hps_core.nn import build_graph, parse_network_json
from hps_core.nn.dense_blob import check_dense_blob_size, read_dense_blob

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))
from nn_testdata import graph_of

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

EXTREMES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 2**31, 2**63, 10**30, -(10**30), 1e308, -0.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a JSON document (dict keys and list indexes)."""
    found = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            found += paths(value, (*prefix, i))
    return found


def mutate(document: Any, data: st.DataObject) -> Any:
    """A copy of ``document`` with one value replaced, or one key or item removed."""
    document = copy.deepcopy(document)
    where = data.draw(st.sampled_from(paths(document)))
    parent = document
    for step in where[:-1]:
        parent = parent[step]
    if data.draw(st.booleans()):
        parent[where[-1]] = data.draw(EXTREMES)
    elif isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent.pop(where[-1])
    return document


@FUZZ
@given(data=st.data())
def test_ps_json_values_of_any_type(data: st.DataObject) -> None:
    document = mutate(REALISTIC_PS, data)
    try:
        parse_ps_config(document, "/srv/models/repo")
    except ConfigError as exc:
        assert str(exc)


@FUZZ
@given(cut=st.integers(0, len(json.dumps(REALISTIC_PS)) - 1))
def test_ps_json_cut_anywhere(tmp_path_factory: pytest.TempPathFactory, cut: int) -> None:
    path = tmp_path_factory.mktemp("ps") / "ps.json"
    path.write_text(json.dumps(REALISTIC_PS, indent=1)[:cut])
    with pytest.raises(ConfigError, match=r"ps\.json"):
        load_ps_config(path)


NETWORKS = {"din": din_network(), "bst": bst_network(), "mmoe": mmoe_network()}


@pytest.mark.parametrize("name", NETWORKS)
def test_network_json_values_of_any_type(name: str) -> None:
    @FUZZ
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        text = json.dumps(mutate(NETWORKS[name], data))
        try:
            graph = build_graph(parse_network_json(text, source=f"{name}.json"))
            graph.dense_layout()
        except HPSError as exc:  # ConfigError, or NotAvailableError for a type it cannot run
            assert f"{name}.json" in str(exc), str(exc)

    one()


@pytest.mark.parametrize("name", NETWORKS)
def test_network_json_cut_anywhere(name: str) -> None:
    text = json.dumps(NETWORKS[name], indent=1)

    @FUZZ
    @given(cut=st.integers(0, len(text) - 1))
    def one(cut: int) -> None:
        with pytest.raises(ConfigError, match=f"{name}.json"):
            build_graph(parse_network_json(text[:cut], source=f"{name}.json"))

    one()


def test_huge_declared_sizes_are_checked_before_anything_is_allocated(tmp_path: Path) -> None:
    """A layer declaring 10^12 outputs: the dense file's size check refuses the file before a
    single float is read (a read would need terabytes)."""
    graph = graph_of([{"type": "InnerProduct", "bottom": "dense", "top": "fc",
                       "fc_param": {"num_output": 10**12}}])  # fmt: skip
    layout = graph.dense_layout()
    blob = tmp_path / "dense.model"
    blob.write_bytes(np.zeros(64, np.float32).tobytes())
    with pytest.raises(ModelFileError, match="network needs"):
        read_dense_blob(blob, layout)


@pytest.fixture(scope="module")
def dense_case(tmp_path_factory: pytest.TempPathFactory):
    graph = build_graph(parse_network_json(json.dumps(NETWORKS["mmoe"]), source="mmoe.json"))
    layout = graph.dense_layout()
    return tmp_path_factory.mktemp("dense"), layout


@FUZZ
@given(change=st.integers(-(2**16), 2**16))
def test_dense_file_truncated_or_extended(dense_case, change: int) -> None:
    folder, layout = dense_case
    need = layout.total_floats * 4
    size = max(0, need + change)
    path = folder / "dense.model"
    path.write_bytes(bytes(size))
    if size == need:
        assert check_dense_blob_size(path, layout) == layout.total_floats
        return
    with pytest.raises(ModelFileError, match=r"dense\.model"):
        read_dense_blob(path, layout)


@FUZZ
@given(
    key_bytes=st.integers(0, 4096),
    vector_bytes=st.integers(0, 65536),
    dim=st.one_of(st.none(), st.integers(1, 64)),
)
def test_sparse_folder_of_any_sizes(
    tmp_path_factory: pytest.TempPathFactory, key_bytes: int, vector_bytes: int, dim: int | None
) -> None:
    folder = tmp_path_factory.mktemp("sparse")
    (folder / "key").write_bytes(bytes(key_bytes))
    (folder / "emb_vector").write_bytes(bytes(vector_bytes))
    try:
        info = inspect_sparse_table(folder, dim)
    except ModelFileError as exc:
        assert str(folder) in str(exc)
        return
    # Accepted: the sizes agree exactly.
    assert info.rows * 8 == key_bytes and info.rows * info.dim * 4 == vector_bytes
    assert dim is None or info.dim == dim
