"""The project's own network files (tests/data/networks): what the exporter and the demo
models write today, in both of HugeCTR's file forms, and runnable."""

from __future__ import annotations

import json

import pytest
from network_files import OWN, network_id, own_documents

from hps_core.nn import NetworkForm, build_graph, load_network_json


def test_committed_files_are_what_the_code_writes() -> None:
    documents = own_documents()
    assert sorted(documents) == sorted(OWN)
    for name, document in documents.items():
        assert json.loads(OWN[name].read_text()) == document, (
            f"{OWN[name]} is stale: run python tests/network_files.py"
        )


def test_both_forms_are_covered() -> None:
    forms = {name: load_network_json(path).form for name, path in OWN.items()}
    assert forms == {
        "dcn": NetworkForm.INFERENCE,
        "deepfm": NetworkForm.TRAINING,
        "dlrm": NetworkForm.TRAINING,
        "wdl": NetworkForm.TRAINING,
    }


@pytest.mark.parametrize("path", OWN.values(), ids=network_id)
def test_every_own_network_runs(path) -> None:
    graph = build_graph(load_network_json(path))
    graph.require_runnable()
    assert str(graph.output_shape) == "(B, 1)"
