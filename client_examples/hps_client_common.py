"""Request and response helpers for the ``hps`` embedding-lookup contract (NumPy only).

The contract is the one of HugeCTR's ``hps`` Triton backend, which this project serves:

* input ``KEYS``, INT64, shape ``[1, sum(N_t)]``: the keys of table 0, then of table 1, ...
* input ``NUMKEYS``, INT32, shape ``[1, T]``: ``N_t``, how many keys each table gets
* output ``OUTPUT0``, FP32, ``sum(N_t * dim_t)`` values in the same order: for each table,
  its ``N_t`` embedding vectors of ``dim_t`` values, one after the other. HugeCTR's backend
  returns it with shape ``[sum(N_t * dim_t)]``; a server that keeps Triton's batch
  dimension returns ``[1, sum(N_t * dim_t)]``. Both are accepted here.

Table dimensions come from the model configuration's ``parameters``
(``embedding_vecsize_per_table: "16,32"``, ``table_names: "t0,t1"``), as returned by
``get_model_config`` of ``tritonclient.http`` (the config itself) or ``tritonclient.grpc``
with ``as_json=True`` (the config under ``"config"``).

Nothing here imports ``tritonclient``, so these functions can be reused anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

KEYS_INPUT = "KEYS"
NUMKEYS_INPUT = "NUMKEYS"
OUTPUT_NAME = "OUTPUT0"

DEFAULT_MODEL = "hps_embedding"
DEFAULT_TABLE_DIMS = (16, 32)
DEFAULT_TABLE_ROWS = (100_000, 20_000)
DEFAULT_HTTP_URL = "localhost:8000"
DEFAULT_GRPC_URL = "localhost:8001"

DIMS_PARAMETER = "embedding_vecsize_per_table"
NAMES_PARAMETER = "table_names"


class ClientInputError(ValueError):
    """Client arguments or a server answer that do not fit the ``hps`` contract."""


def parse_int_list(text: str, where: str = "") -> list[int]:
    """Parse a comma-separated list of integers such as ``"0,1,2"``.

    Args:
        text: the list; spaces around items are ignored.
        where: what the list is (a flag or parameter name), prefixed to error messages.

    Returns:
        The integers, in order.

    Raises:
        ClientInputError: if the list is empty or an item is not an integer.
    """
    prefix = f"{where}: " if where else ""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ClientInputError(f"{prefix}expected comma-separated integers, got {text!r}")
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ClientInputError(f"{prefix}{item!r} is not an integer (in {text!r})") from None
    return values


def build_request_arrays(keys_per_table: Sequence[ArrayLike]) -> tuple[np.ndarray, np.ndarray]:
    """Build the ``KEYS`` and ``NUMKEYS`` arrays of one lookup request.

    Args:
        keys_per_table: for each table, a 1-D sequence of integer keys (may be empty).

    Returns:
        ``(keys, numkeys)``: int64 ``[1, sum(N_t)]`` and int32 ``[1, T]``.

    Raises:
        ClientInputError: if there is no table, or a table's keys are not 1-D integers that
            fit in int64.

    Example:
        >>> keys, numkeys = build_request_arrays([[3, 1], [7]])
        >>> keys.tolist(), numkeys.tolist()
        ([[3, 1, 7]], [[2, 1]])
    """
    if len(keys_per_table) == 0:
        raise ClientInputError(f"{KEYS_INPUT}: at least one table's keys are needed")
    columns = []
    for table, keys in enumerate(keys_per_table):
        where = f"{KEYS_INPUT} of table {table}"
        array = np.asarray(keys)
        if array.size == 0:
            array = array.astype(np.int64)
        if array.ndim != 1:
            raise ClientInputError(f"{where}: expected a 1-D list of keys, got shape {array.shape}")
        if not np.issubdtype(array.dtype, np.integer):
            raise ClientInputError(f"{where}: keys must be integers, got dtype {array.dtype}")
        if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
            raise ClientInputError(f"{where}: key {array.max()} does not fit in int64")
        columns.append(array.astype(np.int64))
    keys = np.concatenate(columns).reshape(1, -1)
    numkeys = np.array([[len(column) for column in columns]], dtype=np.int32)
    return keys, numkeys


def split_output(
    output: ArrayLike, num_keys: Sequence[int], dims: Sequence[int]
) -> list[np.ndarray]:
    """Split ``OUTPUT0`` into one ``[N_t, dim_t]`` array per table.

    Args:
        output: the ``OUTPUT0`` array of one response, shape ``[total]`` or ``[1, total]``.
        num_keys: ``N_t`` per table (the request's ``NUMKEYS``).
        dims: embedding dimension per table.

    Returns:
        One float32 array of shape ``[N_t, dim_t]`` per table.

    Raises:
        ClientInputError: if the shapes or sizes do not agree; the message says what was
            expected.

    Example:
        >>> [a.shape for a in split_output(np.zeros(2 * 4 + 1 * 8), [2, 1], [4, 8])]
        [(2, 4), (1, 8)]
    """
    counts = [int(n) for n in np.asarray(num_keys).ravel()]
    dims = [int(d) for d in dims]
    if len(counts) != len(dims):
        raise ClientInputError(
            f"{NUMKEYS_INPUT} has {len(counts)} entr{'y' if len(counts) == 1 else 'ies'} but the "
            f"model has {len(dims)} table{'s' * (len(dims) != 1)} (dims {dims})"
        )
    if any(n < 0 for n in counts):
        raise ClientInputError(f"{NUMKEYS_INPUT} has a negative count: {counts}")
    if any(d < 1 for d in dims):
        raise ClientInputError(f"embedding dims must be >= 1, got {dims}")
    values = np.asarray(output)
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[0] == 1)):
        raise ClientInputError(
            f"{OUTPUT_NAME} has shape {list(values.shape)}; expected [total] or [1, total] "
            "for one request"
        )
    expected = sum(n * d for n, d in zip(counts, dims, strict=True))
    if values.size != expected:
        terms = " + ".join(f"{n}*{d}" for n, d in zip(counts, dims, strict=True))
        raise ClientInputError(
            f"{OUTPUT_NAME} has {values.size} values but {NUMKEYS_INPUT} {counts} with dims "
            f"{dims} need {terms} = {expected}"
        )
    flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
    tables = []
    start = 0
    for n, d in zip(counts, dims, strict=True):
        tables.append(flat[start : start + n * d].reshape(n, d))
        start += n * d
    return tables


def _parameters(config: Mapping) -> Mapping:
    # tritonclient.grpc's get_model_config(as_json=True) nests the config under "config".
    body = config.get("config", config)
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise ClientInputError(f"model config 'parameters' is not a mapping: {parameters!r}")
    return parameters


def _string_parameter(config: Mapping, name: str) -> str | None:
    entry = _parameters(config).get(name)
    if entry is None:
        return None
    value = entry.get("string_value") if isinstance(entry, Mapping) else None
    if not isinstance(value, str):
        raise ClientInputError(f"model config parameter {name} has no string_value (got {entry!r})")
    return value


def table_dims_from_model_config(config: Mapping) -> list[int] | None:
    """Read the embedding dimension of each table from a model configuration.

    Args:
        config: the model configuration as ``get_model_config`` returns it (HTTP), or the
            gRPC JSON form with the configuration under ``"config"``.

    Returns:
        The dims (e.g. ``[16, 32]``), or ``None`` if the configuration does not carry the
        ``embedding_vecsize_per_table`` parameter.

    Raises:
        ClientInputError: if the parameter is present but is not a list of positive integers.

    Example:
        >>> table_dims_from_model_config(
        ...     {"parameters": {"embedding_vecsize_per_table": {"string_value": "16,32"}}})
        [16, 32]
    """
    text = _string_parameter(config, DIMS_PARAMETER)
    if text is None:
        return None
    where = f"model config parameter {DIMS_PARAMETER}"
    dims = parse_int_list(text, where)
    if any(d < 1 for d in dims):
        raise ClientInputError(f"{where}: dims must be >= 1, got {text!r}")
    return dims


def table_names_from_model_config(config: Mapping) -> list[str] | None:
    """Read the table names from a model configuration.

    Args:
        config: as for :func:`table_dims_from_model_config`.

    Returns:
        The names (e.g. ``["t0", "t1"]``), or ``None`` without a ``table_names`` parameter.
    """
    text = _string_parameter(config, NAMES_PARAMETER)
    if text is None:
        return None
    return [name.strip() for name in text.split(",")]


def format_lookup(
    keys_per_table: Sequence[np.ndarray],
    embeddings: Sequence[np.ndarray],
    table_names: Sequence[str],
    num_values: int = 4,
) -> list[str]:
    """Render each key with the first values of its embedding, table by table.

    Args:
        keys_per_table: the keys sent, per table.
        embeddings: the ``[N_t, dim_t]`` arrays from :func:`split_output`.
        table_names: a name per table.
        num_values: how many leading values of each vector to show.

    Returns:
        Lines of text, e.g. ``"  key 7: [+0.01234, -0.50000, ...]"``.
    """
    lines = []
    for table, (keys, vectors, name) in enumerate(
        zip(keys_per_table, embeddings, table_names, strict=True)
    ):
        dim = vectors.shape[1]
        lines.append(f"table {table} '{name}' (dim {dim}, {len(keys)} keys):")
        for key, vector in zip(np.asarray(keys).tolist(), vectors, strict=True):
            shown = ", ".join(f"{value:+.5f}" for value in vector[:num_values])
            more = ", ..." if dim > num_values else ""
            lines.append(f"  key {key}: [{shown}{more}]")
    return lines
