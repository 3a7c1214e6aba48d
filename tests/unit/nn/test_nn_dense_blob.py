"""The dense model file: round trip, and size errors that name the layer where it goes wrong."""

from __future__ import annotations

import numpy as np
import pytest
from network_files import OWN, hugectr, network_id, requires_hugectr
from nn_testdata import FIXTURES, flat, graph_of

from hps_core.errors import ModelFileError
from hps_core.nn import (
    build_graph,
    check_dense_blob_size,
    load_network_json,
    random_dense_params,
    read_dense_blob,
    write_dense_blob,
)


def layout_of(path):
    return build_graph(load_network_json(path)).dense_layout()


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_round_trip_is_raw_little_endian_float32(tmp_path, path):
    layout = layout_of(path)
    params = random_dense_params(layout, seed=5)
    blob = tmp_path / "dense.model"
    assert write_dense_blob(params, blob) == layout.total_floats
    raw = blob.read_bytes()
    assert raw == flat(params).astype("<f4").tobytes()
    back = read_dense_blob(blob, layout)
    assert list(back) == [layer.layer for layer in layout.layers]
    for name, tensors in params.items():
        for expected, got in zip(tensors, back[name], strict=True):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, expected)
    write_dense_blob(back, tmp_path / "again.model")
    assert (tmp_path / "again.model").read_bytes() == raw


@pytest.fixture(
    params=[OWN["dcn"], pytest.param(hugectr("dcn_inference.json"), marks=requires_hugectr)],
    ids=network_id,
)
def dcn(request, tmp_path):
    """A DCN's dense layout, its spec and a dense file of random parameters for it."""
    spec = load_network_json(request.param)
    layout = build_graph(spec).dense_layout()
    blob = tmp_path / "dcn_dense.model"
    write_dense_blob(random_dense_params(layout), blob)
    return layout, blob, spec


def test_short_file_names_the_layer_where_it_ends(dcn):
    layout, blob, spec = dcn
    sizes = {layer.layer: layer.size for layer in layout.layers}
    *_, target, before_last, last = (layer.layer for layer in layout.layers)
    floats = np.fromfile(blob, dtype="<f4")
    cut = layout.total_floats - sizes[last] - sizes[before_last] - 5
    floats[:cut].tofile(blob)
    with pytest.raises(ModelFileError) as info:
        check_dense_blob_size(blob, layout)
    message = str(info.value)
    assert f"has {cut} floats, the network needs {layout.total_floats}" in message
    layer = next(layer for layer in spec.layers if layer.name == target)
    where = f"{spec.source}:{layer.line} layers[{layer.index}] '{target}'"
    expected = f"expected {sizes[target]} floats there, found {sizes[target] - 5}"
    assert f"inside layer '{target}' ({layer.type}, " in message
    assert f"{where}): {expected}" in message
    with pytest.raises(ModelFileError, match=f"inside layer '{target}'"):
        read_dense_blob(blob, layout)


def test_long_file_reports_the_extra_floats(dcn):
    layout, blob, _ = dcn
    last = layout.layers[-1].layer
    with blob.open("ab") as f:
        f.write(np.zeros(3, dtype="<f4").tobytes())
    left_over = f"3 floats are left over after the last layer '{last}'"
    with pytest.raises(ModelFileError, match=left_over):
        read_dense_blob(blob, layout)


def test_partial_float_and_missing_file(dcn, tmp_path):
    layout, blob, _ = dcn
    with blob.open("ab") as f:
        f.write(b"\x00")
    with pytest.raises(ModelFileError, match="not a whole number of float32 values"):
        check_dense_blob_size(blob, layout)
    with pytest.raises(ModelFileError, match="cannot read dense model file"):
        read_dense_blob(tmp_path / "missing.model", layout)


def test_random_params_are_scaled_by_fan_in():
    fc = {"name": "fc", "type": "InnerProduct", "bottom": "dense", "top": "fc",
          "fc_param": {"num_output": 1024}}  # fmt: skip
    layout = graph_of([fc], dense_dim=1024, sparse=()).dense_layout()
    params = random_dense_params(layout, seed=3)
    weight = params["fc"][0]
    assert weight.shape == (1024, 1024) and weight.dtype == np.float32
    assert abs(weight.std() * np.sqrt(1024) - 1.0) < 0.02


@requires_hugectr
def test_random_params_of_hugectrs_dlrm_are_scaled_by_fan_in():
    layout = layout_of(hugectr("dlrm_1gpu.json"))
    params = random_dense_params(layout, seed=3)
    weight = params["fc5"][0]
    assert weight.shape == (1024, 1024) and weight.dtype == np.float32
    assert abs(weight.std() * np.sqrt(1024) - 1.0) < 0.02
