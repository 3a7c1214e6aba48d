"""Look up embeddings with keys and results in CUDA shared memory (gRPC, same machine, GPU).

The keys are made on the GPU (CuPy) and handed to Triton through a CUDA shared-memory
region; the server's GPU instance reads them without a host copy (its config.pbtxt sets
``FORCE_CPU_ONLY_INPUT_TENSORS: "no"``) and writes ``OUTPUT0`` into a second region, which
this client reads back as a CuPy array through DLPack. ``NUMKEYS`` (a few integers) goes in
the request body.

Usage:
    python client_examples/hps_cuda_shm_client.py --keys 0,1,99999 --keys 5,19999
    python client_examples/hps_cuda_shm_client.py --url localhost:8001 --random 1000 --device 0

Needs: cupy, tritonclient[grpc] and the CUDA Python bindings tritonclient's
``cuda_shared_memory`` module uses; a GPU model instance on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from hps_client_common import (  # noqa: E402
    DEFAULT_GRPC_URL,
    DEFAULT_MODEL,
    ClientInputError,
    format_lookup,
    parse_int_list,
    split_output,
    table_dims_from_model_config,
)


def lookup_via_cuda_shm(
    url: str, model: str, keys_per_table: Sequence[np.ndarray], device_id: int = 0
) -> list[np.ndarray]:
    """Look up keys through CUDA shared memory; returns one ``[n_t, dim_t]`` array per table.

    Args:
        url: gRPC ``host:port`` of a server on this machine.
        model: an embedding model with the ``hps`` contract and GPU instances.
        keys_per_table: int64 keys of each table.
        device_id: GPU holding the shared-memory regions.

    Returns:
        The vectors of each table, copied to the host for printing.
    """
    try:
        import cupy
        import tritonclient.utils.cuda_shared_memory as cudashm
    except ImportError as exc:
        raise ClientInputError(
            f"CUDA shared memory needs CuPy and CUDA's Python bindings ({exc}): pip install "
            "cupy-cuda12x cuda-python (or use hps_grpc_client.py, which needs neither)"
        ) from exc

    client = grpcclient.InferenceServerClient(url)
    dims = table_dims_from_model_config(client.get_model_config(model, as_json=True))
    if dims is None:
        raise ValueError(f"model '{model}' does not declare embedding_vecsize_per_table")
    counts = np.array([[len(k) for k in keys_per_table]], dtype=np.int32)
    with cupy.cuda.Device(device_id):
        keys = cupy.asarray(np.concatenate(keys_per_table).astype(np.int64)[None, :])
    total = int(sum(len(k) * d for k, d in zip(keys_per_table, dims, strict=True)))
    regions = {"hps_keys": keys.nbytes, "hps_output": total * 4}
    handles = {name: cudashm.create_shared_memory_region(name, size, device_id)
               for name, size in regions.items()}  # fmt: skip
    try:
        cudashm.set_shared_memory_region_from_dlpack(handles["hps_keys"], [keys])
        for name, size in regions.items():
            client.register_cuda_shared_memory(
                name, cudashm.get_raw_handle(handles[name]), device_id, size
            )
        inputs = [
            grpcclient.InferInput("KEYS", list(keys.shape), "INT64"),
            grpcclient.InferInput("NUMKEYS", list(counts.shape), "INT32"),
        ]
        inputs[0].set_shared_memory("hps_keys", regions["hps_keys"])
        inputs[1].set_data_from_numpy(counts)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("hps_output", regions["hps_output"])
        client.infer(model, inputs, outputs=[output])
        tensor = cudashm.as_shared_memory_tensor(handles["hps_output"], "FP32", [1, total])
        values = cupy.from_dlpack(tensor).get()
    finally:
        for name in regions:
            # A region never registered: the failure that got us here is what matters.
            with contextlib.suppress(InferenceServerException):
                client.unregister_cuda_shared_memory(name)
        for handle in handles.values():
            cudashm.destroy_shared_memory_region(handle)
        client.close()
    return split_output(values, [len(k) for k in keys_per_table], dims)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CUDA shared-memory client.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        0 on success, 1 if the server or CUDA fails.
    """
    parser = argparse.ArgumentParser(prog="hps_cuda_shm_client.py", description=__doc__)
    parser.add_argument("--url", default=DEFAULT_GRPC_URL)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", type=int, default=0, help="GPU of the shared memory")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--keys", action="append", type=parse_int_list, help="one per table")
    group.add_argument("--random", type=int, help="random keys per table (0..999)")
    parser.add_argument("--tables", type=int, default=2, help="tables, with --random")
    args = parser.parse_args(argv)
    if args.keys:
        keys = [np.asarray(k, dtype=np.int64) for k in args.keys]
    else:
        rng = np.random.default_rng(0)
        keys = [rng.integers(0, 1000, args.random) for _ in range(args.tables)]
    try:
        vectors = lookup_via_cuda_shm(args.url, args.model, keys, args.device)
    except (InferenceServerException, ClientInputError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    names = [f"table{t}" for t in range(len(keys))]
    print("\n".join(format_lookup(keys, vectors, names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
