"""Client load on an ``hps`` embedding model in which every answer is checked, not only its status.

:class:`CheckedLoad` runs threads that each send ``KEYS``/``NUMKEYS`` requests over gRPC
(HugeCTR's ``hps`` contract) for as long as it runs: per table some keys the table holds and
some it does not, drawn at random. Each answer is compared, element for element, with what the
model files say (:class:`TableTruth`: the row of a held key, the default vector of another);
while a fault lasts several versions of the truth may be acceptable (files being replaced),
so an answer is right when it equals one of :attr:`CheckedLoad.truths`. Failed requests (any
error status) and wrong answers are counted apart, with the time of the last of each, so a
fault's recovery time is measured from the client's side.

Used by the integration tests of faults under load and by ``benchmarks/faults.py``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from hps_core.formats.sparse_writer import write_sparse_table


@dataclass(frozen=True)
class TableTruth:
    """What a table's files say: its keys, their rows and the default vector's value.

    Args:
        keys: int64 ``[rows]``.
        vectors: float32 ``[rows, dim]``.
        default: every element of the vector answered for a key the table lacks.
    """

    keys: np.ndarray
    vectors: np.ndarray
    default: float

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.vectors.shape[1]

    @functools.cached_property
    def _order(self) -> np.ndarray:
        return np.argsort(self.keys)

    def expected(self, keys: np.ndarray) -> np.ndarray:
        """The vectors the files give ``keys`` (the default where they lack one)."""
        order = self._order
        at = np.searchsorted(self.keys, keys, sorter=order).clip(0, len(self.keys) - 1)
        rows = order[at]
        held = self.keys[rows] == keys
        out = np.full((len(keys), self.dim), self.default, np.float32)
        out[held] = self.vectors[rows[held]]
        return out

    def write(self, folder) -> None:
        """Write the table as a HugeCTR sparse folder (replacing one there)."""
        write_sparse_table(folder, self.keys, self.vectors, overwrite=True)


def random_truth(rng: np.random.Generator, rows: int, dim: int, default: float) -> TableTruth:
    """A table of ``rows`` distinct keys in ``[0, 10**12)`` and random rows."""
    keys = rng.choice(10**12, size=rows, replace=False).astype(np.int64)
    return TableTruth(keys, rng.standard_normal((rows, dim)).astype(np.float32), default)


@dataclass
class LoadTally:
    """What a load saw.

    Attributes:
        total: requests answered (successfully or not).
        failed: requests answered with an error status.
        wrong: requests answered OK whose vectors equal no acceptable truth.
        reasons: failed requests by the first 200 characters of their error.
        last_failed: ``time.monotonic()`` of the last failed request (0: none).
        last_wrong: the same for wrong answers.
        first_wrong: the first wrong answer, described (for the assertion message).
    """

    total: int = 0
    failed: int = 0
    wrong: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    last_failed: float = 0.0
    last_wrong: float = 0.0
    first_wrong: str = ""

    def summary(self) -> str:
        """One line: totals and the most common failure."""
        reason = self.reasons.most_common(1)[0][0] if self.reasons else "-"
        return f"{self.failed} failed, {self.wrong} wrong of {self.total} ({reason})"


class CheckedLoad:
    """Threads of checked requests against one ``hps`` model (see the module docstring).

    Args:
        grpc_url: ``host:port`` of the server's gRPC endpoint.
        model: the model's name.
        truths: the acceptable truths, one :class:`TableTruth` per table each.
        threads: concurrent clients.
        keys_per_table: keys per table per request.
        unknown_share: share of those keys the tables do not hold.
        seed: random seed of the keys.

    Example:
        >>> with CheckedLoad(server.grpc_url, "emb", [[truth]]) as load:  # doctest: +SKIP
        ...     time.sleep(5)
        >>> load.tally.wrong  # doctest: +SKIP
        0
    """

    def __init__(
        self,
        grpc_url: str,
        model: str,
        truths: list[list[TableTruth]],
        threads: int = 4,
        keys_per_table: int = 16,
        unknown_share: float = 0.1,
        seed: int = 0,
    ) -> None:
        self.grpc_url = grpc_url.split("//")[-1]
        self.model = model
        self.truths = truths
        self.keys_per_table = keys_per_table
        self.unknown_share = unknown_share
        self.tally = LoadTally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(seed + i,), daemon=True)
            for i in range(threads)
        ]

    def __enter__(self) -> CheckedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> LoadTally:
        """Stop the clients (each finishes its request in flight) and return the tally."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        return self.tally

    def snapshot(self) -> LoadTally:
        """A copy of the tally so far."""
        with self._lock:
            t = self.tally
            return LoadTally(
                t.total, t.failed, t.wrong, Counter(t.reasons), t.last_failed, t.last_wrong,
                t.first_wrong,
            )  # fmt: skip

    def wait_requests(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` more requests were answered.

        Raises:
            TimeoutError: they were not within ``timeout`` seconds.
        """
        target = self.snapshot().total + count
        deadline = time.monotonic() + timeout
        while self.snapshot().total < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} requests in {timeout} s")
            time.sleep(0.05)

    def _keys(self, rng: np.random.Generator, table: TableTruth) -> np.ndarray:
        n = self.keys_per_table
        unknown = rng.random(n) < self.unknown_share
        keys = rng.choice(table.keys, n)
        # Keys past the tables' range: never held, spread over every partition and node.
        keys[unknown] = rng.integers(10**13, 10**14, int(unknown.sum()))
        return keys

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = grpcclient.InferenceServerClient(self.grpc_url)
        layout = self.truths[0]
        while not self._stop.is_set():
            parts = [self._keys(rng, table) for table in layout]
            keys = np.concatenate(parts)[None]
            counts = np.array([[len(p) for p in parts]], np.int32)
            inputs = [
                grpcclient.InferInput("KEYS", list(keys.shape), "INT64"),
                grpcclient.InferInput("NUMKEYS", list(counts.shape), "INT32"),
            ]
            inputs[0].set_data_from_numpy(keys)
            inputs[1].set_data_from_numpy(counts)
            try:
                out = client.infer(self.model, inputs, client_timeout=30).as_numpy("OUTPUT0")
            except Exception as exc:
                self._count(failed=str(exc).splitlines()[0][:200] if str(exc) else repr(exc))
                continue
            got = out.reshape(-1)
            right = any(np.array_equal(got, self._expected(truth, parts)) for truth in self.truths)
            self._count(wrong=None if right else f"keys {keys[0, :4].tolist()}...")
        client.close()

    @staticmethod
    def _expected(truth: list[TableTruth], parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(
            [table.expected(keys).reshape(-1) for table, keys in zip(truth, parts, strict=True)]
        )

    def _count(self, failed: str | None = None, wrong: str | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            t = self.tally
            t.total += 1
            if failed is not None:
                t.failed += 1
                t.reasons[failed] += 1
                t.last_failed = now
            if wrong is not None:
                t.wrong += 1
                t.last_wrong = now
                t.first_wrong = t.first_wrong or wrong
