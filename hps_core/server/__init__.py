"""Run a real Triton Inference Server for this project: find it, launch it, stop it."""

from hps_core.server.install import (
    PerfAnalyzer,
    TritonInstallation,
    TritonInstallError,
    find_perf_analyzer,
    find_triton,
)
from hps_core.server.ports import listening_ports, pick_free_ports
from hps_core.server.process import (
    ServerError,
    ServerPorts,
    ServerStartError,
    TritonServer,
    process_group_members,
)

__all__ = [
    "PerfAnalyzer",
    "ServerError",
    "ServerPorts",
    "ServerStartError",
    "TritonInstallError",
    "TritonInstallation",
    "TritonServer",
    "find_perf_analyzer",
    "find_triton",
    "listening_ports",
    "pick_free_ports",
    "process_group_members",
]
