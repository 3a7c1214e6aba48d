"""What a layer is written in: its JSON spec, tensor shapes, compute precision.

- :mod:`~hps_core.nn.spec.network_json`: a HugeCTR network JSON file parsed into typed specs.
- :mod:`~hps_core.nn.spec.shapes`: tensor shapes whose leading dimension scales with the batch.
- :mod:`~hps_core.nn.spec.precision`: the compute precision (fp32, tf32, fp16) and the array
  helpers that depend on it.

The floor below :mod:`hps_core.nn.layers`: it imports neither the layers nor the rest of
:mod:`hps_core.nn`, which re-exports its public names. Nothing is imported here.
"""
