// Device helpers shared by the kernels that work on a 64-way set of a dynamic cache: those of
// the cache itself (cache.cu) and those of the GPU pipeline (bank.cu).
//
// hps_core/cuda/kernels.py puts this file's text in place of the `#include "cache_set.cuh"` line
// (once per compile unit), so NVRTC needs no include path. It needs no #define from Python.
// A set is held by one warp with lane `l` holding ways `l` (lo) and `l + 32` (hi).

#pragma once

typedef long long i64;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// Way (0..63) of `key` in the set whose way `lane` is `lo` and way `lane + 32` is `hi` in this
// lane, or -1. The lowest matching way wins.
__device__ __forceinline__ int find_way(const i64 lo, const i64 hi, const i64 key) {
  const unsigned in_lo = __ballot_sync(FULL_MASK, lo == key);
  const unsigned in_hi = __ballot_sync(FULL_MASK, hi == key);
  if (in_lo != 0u) return __ffs(in_lo) - 1;
  if (in_hi != 0u) return WARP + __ffs(in_hi) - 1;
  return -1;
}

// Least recently used way: the smallest (stamp, way) of the set, returned to every lane.
__device__ __forceinline__ int lru_way(const u64 lo, const u64 hi, const int lane) {
  u64 best = lo;
  int way = lane;
  if (hi < best) {
    best = hi;
    way = lane + WARP;
  }
  for (int offset = WARP / 2; offset > 0; offset /= 2) {
    const u64 other = __shfl_xor_sync(FULL_MASK, best, offset);
    const int other_way = __shfl_xor_sync(FULL_MASK, way, offset);
    if (other < best || (other == best && other_way < way)) {
      best = other;
      way = other_way;
    }
  }
  return way;
}

// hps_core.hashing.mix64 (SplitMix64's finaliser, a bijection).
__device__ __forceinline__ u64 mix64(const i64 key) {
  u64 z = (u64)key;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
