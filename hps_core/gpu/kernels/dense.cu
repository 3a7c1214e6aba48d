// Dense-network kernels that replace several array operations each (hps_core/gpu/kernels.py
// loads this file; templates are instantiated for float and for half, held as unsigned short).

typedef long long i64;

template <typename S> struct Io;
template <> struct Io<float> {
  static __device__ __forceinline__ float load(const float v) { return v; }
  static __device__ __forceinline__ float store(const float v) { return v; }
};
template <> struct Io<unsigned short> {  // IEEE half, converted with PTX (no cuda_fp16.h needed)
  static __device__ __forceinline__ float load(const unsigned short v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ __forceinline__ unsigned short store(const float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
};

// hps_core.nn.precision.round_to_tf32: 10 mantissa bits, to nearest, ties to even.
__device__ __forceinline__ float round_tf32(const float x) {
  if (!isfinite(x)) return x;
  unsigned bits = __float_as_uint(x);
  bits += (bits >> 13) & 1u;
  bits += 0x0FFFu;
  bits &= 0xFFFFE000u;
  return __uint_as_float(bits);
}

// DLRM's dot interaction laid out as HugeCTR does (hps_core.nn.layers.interaction): one block
// per sample. The n = num_emb + 1 vectors (the bottom MLP's output first) are staged in shared
// memory as float, rows padded by one so that threads reading different rows hit different
// banks; each thread computes whole dot products of the strictly lower triangle, in float32
// (operands rounded to TF32 when tf32 is set). Output row: the MLP vector, the triangle row by
// row, one zero.
template <typename S>
__global__ void interaction(const S* __restrict__ mlp, const i64 mlp_stride,
                            const S* __restrict__ emb, const i64 emb_stride,
                            const int* __restrict__ pairs, const int n, const int dim,
                            S* __restrict__ out, const i64 out_stride, const bool tf32) {
  extern __shared__ float stage[];  // [n][dim + 1]
  const i64 r = blockIdx.x;
  const int width = dim + 1;
  const S* m = mlp + r * mlp_stride;
  const S* e = emb + r * emb_stride;
  S* o = out + r * out_stride;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = Io<S>::load(m[d]);
    stage[d] = tf32 ? round_tf32(v) : v;
    o[d] = m[d];
  }
  for (int x = threadIdx.x; x < (n - 1) * dim; x += blockDim.x) {
    const int row = x / dim + 1;
    const float v = Io<S>::load(e[x]);
    stage[row * width + x % dim] = tf32 ? round_tf32(v) : v;
  }
  __syncthreads();
  const int num_pairs = n * (n - 1) / 2;
  for (int p = threadIdx.x; p < num_pairs; p += blockDim.x) {
    const float* a = stage + pairs[2 * p] * width;
    const float* b = stage + pairs[2 * p + 1] * width;
    float acc = 0.0f;
    for (int d = 0; d < dim; ++d) acc = fmaf(a[d], b[d], acc);
    o[dim + p] = Io<S>::store(acc);
  }
  if (threadIdx.x == 0) o[dim + num_pairs] = Io<S>::store(0.0f);
}

template __global__ void interaction<float>(const float*, const i64, const float*, const i64,
                                            const int*, const int, const int, float*, const i64,
                                            const bool);
template __global__ void interaction<unsigned short>(const unsigned short*, const i64,
                                                     const unsigned short*, const i64,
                                                     const int*, const int, const int,
                                                     unsigned short*, const i64, const bool);

// FP32 products on TF32 tensor cores (hps_core.gpu.linear, "3xTF32"): each float32 value x
// of a [rows, cols] matrix (row stride ld) becomes hi = round_tf32(x) and lo =
// round_tf32(x - hi), so that x = hi + lo to about 2^-22 relative and each part passes a
// TF32 product unchanged. Up to three planes of [rows, out_cols] are written at
// out + r * out_ld + c + at_*, each skipped when its offset is negative: lo, hi, and hi_finite
// (hi where x is finite, else 0: the correction products must not turn inf * 0 into a NaN the
// float32 product would not have). Columns from cols to out_cols are zero padding.
extern "C" __global__ void split_tf32(const float* __restrict__ x, const i64 ld, const i64 rows,
                                      const i64 cols, const i64 out_cols,
                                      float* __restrict__ out, const i64 out_ld, const i64 at_lo,
                                      const i64 at_hi, const i64 at_hi_finite) {
  const i64 n = rows * out_cols;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (i64)gridDim.x * blockDim.x) {
    const i64 r = i / out_cols, c = i - r * out_cols;
    const float v = c < cols ? x[r * ld + c] : 0.0f;
    const bool finite = isfinite(v);
    float hi = round_tf32(v);
    // Rounding up past the largest float32 would leave x = inf + (-inf): truncate instead.
    if (finite && !isfinite(hi)) hi = __uint_as_float(__float_as_uint(v) & 0xFFFFE000u);
    float* o = out + r * out_ld + c;
    if (at_lo >= 0) o[at_lo] = finite ? round_tf32(v - hi) : 0.0f;
    if (at_hi >= 0) o[at_hi] = hi;
    if (at_hi_finite >= 0) o[at_hi_finite] = finite ? hi : 0.0f;
  }
}
