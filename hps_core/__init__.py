"""hps-triton engine: HugeCTR-compatible hierarchical parameter server."""
