"""What a ranking model takes: its layout and a batch.

- :mod:`~hps_core.infer.inputs.layout`: which ps.json table feeds which embedding layer,
  checked.
- :mod:`~hps_core.infer.inputs.batch`: samples in CSR form, joined across requests.

The floor below the sessions and the GPU pipeline (:mod:`hps_core.infer.gpu`): it imports
neither them nor the rest of :mod:`hps_core.infer`, which re-exports its public names.
Nothing is imported here.
"""
