"""A model repository written the way HugeCTR's docs and samples write one, for the tests of
serving it unchanged (``hps_core.hugectr_repo``, ``hps serve -- --backend-config=...``).

:func:`write_hugectr_repository`: two models, ``hps_embedding`` (``backend: "hps"``, two
tables of dims 16 and 32) and ``dlrm`` (``backend: "hugectr"``, the demo DLRM: 26 one-hot
tables, 13 dense features), each with KIND_GPU instances, HugeCTR's ``parameters`` and an empty
version folder ``1``; their files (sparse, dense, network) outside the repository; one ps.json
per backend with absolute paths and, as HugeCTR's, no ``network_file`` (the ``hugectr``
config.pbtxt's ``config`` names the network).

:func:`write_ensemble_sample`: the ``hps_test`` model of hugectr_backend's
``hps_backend/samples/hps-triton-ensemble`` (``HPS_Pytorch_ensemble_deployment.ipynb``) as
that sample writes it: its files in version folder ``0`` with ``version_policy {specific
{versions: 0}}``, its config.pbtxt's text (commas after fields, an empty ``parameters``) and
its ps.json's keys in its order, ``num_of_refresher_buffer_in_pool`` given twice (1 then 0).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer import load_ranking_graph
from hps_core.triton_repo import ServingOptions

HPS_CONFIG = """\
name: "hps_embedding"
backend: "hps"
max_batch_size: 16
input [
  { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
version_policy: { specific: { versions: 1 } }
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
parameters [
  { key: "gpucache" value: { string_value: "true" } },
  { key: "gpucacheper" value: { string_value: "0.2" } },
  { key: "embeddingkey_long_type" value: { string_value: "true" } }
]
"""

HUGECTR_CONFIG = """\
name: "dlrm"
backend: "hugectr"
max_batch_size: 16
input [
  { name: "DES" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "CATCOLUMN" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "ROWINDEX" data_type: TYPE_INT32 dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
parameters [
  { key: "config" value: { string_value: "NETWORK" } },
  { key: "gpucache" value: { string_value: "true" } },
  { key: "hit_rate_threshold" value: { string_value: "0.9" } },
  { key: "gpucacheper" value: { string_value: "0.2" } },
  { key: "label_dim" value: { string_value: "1" } },
  { key: "slots" value: { string_value: "SLOTS" } },
  { key: "cat_feature_num" value: { string_value: "SLOTS" } },
  { key: "des_feature_num" value: { string_value: "DENSE" } },
  { key: "max_nnz" value: { string_value: "1" } },
  { key: "embedding_vector_size" value: { string_value: "16" } },
  { key: "embeddingkey_long_type" value: { string_value: "true" } }
]
"""


@dataclass(frozen=True)
class HugeCTRRepository:
    """Where :func:`write_hugectr_repository` put things."""

    repo: Path
    hps_ps: Path  # --backend-config=hps,ps=...
    hugectr_ps: Path  # --backend-config=hugectr,ps=...
    network: Path
    reference_ps: Path  # the same models as this project's ps.json (network_file included)


def write_hugectr_repository(root: Path) -> HugeCTRRepository:
    """Write the repository and its files under ``root`` (see the module docstring)."""
    files = root / "files"
    emb_folder = DEMO_MODELS["hps_embedding"](files, ServingOptions())
    dlrm_folder = DEMO_MODELS["dlrm"](files, ServingOptions())
    hps_ps, hugectr_ps = root / "hps.json", root / "hugectr.json"
    hps_ps.write_text(json.dumps(load_ps_config(emb_folder / "ps.json").to_dict(), indent=2))
    dlrm = load_ps_config(dlrm_folder / "ps.json")
    model = dlrm.models[0]
    document = dlrm.to_dict()
    network = model.network_file
    assert network is not None
    del document["models"][0]["network_file"]  # HugeCTR's ps.json has none
    hugectr_ps.write_text(json.dumps(document, indent=2))
    _, layout = load_ranking_graph(model)
    repo = root / "repo"
    for name, text in (
        ("hps_embedding", HPS_CONFIG),
        (
            "dlrm",
            HUGECTR_CONFIG.replace("NETWORK", str(network))
            .replace("SLOTS", str(layout.total_slots))
            .replace("DENSE", str(layout.dense_dim)),
        ),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    return HugeCTRRepository(repo, hps_ps, hugectr_ps, network, dlrm_folder / "ps.json")


def digest(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` and a hash of its bytes (to show a repository untouched)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


ENSEMBLE_SAMPLE_CONFIG = """\
name: "hps_test"
backend: "hps"
max_batch_size:32,
input [
  {
    name: "KEYS"
    data_type: TYPE_INT64
    dims: [-1]
  },
  {
    name: "NUMKEYS"
    data_type: TYPE_INT32
    dims: [-1]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
version_policy: {
        specific:{versions: 0}
},
instance_group [
  {
    count: 1
    kind : KIND_GPU
    gpus:[0]
  }
]

parameters [

]
"""

# The sample's hps.json, its keys in its order. Two changes: "supportlonglong", which the
# sample leaves out although HugeCTR's hps backend requires it (it refuses the file without
# it, as this project does), and the sparse folder given from the ps.json's folder (the
# sample's "model/hps_test/0/hps_sparse.model" is read from the server's working folder).
ENSEMBLE_SAMPLE_PS = """\
{
    "supportlonglong": true,
    "models": [{
    "model": "hps_test",
    "sparse_files": ["hps_test/0/hps_sparse.model"],
    "num_of_worker_buffer_in_pool": 3,
    "embedding_table_names":["0"],
    "num_of_refresher_buffer_in_pool":1,
    "embedding_vecsize_per_table":[32],
    "num_of_refresher_buffer_in_pool":0,
    "maxnum_catfeature_query_per_table_per_sample":[1],
    "deployed_device_list":[0],
    "max_batch_size":32,
    "default_value_for_each_table":[0.0],
    "cache_refresh_percentage_per_iteration":0,
    "hit_rate_threshold":1.1,
    "gpucacheper":1.0,
    "gpucache":true
    }]
}
"""


@dataclass(frozen=True)
class EnsembleSample:
    """Where :func:`write_ensemble_sample` put things."""

    repo: Path  # the sample's model/ folder: --model-repository
    ps_json: Path  # its hps.json: --backend-config=hps,ps=...
    sparse: Path  # the one table's sparse model folder, in version folder 0


def write_ensemble_sample(root: Path, rows: int = 1000) -> EnsembleSample:
    """Write the sample's ``hps_test`` under ``root / "model"`` (see the module docstring):
    one table of ``rows`` keys (0, 1, ...; the sample's clients send keys below 999) and
    dim 32, random rows."""
    repo = root / "model"
    sparse = repo / "hps_test" / "0" / "hps_sparse.model"
    rng = np.random.default_rng(48)
    keys = np.arange(rows, dtype=np.int64)
    write_sparse_table(sparse, keys, rng.standard_normal((rows, 32), dtype=np.float32))
    (repo / "hps_test" / "config.pbtxt").write_text(ENSEMBLE_SAMPLE_CONFIG)
    ps_json = repo / "hps.json"
    ps_json.write_text(ENSEMBLE_SAMPLE_PS)
    return EnsembleSample(repo, ps_json, sparse)
