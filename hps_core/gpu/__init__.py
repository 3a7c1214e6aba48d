"""The ranking pipeline on a GPU: a batch of samples in, scores out, in one pass over the device.

Data flow of one batch (:mod:`~hps_core.gpu.pipeline`)::

    SparseBatch (host) -> pinned staging (staging) -> copies to the GPU, group by group
      (a batch of CuPy arrays: copied in place on the GPU)
      -> bank_lookup: every table at once (bank, kernels/bank.cu): GPU cache, host tier read
         in place (host_mapping), default vectors; pooled into the dense network's input
      -> bank_insert: misses into the dynamic caches, beside the dense network
      -> dense network: fully connected layers as cuBLASLt calls with bias and ReLU in the
         epilogue (linear), other products on cuBLAS (blas), the interaction one kernel
         (dense_ops, kernels/dense.cu)
      -> one copy of the scores to the host

The CUDA sources are ``kernels/*.cu``, compiled at run time by :mod:`~hps_core.gpu.kernels`;
``kernels/cache.cu`` holds the kernels of :mod:`hps_core.cache`'s GPU cache, which share the
set-probing helpers of ``kernels/cache_set.cuh`` with ``kernels/bank.cu``.

Every module but :mod:`~hps_core.gpu.staging` needs CuPy (:mod:`~hps_core.gpu.kernels` only to
compile); none is imported here, so the package imports on machines without it.
"""
