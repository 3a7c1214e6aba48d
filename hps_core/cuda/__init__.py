"""CUDA primitives: kernel sources and their compilation, cuBLAS and cuBLASLt access, and the
dense network's fused kernels.

- :mod:`~hps_core.cuda.kernels`: ``kernels/*.cu`` compiled at run time (NVRTC through CuPy),
  their shared constants written as ``#define`` lines by one function;
- :mod:`~hps_core.cuda.blas`, :mod:`~hps_core.cuda.linear`: matrix products (cuBLAS, and
  cuBLASLt with bias and activation in the epilogue);
- :mod:`~hps_core.cuda.dense_ops`: layers in one kernel each (the interaction, the cross
  network's combine, LayerNorm, softmax, Dice, sigmoid), compiled with
  :mod:`~hps_core.cuda.dense_defines`' constants;
- :mod:`~hps_core.cuda.structs`: NumPy mirrors of the structs ``bank.cu`` and ``copy.cu`` read
  and write.

The constants the cache's and the pipeline's kernels share with Python (ways, lanes, threads,
counter positions) are owned by :mod:`hps_core.cache.kernel_consts` and
:mod:`hps_core.infer.gpu.constants` (what they mean is the cache's and the pipeline's) and
written by :func:`~hps_core.cuda.kernels.define_lines`, here.

Used by :mod:`hps_core.nn` (layers on the GPU), :mod:`hps_core.cache` (the GPU caches'
kernels) and :mod:`hps_core.infer.gpu` (the ranking pipeline); imports nothing above
:mod:`hps_core.errors`. No module is imported here, so the package imports without CuPy.
"""
