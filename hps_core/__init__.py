"""hps-triton engine: HugeCTR-compatible hierarchical parameter server."""

from hps_core.hps import HPS

__all__ = ["HPS"]
