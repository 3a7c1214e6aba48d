"""Look up embeddings from an hps embedding model over HTTP (tritonclient.http).

Usage:
    python client_examples/hps_http_client.py --keys 0,1,2 --keys 5,6
    python client_examples/hps_http_client.py --url host:8000 --model hps_embedding --random 4

``--keys`` is given once per table, in table order; ``--random N`` draws N keys per table
instead. See README.md in this folder for the output and the other flags.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import tritonclient.http as httpclient

# The shared modules sit next to this script; make them importable when the script is run
# from elsewhere or loaded by file path.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from hps_client_common import DEFAULT_HTTP_URL  # noqa: E402
from hps_lookup_cli import Protocol, run  # noqa: E402


def _model_config(client: httpclient.InferenceServerClient, model: str) -> Mapping:
    return client.get_model_config(model)


PROTOCOL = Protocol("HTTP", httpclient, DEFAULT_HTTP_URL, _model_config)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the HTTP client.

    Args:
        argv: arguments without the program name, e.g. ``["--url", "localhost:8000",
            "--keys", "0,1", "--keys", "5"]``; ``sys.argv[1:]`` when ``None``.

    Returns:
        0 on success, 1 if the server or connection fails, 2 if the arguments or the
        response do not fit the model's tables.
    """
    return run(argv, PROTOCOL, prog="hps_http_client.py")


if __name__ == "__main__":
    sys.exit(main())
