"""The network JSON files the tests run on.

- The project's own (``tests/data/networks``, always there): four networks written from the
  project's code in HugeCTR's two file forms: the exported DLRM (training form), the demo
  DCN (inference form) and W&D (training form), and a DeepFM written here (training form;
  Slice, WeightMultiply, FmOrder2, ReduceSum, Add, Dropout). They carry the always-on tests.
- HugeCTR's own files (``../shared/fixtures/hugectr`` beside the checkout, or the folder in
  ``HPS_HUGECTR_NETWORKS``): a conformance suite that runs where they exist (this project's
  CI) and is skipped with :data:`requires_hugectr`'s reason elsewhere.

``python tests/network_files.py`` writes the project's files again; a unit test checks the
committed files equal what the code writes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

OWN_DIR = Path(__file__).resolve().parent / "data" / "networks"
HUGECTR_DIR = Path(
    os.environ.get(
        "HPS_HUGECTR_NETWORKS",
        Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "hugectr",
    )
)
HUGECTR_NAMES = ("dcn_inference.json", "deepfm_1gpu.json", "dlrm_1gpu.json", "wdl_1gpu.json")

OWN = {stem: OWN_DIR / f"{stem}.json" for stem in ("dcn", "deepfm", "dlrm", "wdl")}
"""The project's networks by model name."""
HUGECTR = [HUGECTR_DIR / n for n in HUGECTR_NAMES if (HUGECTR_DIR / n).is_file()]
"""HugeCTR's networks that are here (all four, or none where the suite is skipped)."""
NETWORKS = [*OWN.values(), *HUGECTR]
"""Every network the whole-network tests run on."""

requires_hugectr = pytest.mark.skipif(
    len(HUGECTR) != len(HUGECTR_NAMES),
    reason=f"HugeCTR's network files are not in {HUGECTR_DIR} (the conformance suite runs "
    "where they are, as in this project's CI; set HPS_HUGECTR_NETWORKS to another folder)",
)


HUGECTR_DLRM_NAMES = (
    "dlrm_fp16_1gpu.json",
    "dlrm_fp16_8gpu.json",
    "dlrm_fp16_4node_2gpu.json",
    "dlrm_mlperf_fp16_dgxa100.json",
    "dlrm_set_source.json",
)
"""HugeCTR's DLRM files in the FP16 training form (their Interaction has a second top, the
gradient buffer, which the top MLP names as a second bottom); tested where they are."""
HUGECTR_DLRM = [HUGECTR_DIR / n for n in HUGECTR_DLRM_NAMES if (HUGECTR_DIR / n).is_file()]
HUGECTR_DIN = HUGECTR_DIR / "din_fp32_1gpu.json"
"""HugeCTR's DIN test file, whose layer 'reduce_item_his' is defined twice (see its test)."""
requires_hugectr_dlrm = pytest.mark.skipif(
    not HUGECTR_DLRM,
    reason=f"HugeCTR's FP16 DLRM network files ({', '.join(HUGECTR_DLRM_NAMES)}, from its "
    f"test/scripts at v24.06.00) are not in {HUGECTR_DIR}; set HPS_HUGECTR_NETWORKS to a "
    "folder that holds them",
)


def hugectr(name: str) -> Path:
    """One of HugeCTR's files (a test using it carries :data:`requires_hugectr`)."""
    return HUGECTR_DIR / name


def network_id(path: Path) -> str:
    """Test id of a network file: ``own/<stem>`` or ``hugectr/<stem>``."""
    return f"{'own' if path.parent == OWN_DIR else 'hugectr'}/{path.stem}"


_SOLVER = {"batchsize": 1024, "input_key_type": "I64", "max_eval_batches": 1, "gpu": [0]}
_OPTIMIZER = {"type": "Adam", "update_type": "Global", "adam_hparam": {"learning_rate": 0.001}}


def _training(layers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"solver": dict(_SOLVER), "optimizer": dict(_OPTIMIZER), "layers": layers}


def _inference(layers: list[dict[str, Any]], name: str) -> dict[str, Any]:
    section = {
        "max_batchsize": 1024,
        "hit_rate_threshold": 0.9,
        "dense_model_file": f"{name}_dense_0.model",
        "sparse_model_file": [f"{name}0_sparse_0.model"],
    }
    return {"inference": section, "layers": layers}


def _deepfm_layers() -> list[dict[str, Any]]:
    """A small DeepFM: 13 dense features, 26 two-hot slots; each slot's 9-wide embedding
    splits into 8 factors (the FM and the deep part) and a first-order weight."""
    slots, factors = 26, 8

    def layer(name: str, kind: str, bottom: Any, **fields: Any) -> dict[str, Any]:
        return {"name": name, "type": kind, "bottom": bottom, "top": name, **fields}

    def split(name: str, bottom: str, ranges: list[list[int]]) -> dict[str, Any]:
        tops = [f"{name}{i + 1}" for i in range(len(ranges))]
        return {"name": name, "type": "Slice", "bottom": bottom, "top": tops, "ranges": ranges}

    width = (slots + 13) * factors  # the slots' factors and the 13 projected dense features
    deep = []
    bottom = "slice31"
    for i, units in enumerate((32, 16), start=1):
        deep += [
            layer(f"fc{i}", "InnerProduct", bottom, fc_param={"num_output": units}),
            layer(f"relu{i}", "ReLU", f"fc{i}"),
            layer(f"dropout{i}", "Dropout", f"relu{i}", rate=0.5),
        ]
        bottom = f"dropout{i}"
    data = {
        "name": "data",
        "type": "Data",
        "label": {"top": "label", "label_dim": 1},
        "dense": {"top": "dense", "dense_dim": 13},
        "sparse": [{"top": "data1", "slot_num": slots, "is_fixed_length": False,
                    "nnz_per_slot": 2}],
    }  # fmt: skip
    embedding = {"embedding_vec_size": factors + 1, "combiner": "sum"}
    return [
        data,
        layer("embedding1", "DistributedSlotSparseEmbeddingHash", "data1",
              sparse_embedding_hparam=embedding),
        layer("reshape1", "Reshape", "embedding1", leading_dim=factors + 1),
        split("slice1", "reshape1", [[0, factors], [factors, factors + 1]]),
        layer("reshape2", "Reshape", "slice11", leading_dim=slots * factors),
        layer("reshape3", "Reshape", "slice12", leading_dim=slots),
        split("slice2", "dense", [[0, 13], [0, 13]]),
        layer("project1", "WeightMultiply", "slice21", weight_dims=[13, factors]),
        layer("project2", "WeightMultiply", "slice22", weight_dims=[13, 1]),
        layer("concat1", "Concat", ["reshape2", "project1"]),
        split("slice3", "concat1", [[0, width], [0, width]]),
        *deep,
        layer("fc_out", "InnerProduct", bottom, fc_param={"num_output": 1}),
        layer("fm", "FmOrder2", "slice32", out_dim=factors),
        layer("fm_sum", "ReduceSum", "fm", axis=1),
        layer("concat2", "Concat", ["reshape3", "project2"]),
        layer("first_order", "ReduceSum", "concat2", axis=1),
        layer("add", "Add", ["fc_out", "fm_sum", "first_order"]),
        {"name": "loss", "type": "BinaryCrossEntropyLoss", "bottom": ["add", "label"],
         "top": "loss"},
    ]  # fmt: skip


def own_documents() -> dict[str, dict[str, Any]]:
    """The project's four network documents by model name, as the code writes them today."""
    from hps_core.demo.dlrm import ARCH
    from hps_core.demo.ranking_networks import dcn_network, wdl_network
    from hps_core.export.dlrm_network import dlrm_network_json

    dlrm = dlrm_network_json(ARCH, [1] * ARCH.num_tables)["layers"]
    wdl = wdl_network()["layers"]
    # As in HugeCTR's own W&D file, the Data layer lists the deep input first while the wide
    # embedding comes first: tables follow the embedding layers, not the Data layer.
    wdl[0]["sparse"].reverse()
    return {
        "dcn": _inference(dcn_network()["layers"], "dcn"),
        "deepfm": _training(_deepfm_layers()),
        "dlrm": _training(dlrm),
        "wdl": _training(wdl),
    }


def write_own() -> None:
    """Write the project's network files (after a change to the exporter or demo models)."""
    OWN_DIR.mkdir(parents=True, exist_ok=True)
    for name, document in own_documents().items():
        OWN[name].write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    write_own()
    print(f"wrote {', '.join(str(p) for p in OWN.values())}")
