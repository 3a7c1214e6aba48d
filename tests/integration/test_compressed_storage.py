"""Tables stored compressed, served by a real tritonserver: a model of two tables, one in
fp16 and one in int8 (``storage_precision_per_table``), answers every key with the reference
quantiser's rows (tests/quant_reference.py) and unknown keys with the exact default, over
HTTP and gRPC; the metrics endpoint reports each table's host bytes in its precision.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from quant_reference import reference_decoded

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.quant import RowFormat
from hps_core.tiers.host_table import host_layout

pytestmark = pytest.mark.integration

MODEL = "emb_compressed"
DIMS = (8, 24)
PRECISIONS = ("fp16", "int8")
DEFAULTS = (0.1, -1.0)  # 0.1 is not a half: an unknown key must get it exactly
MAX_QUERY = (50, 50)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, module_triton_server):
    root = tmp_path_factory.mktemp("compressed")
    rng = np.random.default_rng(17)
    tables = []
    for t, (rows, dim) in enumerate(((1000, DIMS[0]), (400, DIMS[1]))):
        keys = rng.choice(10**12, rows, replace=False).astype(np.int64)
        scale = 10.0 ** rng.uniform(-3, 3, (rows, 1))
        vectors = (rng.standard_normal((rows, dim)) * scale).astype(np.float32)
        write_sparse_table(root / f"t{t}", keys, vectors)
        tables.append((keys, vectors))
    ps = {
        "supportlonglong": True,
        "models": [
            {
                "model": MODEL,
                "sparse_files": ["t0", "t1"],
                "embedding_vecsize_per_table": list(DIMS),
                "default_value_for_each_table": list(DEFAULTS),
                "maxnum_catfeature_query_per_table_per_sample": list(MAX_QUERY),
                "max_batch_size": 1,
                "deployed_device_list": [0],
                "storage_precision_per_table": list(PRECISIONS),
            }
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    repo = root / "repo"
    assert hps_main(["repo", str(root / "ps.json"), str(repo)]) == 0
    yield module_triton_server(repo), tables


def test_every_key_answers_its_quantised_row(served) -> None:
    server, tables = served
    clients = [
        (httpclient, httpclient.InferenceServerClient(server.http_url.split("//")[-1])),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url.split("//")[-1])),
    ]
    formats = [RowFormat(p, d) for p, d in zip(PRECISIONS, DIMS, strict=True)]
    for module, client in clients:
        for start in range(0, 400, MAX_QUERY[1]):
            parts, want = [], []
            for t, (keys, vectors) in enumerate(tables):
                chosen = keys[start : start + MAX_QUERY[t] - 2]
                rows = vectors[start : start + len(chosen)]
                parts.append(np.concatenate([chosen, [3, 5]]))  # two unknown keys
                want.append(reference_decoded(formats[t], rows).ravel())
                want.append(np.full(2 * DIMS[t], DEFAULTS[t], np.float32))
            keys = np.concatenate(parts)[None, :]
            numkeys = np.array([[len(p) for p in parts]], dtype=np.int32)
            inputs = [
                module.InferInput("KEYS", list(keys.shape), "INT64"),
                module.InferInput("NUMKEYS", list(numkeys.shape), "INT32"),
            ]
            inputs[0].set_data_from_numpy(keys)
            inputs[1].set_data_from_numpy(numkeys)
            got = client.infer(MODEL, inputs).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(got[0], np.concatenate(want))


def test_metrics_report_host_bytes_in_each_tables_precision(served) -> None:
    server, tables = served
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    series = [
        line for line in text.splitlines()
        if line.startswith("hps_tier_bytes{") and f'model="{MODEL}"' in line
    ]  # fmt: skip
    assert len(series) == len(tables), series
    for t, (keys, _) in enumerate(tables):
        (line,) = [s for s in series if f'table="sparse_embedding{t}"' in s]
        assert f'precision="{PRECISIONS[t]}"' in line and 'tier="host"' in line, line
        expected = host_layout(len(keys), DIMS[t], 1.0, PRECISIONS[t]).nbytes
        assert float(line.rsplit(" ", 1)[1]) == expected
        assert expected < host_layout(len(keys), DIMS[t]).nbytes
