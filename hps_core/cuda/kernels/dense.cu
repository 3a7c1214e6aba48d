// Dense-network kernels that replace several array operations each (hps_core/cuda/kernels.py
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

// hps_core.nn.spec.precision.round_to_tf32: 10 mantissa bits, to nearest, ties to even.
__device__ __forceinline__ float round_tf32(const float x) {
  if (!isfinite(x)) return x;
  unsigned bits = __float_as_uint(x);
  bits += (bits >> 13) & 1u;
  bits += 0x0FFFu;
  bits &= 0xFFFFE000u;
  return __uint_as_float(bits);
}

// Four consecutive storage values, loaded in one instruction where aligned.
template <typename S> struct Quad;
template <> struct Quad<float> { typedef float4 T; };
template <> struct Quad<unsigned short> { typedef ushort4 T; };

// Sum of `v` over the warp, returned to every lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// acc += a . b over four consecutive d, in order, one fmaf per term.
__device__ __forceinline__ float dot4(const float4 a, const float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// DLRM's dot interaction laid out as HugeCTR does (hps_core.nn.layers.interaction): one block
// per sample. Output row: the MLP vector, the strictly lower triangle of the Gram matrix of the
// n = num_emb + 1 vectors (the MLP output first) row by row, one zero. Every dot product runs
// over d in order, one fmaf per term, in float32 (operands rounded to TF32 when tf32 is set).
//
// The vectors are staged in shared memory as float, one row of `stride` floats each, with zero
// rows up to 4 * R (R = ceil(n / 4)). Each thread computes the 16 dot products of a tile: rows
// ti, ti + R, ti + 2R, ti + 3R against rows tj, tj + R, ... (tj <= ti), with its sums in
// registers: 8 shared-memory loads per 16 products, where one dot product per thread took 2
// per product and was bound by shared-memory bandwidth. When dim % 4 == 0, each load fetches
// four consecutive d (stride a multiple of 4, stride / 4 odd); otherwise stride is odd. Either
// way the rows one load instruction reads across a warp (ti varying) fall in different banks.
template <typename S>
__global__ void interaction(const S* __restrict__ mlp, const i64 mlp_stride,
                            const S* __restrict__ emb, const i64 emb_stride, const int n,
                            const int dim, const int stride, S* __restrict__ out,
                            const i64 out_stride, const bool tf32) {
  extern __shared__ __align__(16) float stage[];  // [4 * R][stride]
  const i64 r = blockIdx.x;
  const int R = (n + 3) / 4;
  const bool quads = dim % 4 == 0;
  const S* m = mlp + r * mlp_stride;
  const S* e = emb + r * emb_stride;
  S* o = out + r * out_stride;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = Io<S>::load(m[d]);
    stage[d] = tf32 ? round_tf32(v) : v;
    o[d] = m[d];
  }
  const int values = (n - 1) * dim;
  if (quads && reinterpret_cast<size_t>(e) % sizeof(typename Quad<S>::T) == 0) {
    const typename Quad<S>::T* in = reinterpret_cast<const typename Quad<S>::T*>(e);
#pragma unroll 4
    for (int q = threadIdx.x; q < values / 4; q += blockDim.x) {
      const typename Quad<S>::T v = in[q];
      float4 x = make_float4(Io<S>::load(v.x), Io<S>::load(v.y), Io<S>::load(v.z),
                             Io<S>::load(v.w));
      if (tf32) {
        x = make_float4(round_tf32(x.x), round_tf32(x.y), round_tf32(x.z), round_tf32(x.w));
      }
      *reinterpret_cast<float4*>(stage + (4 * q / dim + 1) * stride + 4 * q % dim) = x;
    }
  } else {
    for (int x = threadIdx.x; x < values; x += blockDim.x) {
      const float v = Io<S>::load(e[x]);
      stage[(x / dim + 1) * stride + x % dim] = tf32 ? round_tf32(v) : v;
    }
  }
  for (int x = threadIdx.x; x < (4 * R - n) * stride; x += blockDim.x) {
    stage[n * stride + x] = 0.0f;
  }
  __syncthreads();
  const int tiles = R * (R + 1) / 2;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
    // t = ti * (ti + 1) / 2 + tj with tj <= ti.
    int ti = (int)((sqrtf(8.0f * t + 1.0f) - 1.0f) * 0.5f);
    while (ti * (ti + 1) / 2 > t) --ti;
    while ((ti + 1) * (ti + 2) / 2 <= t) ++ti;
    const int tj = t - ti * (ti + 1) / 2;
    const float* a = stage + ti * stride;
    const float* b = stage + tj * stride;
    const int step = R * stride;  // from one row of a tile to the next
    float acc[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int l = 0; l < 4; ++l) acc[k][l] = 0.0f;
    }
    if (quads) {
      for (int d = 0; d < dim; d += 4) {
        float4 av[4], bv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          av[k] = *reinterpret_cast<const float4*>(a + k * step + d);
          bv[k] = *reinterpret_cast<const float4*>(b + k * step + d);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
          for (int l = 0; l < 4; ++l) acc[k][l] = dot4(av[k], bv[l], acc[k][l]);
        }
      }
    } else {
      for (int d = 0; d < dim; ++d) {
        float av[4], bv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          av[k] = a[k * step + d];
          bv[k] = b[k * step + d];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
          for (int l = 0; l < 4; ++l) acc[k][l] = fmaf(av[k], bv[l], acc[k][l]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        // Each pair of distinct rows {x, y} is in exactly one tile (once on a diagonal tile
        // as k > l), stored at HugeCTR's position of (max, min).
        const int x = ti + R * k, y = tj + R * l;
        const int i = max(x, y), j = min(x, y);
        if (i < n && (ti != tj || k > l)) {
          o[dim + i * (i - 1) / 2 + j] = Io<S>::store(acc[k][l]);
        }
      }
    }
  }
  if (threadIdx.x == 0) o[dim + n * (n - 1) / 2] = Io<S>::store(0.0f);
}

template __global__ void interaction<float>(const float*, const i64, const float*, const i64,
                                            const int, const int, const int, float*, const i64,
                                            const bool);
template __global__ void interaction<unsigned short>(const unsigned short*, const i64,
                                                     const unsigned short*, const i64, const int,
                                                     const int, const int, unsigned short*,
                                                     const i64, const bool);

// A product with one output per row, out[r] = act(x[r, :] . w + b): a layer of one output
// (a model's last InnerProduct, DCN v1's cross weight), one warp per row (grid-stride). cuBLAS
// runs it as a split-K GEMV plus a separate reduction and bias pass, and one row at TF32 took
// six CuPy passes more to round the operands. Each lane sums every 32nd element (four at a
// time when `quads`: k % 4 == 0, x's rows and w 16-byte aligned for float, 8-byte for half) in
// float32, operands rounded to TF32 when tf32 is set; the warp adds the 32 sums in a tree; the
// bias (when has_bias) is added in float32, then the ReLU (when relu), and the result is
// rounded once to S.
template <typename S>
__global__ void row_dot(const S* __restrict__ x, const i64 ld, const i64 rows, const int k,
                        const S* __restrict__ w, const S* __restrict__ bias,
                        S* __restrict__ out, const bool has_bias, const bool relu,
                        const bool tf32, const bool quads) {
  typedef typename Quad<S>::T Q;
  const int lane = threadIdx.x % 32;
  const i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
  for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const S* xr = x + r * ld;
    float acc = 0.0f;
    if (quads) {
      const Q* xq = reinterpret_cast<const Q*>(xr);
      const Q* wq = reinterpret_cast<const Q*>(w);
      for (int q = lane; q < k / 4; q += 32) {
        const Q a = xq[q], b = wq[q];
        float4 fa = make_float4(Io<S>::load(a.x), Io<S>::load(a.y), Io<S>::load(a.z),
                                Io<S>::load(a.w));
        float4 fb = make_float4(Io<S>::load(b.x), Io<S>::load(b.y), Io<S>::load(b.z),
                                Io<S>::load(b.w));
        if (tf32) {
          fa = make_float4(round_tf32(fa.x), round_tf32(fa.y), round_tf32(fa.z), round_tf32(fa.w));
          fb = make_float4(round_tf32(fb.x), round_tf32(fb.y), round_tf32(fb.z), round_tf32(fb.w));
        }
        acc = dot4(fa, fb, acc);
      }
    } else {
      for (int c = lane; c < k; c += 32) {
        float a = Io<S>::load(xr[c]), b = Io<S>::load(w[c]);
        if (tf32) {
          a = round_tf32(a);
          b = round_tf32(b);
        }
        acc = fmaf(a, b, acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      float v = has_bias ? acc + Io<S>::load(bias[0]) : acc;
      if (relu) v = v > 0.0f ? v : 0.0f;
      out[r] = Io<S>::store(v);
    }
  }
}

template __global__ void row_dot<float>(const float*, const i64, const i64, const int,
                                        const float*, const float*, float*, const bool,
                                        const bool, const bool, const bool);
template __global__ void row_dot<unsigned short>(const unsigned short*, const i64, const i64,
                                                 const int, const unsigned short*,
                                                 const unsigned short*, unsigned short*,
                                                 const bool, const bool, const bool, const bool);

// FP32 products on TF32 tensor cores (hps_core.cuda.linear, "3xTF32"): each float32 value x
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

// A DCN v2 cross layer after its products, float4 at a time (hps_core.cuda.dense_ops.
// cross_combine): out = x0 * (y + b) + xl over [rows, d4 * 4] contiguous float32 arrays, b of
// one row; one pass over the four arrays.
extern "C" __global__ void cross_v2(const float4* __restrict__ x0, const float4* __restrict__ y,
                                    const float4* __restrict__ b, const float4* __restrict__ xl,
                                    float4* __restrict__ out, const i64 n4, const int d4) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += (i64)gridDim.x * blockDim.x) {
    const float4 a = x0[i], v = y[i], c = b[i % d4], l = xl[i];
    out[i] = make_float4(a.x * (v.x + c.x) + l.x, a.y * (v.y + c.y) + l.y,
                         a.z * (v.z + c.z) + l.z, a.w * (v.w + c.w) + l.w);
  }
}

// LayerNorm over the last axis (hps_core.nn.layers.attention.LayerNorm), one warp per row of
// `width` float32 values: mean, biased variance of the centred values, then
// (x - mean) / sqrt(var + eps) * gamma + beta.
extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ gamma,
                                      const float* __restrict__ beta, float* __restrict__ out,
                                      const i64 rows, const int width, const float eps) {
  const int lane = threadIdx.x % 32;
  const i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
  for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const float* xr = x + r * width;
    float s = 0.0f;
    for (int c = lane; c < width; c += 32) s += xr[c];
    const float mean = warp_sum(s) / (float)width;
    float q = 0.0f;
    for (int c = lane; c < width; c += 32) {
      const float d = xr[c] - mean;
      q += d * d;
    }
    const float root = sqrtf(warp_sum(q) / (float)width + eps);
    float* o = out + r * width;
    for (int c = lane; c < width; c += 32) o[c] = (xr[c] - mean) / root * gamma[c] + beta[c];
  }
}

// Softmax over the last axis, one warp per row of `width` float32 values
// (hps_core.nn.layers.activation.Softmax); with a mask, HugeCTR's masked softmax
// (hps_core.nn.layers.attention.masked_softmax): z = x * factor - (1 - mask) * 10000,
// exp(z - max z) / (sum + eps); row r of the scores [B, H, Sf, St] reads row
// (r / (H * Sf)) * Sf + r % Sf of the mask [B, 1, Sf, St].
extern "C" __global__ void softmax_rows(const float* __restrict__ x,
                                        const float* __restrict__ mask, float* __restrict__ out,
                                        const i64 rows, const int width, const int heads,
                                        const int steps, const float factor, const float eps) {
  const int lane = threadIdx.x % 32;
  const i64 warps = ((i64)gridDim.x * blockDim.x) / 32;
  for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const float* xr = x + r * width;
    const float* mr =
        mask ? mask + ((r / ((i64)heads * steps)) * steps + r % steps) * width : nullptr;
    float m = __int_as_float(0xff800000);  // -inf (NVRTC has no math.h)
    for (int c = lane; c < width; c += 32) {
      const float z = mr ? xr[c] * factor - (1.0f - mr[c]) * 10000.0f : xr[c];
      m = fmaxf(m, z);
    }
    m = warp_max(m);
    float s = 0.0f;
    for (int c = lane; c < width; c += 32) {
      const float z = mr ? xr[c] * factor - (1.0f - mr[c]) * 10000.0f : xr[c];
      s += expf(z - m);
    }
    s = warp_sum(s) + eps;
    float* o = out + r * width;
    for (int c = lane; c < width; c += 32) {
      const float z = mr ? xr[c] * factor - (1.0f - mr[c]) * 10000.0f : xr[c];
      o[c] = expf(z - m) / s;
    }
  }
}

// Column sums of x and of x * x over the rows of a row-major [rows, cols] matrix (float or
// half; DIN's Dice takes the mean and the mean square of each column over the batch), in
// float32. A block of 32 x MOMENT_ROWS threads covers 32 columns (coalesced loads) of one of
// gridDim.y ranges of rows; each range's sums go to part[0 or 1][range][cols], which
// column_moments_finish adds in range order (the same result every time, unlike atomics).
// With `samples` (not null) only the first samples[0] * per_sample rows count: the rest are
// the padding of a size bucket, whose graph replays for any number of real samples, so the
// count is read here on the device, never by the host. MOMENT_ROWS comes from dense_defines.py.
__device__ __forceinline__ i64 real_rows(const i64 rows, const int* samples,
                                         const i64 per_sample) {
  if (samples == nullptr) return rows;
  return min(rows, max((i64)samples[0], (i64)0) * per_sample);
}

template <typename T>
__global__ void column_moments(const T* __restrict__ x, const i64 rows, const int cols,
                               const int* __restrict__ samples, const i64 per_sample,
                               float* __restrict__ part) {
  __shared__ float sums[2][MOMENT_ROWS][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const i64 per = (rows + gridDim.y - 1) / gridDim.y;
  const i64 first = (i64)blockIdx.y * per;
  const i64 stop = min(real_rows(rows, samples, per_sample), first + per);
  float a = 0.0f, b = 0.0f;
  if (c < cols) {
    for (i64 r = first + threadIdx.y; r < stop; r += MOMENT_ROWS) {
      const float v = Io<T>::load(x[r * cols + c]);
      a += v;
      b += v * v;
    }
  }
  sums[0][threadIdx.y][threadIdx.x] = a;
  sums[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < MOMENT_ROWS; ++k) {
    a += sums[0][k][threadIdx.x];
    b += sums[1][k][threadIdx.x];
  }
  part[(i64)blockIdx.y * cols + c] = a;
  part[((i64)gridDim.y + blockIdx.y) * cols + c] = b;
}
template __global__ void column_moments<float>(const float*, const i64, const int, const int*,
                                               const i64, float*);
template __global__ void column_moments<unsigned short>(const unsigned short*, const i64,
                                                        const int, const int*, const i64,
                                                        float*);

// No real row (a bucket recorded before any batch): means 0, not 0 / 0.
extern "C" __global__ void column_moments_finish(const float* __restrict__ part, const int ranges,
                                                 const int cols, const i64 rows,
                                                 const int* __restrict__ samples,
                                                 const i64 per_sample, float* __restrict__ mean,
                                                 float* __restrict__ square) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float a = 0.0f, b = 0.0f;
  for (int k = 0; k < ranges; ++k) {
    a += part[(i64)k * cols + c];
    b += part[((i64)ranges + k) * cols + c];
  }
  const i64 n = real_rows(rows, samples, per_sample);
  mean[c] = n > 0 ? a / (float)n : 0.0f;
  square[c] = n > 0 ? b / (float)n : 0.0f;
}

// Up to CONCAT_INPUTS inputs concatenated along their rows, in units U (4 or 2 bytes), a thread
// per output unit: output row o (out_width units apart) takes, from column `first` on, the c_k
// units of row src(o) = (o / per) * group + first_row + o % per of each input k in turn (its
// rows t_k units apart). A concatenation has per = rows, group = 0, first_row = 0 (row o of
// every input); FusedReshapeConcat's history takes per = S - 1 rows of every group of S
// (first_row 0), its target per = 1 of S (first_row S - 1). One launch replaces one copy per
// input (and, for FusedReshapeConcat, the copies of the history's and target's strided rows).
// A thread per unit rather than a warp per row: DIN's rows are 8 units per input, which left a
// warp three quarters idle and a row's inputs one after the other. Index arithmetic in I
// (32-bit when every index fits: 64-bit divisions cost tens of instructions per unit).
static_assert(CONCAT_INPUTS == 8, "concat_rows takes eight inputs' arguments");
template <typename U, typename I>
__device__ __forceinline__ void concat_units(U* __restrict__ out, const I rows, const I out_width,
                                             const I first, const I per, const I group,
                                             const I first_row, const int n,
                                             const U* const (&src)[CONCAT_INPUTS],
                                             const int (&width)[CONCAT_INPUTS],
                                             const i64 (&stride)[CONCAT_INPUTS]) {
  I chunk = 0;  // units per row this launch writes
#pragma unroll
  for (int k = 0; k < CONCAT_INPUTS; ++k) chunk += k < n ? (I)width[k] : (I)0;
  const I total = rows * chunk;
  const I step = (I)gridDim.x * blockDim.x;
  for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const I o = e / chunk;
    I c = e - o * chunk;
    const I r = (o / per) * group + first_row + o % per;
    U* dst = out + (i64)o * out_width + first + c;
#pragma unroll
    for (int k = 0; k < CONCAT_INPUTS; ++k) {  // constant indices: the arrays stay in registers
      if (k < n && c < (I)width[k]) {
        *dst = src[k][(i64)r * stride[k] + c];
        break;
      }
      c -= (I)width[k];
    }
  }
}

template <typename U>
__global__ void concat_rows(U* __restrict__ out, const i64 rows, const i64 out_width,
                            const int first, const i64 per, const i64 group, const i64 first_row,
                            const int n, const U* s0, const U* s1, const U* s2, const U* s3,
                            const U* s4, const U* s5, const U* s6, const U* s7, const int c0,
                            const int c1, const int c2, const int c3, const int c4, const int c5,
                            const int c6, const int c7, const i64 t0, const i64 t1, const i64 t2,
                            const i64 t3, const i64 t4, const i64 t5, const i64 t6,
                            const i64 t7) {
  const U* const src[CONCAT_INPUTS] = {s0, s1, s2, s3, s4, s5, s6, s7};
  const int width[CONCAT_INPUTS] = {c0, c1, c2, c3, c4, c5, c6, c7};
  const i64 stride[CONCAT_INPUTS] = {t0, t1, t2, t3, t4, t5, t6, t7};
  // Every unit index and row fits 32 bits when the output's units and the source rows do.
  const i64 last_row = (rows / (per > 0 ? per : 1) + 1) * group + first_row + per;
  if (rows * out_width < 0x7fffffffLL && last_row < 0x7fffffffLL) {
    concat_units<U, unsigned>(out, (unsigned)rows, (unsigned)out_width, (unsigned)first,
                              (unsigned)per, (unsigned)group, (unsigned)first_row, n, src, width,
                              stride);
  } else {
    concat_units<U, i64>(out, rows, out_width, (i64)first, per, group, first_row, n, src, width,
                         stride);
  }
}

template __global__ void concat_rows<unsigned>(
    unsigned*, const i64, const i64, const int, const i64, const i64, const i64, const int,
    const unsigned*, const unsigned*, const unsigned*, const unsigned*, const unsigned*,
    const unsigned*, const unsigned*, const unsigned*, const int, const int, const int, const int,
    const int, const int, const int, const int, const i64, const i64, const i64, const i64,
    const i64, const i64, const i64, const i64);
template __global__ void concat_rows<unsigned short>(
    unsigned short*, const i64, const i64, const int, const i64, const i64, const i64, const int,
    const unsigned short*, const unsigned short*, const unsigned short*, const unsigned short*,
    const unsigned short*, const unsigned short*, const unsigned short*, const unsigned short*,
    const int, const int, const int, const int, const int, const int, const int, const int,
    const i64, const i64, const i64, const i64, const i64, const i64, const i64, const i64);
