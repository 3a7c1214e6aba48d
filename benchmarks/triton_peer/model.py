"""The PyTorch peer (``benchmarks/torch_dlrm.py``) as a Triton Python-backend model.

It serves HugeCTR's ``hugectr`` contract for samples of the model's fixed number of keys per
table (``DES`` ``[1, B*D]``, ``CATCOLUMN`` ``[1, B*K]`` sample-major, ``ROWINDEX`` unused ->
``OUTPUT0`` ``[1, B]``), so
one perf_analyzer input drives both it and hps-triton's model. Requests of one ``execute`` are
joined into one forward pass, as a careful user would write it. config.pbtxt parameters:
``ps_json``, ``hps_model_name`` and ``benchmarks_dir`` (where ``torch_dlrm.py`` is).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        sys.path.insert(0, params["benchmarks_dir"])
        from torch_dlrm import torch_peer

        self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        torch.cuda.set_device(self.device)
        self.net = torch_peer(Path(params["ps_json"]), params["hps_model_name"], self.device.index)
        self.key_width = self.net.key_width

    def execute(self, requests: list) -> list:
        dense, keys, sizes = [], [], []
        for request in requests:
            des = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "DES"))
            cat = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "CATCOLUMN"))
            batch = cat.numel() // self.key_width
            dense.append(des.reshape(batch, -1))
            keys.append(cat.reshape(batch, self.key_width))
            sizes.append(batch)
        with torch.no_grad():
            scores = self.net(
                torch.cat(dense).to(self.device, non_blocking=True),
                torch.cat(keys).to(self.device, non_blocking=True),
            ).reshape(-1)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor.from_dlpack("OUTPUT0", piece.reshape(1, -1).contiguous())
                ]
            )
            for piece in scores.split(sizes)
        ]
