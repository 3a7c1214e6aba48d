"""Run perf_analyzer against a served model and read its results.

Shared by the perf benchmark and the integration test, so both measure the same way.
"""

from __future__ import annotations

import csv
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hps_core.errors import HPSError
from hps_core.server.install import find_perf_analyzer


class PerfAnalyzerError(HPSError):
    """perf_analyzer failed; the message carries the end of its output."""


@dataclass(frozen=True)
class PerfResult:
    """One concurrency level as perf_analyzer reports it (latencies in microseconds).

    Args:
        protocol: ``grpc`` or ``http``.
        concurrency: concurrent requests in flight.
        throughput: inferences per second.
        p50_us: median client latency.
        p90_us: 90th percentile client latency.
        p99_us: 99th percentile client latency.
    """

    protocol: str
    concurrency: int
    throughput: float
    p50_us: float
    p90_us: float
    p99_us: float


def run_perf_analyzer(
    model: str,
    url: str,
    protocol: str,
    input_data: Path,
    concurrency: Sequence[int],
    measurement_ms: int = 5000,
    stability_percent: float = 10.0,
    max_trials: int = 10,
    extra_args: Sequence[str] = (),
    timeout_s: float = 600.0,
    batch_size: int = 1,
) -> tuple[list[PerfResult], str]:
    """Measure ``model`` at each concurrency with perf_analyzer.

    Args:
        model: the model name.
        url: ``host:port`` of the protocol's endpoint.
        protocol: ``grpc`` or ``http``.
        input_data: perf_analyzer ``--input-data`` JSON.
        concurrency: concurrency levels to measure.
        measurement_ms: length of one measurement window.
        stability_percent: how close three windows must agree (perf_analyzer ``-s``).
        max_trials: windows tried before perf_analyzer gives up on stability.
        extra_args: further perf_analyzer options.
        timeout_s: kill perf_analyzer after this long.
        batch_size: samples of ``input_data`` a request (``-b``; its inferences/s count
            samples).

    Returns:
        The results, one per concurrency, and perf_analyzer's output.

    Raises:
        PerfAnalyzerError: perf_analyzer exited non-zero (a failed request, no stability).
    """
    pa = find_perf_analyzer()
    with tempfile.TemporaryDirectory(prefix="hps-perf-") as tmp:
        report = Path(tmp) / "report.csv"
        results, output = [], []
        for level in concurrency:
            args = pa.command(
                "-m", model, "-u", url, "-i", protocol, "--input-data", str(input_data),
                "-b", str(batch_size), "--concurrency-range", str(level),
                "--measurement-interval", str(measurement_ms),
                "--stability-percentage", str(stability_percent),
                "--max-trials", str(max_trials), "--percentile", "99", "-f", str(report),
                *extra_args,
            )  # fmt: skip
            done = subprocess.run(
                args, env=dict(pa.env), capture_output=True, text=True, timeout=timeout_s
            )
            output.append(done.stdout + done.stderr)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
                raise PerfAnalyzerError(
                    f"perf_analyzer ({protocol}, concurrency {level}) exited with "
                    f"{done.returncode}:\n{tail}"
                )
            results.extend(_read_report(report, protocol))
    return results, "\n".join(output)


def _read_report(path: Path, protocol: str) -> list[PerfResult]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return [
        PerfResult(
            protocol=protocol,
            concurrency=int(row["Concurrency"]),
            throughput=float(row["Inferences/Second"]),
            p50_us=float(row["p50 latency"]),
            p90_us=float(row["p90 latency"]),
            p99_us=float(row["p99 latency"]),
        )
        for row in rows
    ]
