// Byte spans copied on the GPU in one launch: a batch handed over on the device (CuPy arrays
// of keys, row offsets and dense features) is gathered into the pipeline's input buffer by
// this kernel instead of one cudaMemcpyAsync per array (a few microseconds of host time
// each, for 26 tables and more).
//
// Loaded by hps_core/infer/gpu/uploads.py; Span is mirrored by SPAN_DTYPE in
// hps_core/cuda/structs.py.

struct Span {
  const unsigned char* src;
  unsigned char* dst;
  long long nbytes;
};

// Words of type W of span `sp`, strided over the blocks of this span's grid row.
template <typename W>
__device__ __forceinline__ void copy_words(const Span& sp) {
  const W* src = reinterpret_cast<const W*>(sp.src);
  W* dst = reinterpret_cast<W*>(sp.dst);
  const long long n = sp.nbytes / (long long)sizeof(W);
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = src[i];
  }
}

// Grid: x strides over a span, y picks the span. The widest word that divides both
// addresses and the size is used (16 bytes for arrays from CuPy's allocator).
extern "C" __global__ void copy_spans(const Span* __restrict__ spans) {
  const Span sp = spans[blockIdx.y];
  const unsigned long long bits = (unsigned long long)sp.src | (unsigned long long)sp.dst |
                                  (unsigned long long)sp.nbytes;
  if ((bits & 15) == 0) {
    copy_words<int4>(sp);
  } else if ((bits & 7) == 0) {
    copy_words<long long>(sp);
  } else if ((bits & 3) == 0) {
    copy_words<int>(sp);
  } else {
    copy_words<unsigned char>(sp);
  }
}
