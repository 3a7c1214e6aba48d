"""HugeCTR's own DLRM files in its FP16 training form, and its DIN test file.

Five DLRM files of HugeCTR v24.06 (``test/scripts/dlrm_fp16_*.json``, the MLPerf one,
``dlrm_set_source.json``) give the ``Interaction`` layer a second top (``interaction_grad``,
the buffer its backward pass fills) that the top ``MLP`` lists as its second bottom. At
inference that top is never read: each file loads and computes what the independent float64
interpreter computes. HugeCTR's ``din_fp32_1gpu.json`` defines the top ``reduce_item_his``
twice (a ``ReduceMean`` and a ``Reshape`` of that name) and reads a tensor no layer writes;
HugeCTR's own loader (``Model::add``, ``src/pybind/model_compile.cpp``) refuses it with
"reduce_item_his, top tensor name already exists", and so does this one, naming the layer,
the line and the missing tensor. The files are read from ``HPS_HUGECTR_NETWORKS`` (or
``../shared/fixtures/hugectr``) where they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from network_files import HUGECTR_DIN, HUGECTR_DLRM, network_id, requires_hugectr_dlrm
from nn_reference import network_forward
from nn_testdata import graph_inputs

from hps_core.errors import ConfigError
from hps_core.nn import (
    DenseExecutor,
    build_graph,
    load_network_json,
    random_dense_params,
    write_dense_blob,
)


@requires_hugectr_dlrm
@pytest.mark.parametrize("path", HUGECTR_DLRM, ids=network_id)
def test_fp16_training_form_dlrm_predicts_the_reference(path: Path, tmp_path: Path) -> None:
    graph = build_graph(load_network_json(path))
    interaction = next(n for n in graph.nodes if n.spec.type == "Interaction")
    assert len(interaction.spec.tops) == 2  # the training form's gradient buffer
    dense_file = tmp_path / "dense.model"
    flat = write_dense_blob(random_dense_params(graph.dense_layout(), seed=5), dense_file)
    assert flat > 0
    executor = DenseExecutor.from_files(path, dense_file)
    for batch in (1, 9):
        dense, pooled = graph_inputs(graph, batch, np.random.default_rng(batch))
        want = network_forward(path, np.fromfile(dense_file, np.float32), dense, pooled)
        np.testing.assert_allclose(executor.forward(dense, pooled), want, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HUGECTR_DIN.is_file(), reason=f"{HUGECTR_DIN} is not there")
def test_din_test_file_is_refused_as_hugectr_refuses_it() -> None:
    with pytest.raises(ConfigError) as info:
        build_graph(load_network_json(HUGECTR_DIN))
    message = str(info.value)
    assert "'reduce_item_his' is already produced by layer 'reduce_item_his'" in message
    assert "no layer or input produces 'reshape_reduce_item_his'" in message
