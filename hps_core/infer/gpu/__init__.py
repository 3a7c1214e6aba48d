"""The ranking pipeline on a GPU: a batch of samples in, scores out, in one pass over the device.

Data flow of one batch (:mod:`~hps_core.infer.gpu.pipeline`)::

    SparseBatch (host) -> pinned staging (staging, uploads) -> copies to the GPU (uploads)
      (a batch of CuPy arrays: copied in place on the GPU)
      (keys below the host tier: fetched through the host, lower_tiers)
      -> bank_find / bank_pool: every table at once (bank, kernels/bank.cu): GPU cache, host
         tier read in place (host_mapping), default vectors; pooled into the dense network's
         input
      -> bank_insert: misses into the dynamic caches
      -> dense network (hps_core.nn on hps_core.cuda's products and fused kernels)
      -> one copy of the scores to the host

Each batch size (the next power of two) has a bucket of buffers and CUDA graphs (buckets); the
pipeline decides which stream runs which step and after what, each step (a kernel launch, the
dense network, a download) is a function of the bucket (kernel_steps), and the choices that
depend on the model are timed on its first batches (schedule); a host batch with many keys
runs as chunks of samples, the next staged while the GPU scores the last (chunks).
The CUDA sources and their compilation are :mod:`hps_core.cuda`'s; the constants
``kernels/bank.cu`` shares with Python are :mod:`~hps_core.infer.gpu.constants`'s, those it
also shares with the cache's ``kernels/cache.cu`` (lanes per key, threads per block, counter
positions) :mod:`hps_core.cache.kernel_consts`'s and :mod:`hps_core.cache.stats`'.

Every module but :mod:`~hps_core.infer.gpu.staging`, ``constants``, ``schedule`` and
``chunks`` needs CuPy; none is imported here, so the package imports on machines without it.
"""
