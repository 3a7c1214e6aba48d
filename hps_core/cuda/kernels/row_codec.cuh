// Decoding of stored embedding rows, templated on the storage type: the kernels' side of
// hps_core/quant/rows.py (RowFormat), whose docstring fixes the layouts. A stored row is
// row_words 32-bit words:
//   STORAGE_FP32  dim floats
//   STORAGE_FP16  dim IEEE halves, zero padding to 4 bytes
//   STORAGE_INT8  dim uint8 codes, zero padding, float scale, float bias: q * scale + bias
//   STORAGE_FP8   dim E4M3fn codes, zero padding, float scale: e4m3(q) * scale
// Every decoded value is bit for bit what RowFormat.decode gives: int8 rounds q * scale + bias
// once from double (q * scale is exact there, so a contracted fma rounds the same), fp8
// multiplies in float without contraction. CuPy compiles every kernel with -ftz=true (it
// cannot be turned off), which would flush subnormal scales, biases and results to zero; the
// conversions and the fp8 product are therefore written as PTX without .ftz.
//
// hps_core/cuda/kernels.py puts this text in place of `#include "row_codec.cuh"`; STORAGE_FP32 ...
// STORAGE_FP8 come from hps_core/cache/kernel_consts.py (shared_defines).

#pragma once

// The per-row constants of a compressed row (scale 1 and bias 0 for fp32 and fp16).
struct RowScale {
  float scale;
  float bias;
};

__device__ __forceinline__ float half_to_float(const unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// E4M3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN.
__device__ __forceinline__ float e4m3_to_float(const unsigned b) {
  const unsigned sign = (b & 0x80u) << 24;
  const unsigned em = b & 0x7fu;
  if (em == 0x7fu) return __int_as_float(0x7fc00000u | sign);
  const unsigned e = em >> 3, m = em & 7u;
  // Subnormal: m * 2^-9 (exact); normal: 1.m * 2^(e - 7), built as float bits.
  const float v = e == 0u ? (float)m * 0.001953125f : __int_as_float(((e + 120u) << 23) | (m << 20));
  return __int_as_float(__float_as_int(v) | sign);
}

__device__ __forceinline__ double f32_to_f64(const float x) {
  double d;
  asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(x));
  return d;
}

__device__ __forceinline__ float f64_to_f32(const double x) {
  float f;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(x));
  return f;
}

__device__ __forceinline__ float mul_keep_subnormals(const float a, const float b) {
  float f;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(f) : "f"(a), "f"(b));
  return f;
}

template <int S>
__device__ __forceinline__ RowScale row_scale(const unsigned* row, const int dim) {
  RowScale r;
  r.scale = 1.0f;
  r.bias = 0.0f;
  if (S == STORAGE_INT8 || S == STORAGE_FP8) {
    const int at = (dim + 3) / 4;  // the scale follows the codes, padded to a word
    r.scale = __int_as_float((int)row[at]);
    if (S == STORAGE_INT8) r.bias = __int_as_float((int)row[at + 1]);
  }
  return r;
}

template <int S>
__device__ __forceinline__ float decode_code(const unsigned q, const RowScale r) {
  if (S == STORAGE_INT8) {
    return f64_to_f32(__dadd_rn(__dmul_rn((double)q, f32_to_f64(r.scale)), f32_to_f64(r.bias)));
  }
  return mul_keep_subnormals(e4m3_to_float(q), r.scale);  // STORAGE_FP8
}

// Value d of a row.
template <int S>
__device__ __forceinline__ float load_value(const unsigned* row, const int d, const RowScale r) {
  if (S == STORAGE_FP32) return reinterpret_cast<const float*>(row)[d];
  if (S == STORAGE_FP16) return half_to_float(reinterpret_cast<const unsigned short*>(row)[d]);
  return decode_code<S>(reinterpret_cast<const unsigned char*>(row)[d], r);
}

// Values 4 * d4 ... 4 * d4 + 3 of a row of whole float4s (dim % 4 == 0; the row 16-byte
// aligned for fp32, 8-byte for fp16, 4-byte for the 1-byte codes).
template <int S>
__device__ __forceinline__ float4 load_values4(const unsigned* row, const int d4,
                                               const RowScale r) {
  if (S == STORAGE_FP32) return reinterpret_cast<const float4*>(row)[d4];
  if (S == STORAGE_FP16) {
    const uint2 w = reinterpret_cast<const uint2*>(row)[d4];  // little-endian halves
    return make_float4(half_to_float((unsigned short)(w.x & 0xffffu)),
                       half_to_float((unsigned short)(w.x >> 16)),
                       half_to_float((unsigned short)(w.y & 0xffffu)),
                       half_to_float((unsigned short)(w.y >> 16)));
  }
  const unsigned w = row[d4];
  return make_float4(decode_code<S>(w & 0xffu, r), decode_code<S>((w >> 8) & 0xffu, r),
                     decode_code<S>((w >> 16) & 0xffu, r), decode_code<S>(w >> 24, r));
}

// dst[0 .. dim) = the decoded row, `lanes` lanes from `lane` on splitting it (float4 stores
// where `vectorized`).
template <int S>
__device__ __forceinline__ void decode_row(float* dst, const unsigned* src, const int dim,
                                           const int lane, const int lanes,
                                           const bool vectorized) {
  const RowScale r = row_scale<S>(src, dim);
  if (vectorized) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int d = lane; d < dim / 4; d += lanes) d4[d] = load_values4<S>(src, d, r);
  } else {
    for (int d = lane; d < dim; d += lanes) dst[d] = load_value<S>(src, d, r);
  }
}

// decode_row for the storage type named at run time.
__device__ __forceinline__ void decode_row_as(const int storage, float* dst, const unsigned* src,
                                              const int dim, const int lane, const int lanes,
                                              const bool vectorized) {
  switch (storage) {
    case STORAGE_FP16: decode_row<STORAGE_FP16>(dst, src, dim, lane, lanes, vectorized); break;
    case STORAGE_INT8: decode_row<STORAGE_INT8>(dst, src, dim, lane, lanes, vectorized); break;
    case STORAGE_FP8: decode_row<STORAGE_FP8>(dst, src, dim, lane, lanes, vectorized); break;
    default: decode_row<STORAGE_FP32>(dst, src, dim, lane, lanes, vectorized); break;
  }
}
