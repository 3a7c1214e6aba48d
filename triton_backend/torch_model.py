"""Triton Python-backend model serving a user's PyTorch module whose tables are in the HPS.

A model folder's ``1/model.py`` is one line (``hps repo-torch`` writes the folder)::

    from triton_backend.torch_model import TorchModel as TritonPythonModel

``initialize`` checks config.pbtxt, the ps.json and the files it names, builds the module
from ``torch_module`` (``FILE.py:FACTORY`` in the version folder, called with the ps.json and
the model name), loads ``torch_state_dict`` and places it on the instance's device
(:mod:`hps_core.torch_serving`). The instance's lookup is made as every model's here
(:class:`~triton_backend.lookup_service.LookupService`: GPU caches shared per GPU, Kafka
updates, metrics) and served: the module's ``hps_torch``/``hps_torchrec`` layers look up
through it. The HPS starts on the first ``execute`` (HugeCTR's implicit initialisation), or at
load with a ``model_warmup``. All requests of one ``execute`` are one forward; a bad request
gets its own ``INVALID_ARG`` response and the others are served.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hps_core.arrays import to_host
from hps_core.host_memory import keep_freed_memory
from hps_core.hps import HPS
from hps_core.model_check import check_model_files
from hps_core.torch_serving import (
    MODULE_PARAMETER,
    STATE_DICT_PARAMETER,
    TorchBatcher,
    instance_device,
    load_module,
    torch_io,
)
from hps_core.wording import plural
from triton_backend.batched_execute import execute_batched
from triton_backend.lookup_service import LookupService, log_to_stderr
from triton_backend.model_settings import check_instance_device, parameter, read_settings
from triton_backend.served_files import ServedFiles
from triton_backend.tensors import input_array

logger = logging.getLogger("hps_core")


class TorchModel:
    """``TritonPythonModel`` of a user's PyTorch module: config.pbtxt's inputs in, its
    outputs out."""

    def initialize(self, args: dict[str, str]) -> None:
        """Check the model, build the module and load its weights before Triton marks it
        loaded.

        Args:
            args: Triton's initialize arguments.
        """
        log_to_stderr()
        keep_freed_memory()
        settings = read_settings(args)
        files = ServedFiles.settle(settings)
        checked = check_model_files(
            settings.ps_json, settings.hps_model, source=settings.source_ps_json
        )
        model = checked.model
        check_instance_device(settings, model.deployed_device_list, f"model '{model.name}'")
        self.io = torch_io(settings.config)
        self.service = LookupService(settings, files, served=True)
        self.service.publish_tier_bytes(checked.footprint)
        device = instance_device(settings.instance_kind, settings.device_id)
        version_dir = Path(args["model_repository"]) / str(settings.version)
        spec = parameter(settings.config, MODULE_PARAMETER)
        module = load_module(
            version_dir,
            spec or "",
            settings.ps_json,
            settings.hps_model,
            parameter(settings.config, STATE_DICT_PARAMETER),
            device,
        )
        self.batcher = TorchBatcher(
            module, self.io, device, int(settings.config.get("max_batch_size", 0))
        )
        self.outputs = [spec.name for spec in self.io.outputs]
        logger.info(
            "model '%s': PyTorch module %s over ps.json %s, model '%s', %s on %s",
            settings.triton_model,
            spec,
            settings.shown_ps_json,
            settings.hps_model,
            plural(len(self.io.inputs), "input"),
            device,
        )
        self.service.start_at_load()

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer a batch of requests with one forward of the module.

        Args:
            requests: Triton inference requests.

        Returns:
            One response per request, in order.
        """
        return execute_batched(
            requests, self._parse, self._run, self.outputs, self.service.count_failed
        )

    def _parse(self, request: Any) -> dict[str, Any]:
        on_gpu = self.batcher.device.type == "cuda"
        arrays = {}
        for spec in self.io.inputs:
            array = input_array(request, spec.name, spec.dtype)
            arrays[spec.name] = array if on_gpu else to_host(array)
        return self.batcher.checked(arrays)

    def _run(self, batches: list[dict[str, Any]]) -> list[Any]:
        self.service.start()  # first execute: open tables, warm caches, start updates
        return self.batcher(batches)

    def finalize(self) -> None:
        """Stop background work and detach from the shared tables, those of any other
        lookup the module opened as well (another ps.json or model: the stub process holds
        this instance alone)."""
        self.service.close()
        HPS.close_all()
