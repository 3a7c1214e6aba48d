"""The command line shared by ``hps_http_client.py`` and ``hps_grpc_client.py``.

Both scripts do the same thing over a different protocol: read the table dims from the
model configuration, send one ``KEYS``/``NUMKEYS`` request, split ``OUTPUT0`` per table and
print each key with the first values of its embedding. Each script passes a
:class:`Protocol` naming its ``tritonclient`` module and how it fetches the configuration.

Exit codes: 0 on success, 1 when the server or the connection fails (the server's message
is printed), 2 when the request or the response does not fit the hps contract (arguments
that do not match the model's tables, or an ``OUTPUT0`` whose size does not match the dims).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from hps_client_common import (
    DEFAULT_MODEL,
    DEFAULT_TABLE_DIMS,
    DEFAULT_TABLE_ROWS,
    KEYS_INPUT,
    NUMKEYS_INPUT,
    OUTPUT_NAME,
    ClientInputError,
    build_request_arrays,
    format_lookup,
    parse_int_list,
    split_output,
    table_dims_from_model_config,
    table_names_from_model_config,
)
from tritonclient.utils import InferenceServerException


@dataclass(frozen=True)
class Protocol:
    """How one client script talks to Triton.

    Attributes:
        name: shown in messages, e.g. ``"HTTP"``.
        client_module: ``tritonclient.http`` or ``tritonclient.grpc``.
        default_url: ``host:port`` used when ``--url`` is not given.
        fetch_config: ``(client, model) -> dict``, the model configuration as a dict.
    """

    name: str
    client_module: ModuleType
    default_url: str
    fetch_config: Callable[[Any, str], Mapping]


def _int_list(text: str) -> list[int]:
    try:
        return parse_int_list(text)
    except ClientInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def build_parser(protocol: Protocol, prog: str | None = None) -> argparse.ArgumentParser:
    """Build the argument parser of a client script.

    Args:
        protocol: the protocol of the script.
        prog: program name shown in usage messages.

    Returns:
        The parser.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"Look up embeddings from an hps embedding model over {protocol.name}.",
    )
    parser.add_argument(
        "--url", default=protocol.default_url, help="server host:port (%(default)s)"
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name (%(default)s)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--keys",
        action="append",
        type=_int_list,
        metavar="K1,K2,...",
        help="keys of one table; give --keys once per table, in table order",
    )
    source.add_argument(
        "--random", type=_int_at_least(1), metavar="N", help="send N uniformly drawn keys per table"
    )
    parser.add_argument(
        "--table-rows",
        type=_int_list,
        default=list(DEFAULT_TABLE_ROWS),
        metavar="R0,R1,...",
        help="rows per table, the key range of --random (default %(default)s)",
    )
    parser.add_argument(
        "--dims",
        type=_int_list,
        metavar="D0,D1,...",
        help="embedding dims per table; default: the model config's "
        f"embedding_vecsize_per_table, else {','.join(map(str, DEFAULT_TABLE_DIMS))}",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --random (%(default)s)")
    parser.add_argument(
        "--values",
        type=_int_at_least(0),
        default=4,
        metavar="V",
        help="leading values shown per embedding (%(default)s)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="let tritonclient print requests and responses"
    )
    return parser


def _resolve_dims(args: argparse.Namespace, config: Mapping) -> list[int]:
    from_config = table_dims_from_model_config(config)
    if args.dims is None:
        return from_config if from_config is not None else list(DEFAULT_TABLE_DIMS)
    if from_config is not None and from_config != args.dims:
        print(
            f"warning: --dims {args.dims} differs from the model config's {from_config}",
            file=sys.stderr,
        )
    if any(d < 1 for d in args.dims):
        raise ClientInputError(f"--dims: dims must be >= 1, got {args.dims}")
    return args.dims


def _keys_per_table(args: argparse.Namespace, num_tables: int) -> list[np.ndarray]:
    if args.keys is not None:
        if len(args.keys) != num_tables:
            given = "once" if len(args.keys) == 1 else f"{len(args.keys)} times"
            tables = "1 table" if num_tables == 1 else f"{num_tables} tables"
            raise ClientInputError(
                f"--keys given {given} but the model has {tables}: give --keys once per table"
            )
        return [np.array(keys, dtype=np.int64) for keys in args.keys]
    if len(args.table_rows) != num_tables:
        raise ClientInputError(
            f"--table-rows has {len(args.table_rows)} entries but the model has {num_tables} tables"
        )
    if any(rows < 1 for rows in args.table_rows):
        raise ClientInputError(f"--table-rows: rows must be >= 1, got {args.table_rows}")
    rng = np.random.default_rng(args.seed)
    return [rng.integers(0, rows, size=args.random, dtype=np.int64) for rows in args.table_rows]


def _lookup(
    protocol: Protocol, client: Any, model: str, keys: np.ndarray, numkeys: np.ndarray
) -> np.ndarray:
    module = protocol.client_module
    inputs = [
        module.InferInput(KEYS_INPUT, list(keys.shape), "INT64"),
        module.InferInput(NUMKEYS_INPUT, list(numkeys.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(keys)
    inputs[1].set_data_from_numpy(numkeys)
    outputs = [module.InferRequestedOutput(OUTPUT_NAME)]
    result = client.infer(model, inputs, outputs=outputs)
    output = result.as_numpy(OUTPUT_NAME)
    if output is None:
        raise ClientInputError(f"the response of model {model!r} has no {OUTPUT_NAME}")
    return output


def run(argv: Sequence[str] | None, protocol: Protocol, prog: str | None = None) -> int:
    """Run a client script.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when ``None``.
        protocol: the protocol of the script.
        prog: program name shown in usage messages.

    Returns:
        The exit code (0 success, 1 server or connection error, 2 request or response not
        fitting the hps contract).
    """
    args = build_parser(protocol, prog).parse_args(argv)
    client = None
    try:
        client = protocol.client_module.InferenceServerClient(url=args.url, verbose=args.verbose)
        config = protocol.fetch_config(client, args.model)
        dims = _resolve_dims(args, config)
        names = table_names_from_model_config(config)
        if names is None or len(names) != len(dims):
            names = [f"table{t}" for t in range(len(dims))]
        keys_per_table = _keys_per_table(args, len(dims))
        keys, numkeys = build_request_arrays(keys_per_table)
        output = _lookup(protocol, client, args.model, keys, numkeys)
        embeddings = split_output(output, numkeys[0], dims)
    except ClientInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (InferenceServerException, OSError) as exc:
        print(f"error: {protocol.name} {args.url} model {args.model!r}: {exc}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
    tables = f"{len(dims)} table{'s' * (len(dims) != 1)}"
    print(f"model {args.model} over {protocol.name} at {args.url}: {tables}, dims {dims}")
    print(
        f"{KEYS_INPUT} shape {list(keys.shape)}, {NUMKEYS_INPUT} {numkeys[0].tolist()} -> "
        f"{OUTPUT_NAME} shape {list(output.shape)}"
    )
    for line in format_lookup(keys_per_table, embeddings, names, args.values):
        print(line)
    return 0
