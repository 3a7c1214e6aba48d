// Device helpers shared by the kernels that read or write the GPU caches: those of the cache
// itself (cache.cu) and those of the GPU pipeline (bank.cu), which work on the same arrays
// (the pipeline's table descriptors point at the caches'): where a key's set starts, the probe
// of a set by a group of LANES lanes, its update by a warp, and the search of a static
// table's hash index.
//
// hps_core/cuda/kernels.py puts this file's text in place of the `#include "cache_set.cuh"` line
// (once per compile unit), so NVRTC needs no include path. WAYS, WARP, LANES and GROUP_MASK
// come from the #defines both files are compiled with (hps_core/cache/kernel_consts.py).
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

// The way `key` takes in the set a warp holds (keys and stamps as find_way and lru_way take
// them): its own where the set holds it, else the lowest free way, else the least recently
// used one. `fresh`: the set did not hold it; `evicts`: it pushes another key out.
__device__ __forceinline__ int insert_way(const i64 key_lo, const i64 key_hi, const u64 stamp_lo,
                                          const u64 stamp_hi, const i64 key, const int lane,
                                          bool& fresh, bool& evicts) {
  int way = find_way(key_lo, key_hi, key);
  fresh = way < 0;
  evicts = false;
  if (fresh) {
    way = find_way(key_lo, key_hi, EMPTY_KEY);
    if (way < 0) {
      way = lru_way(stamp_lo, stamp_hi, lane);
      evicts = true;
    }
  }
  return way;
}

// `key`'s set among `sets` sets: mix64(key) % sets, the function of
// hps_core.cache.layout.set_of.
__device__ __forceinline__ i64 set_index(const i64 key, const u64 sets) {
  return (i64)(mix64(key) % sets);
}

// First slot of `key`'s set (WAYS slots a set).
__device__ __forceinline__ i64 set_start(const i64 key, const u64 sets) {
  return set_index(key, sets) * WAYS;
}

// Way (0..WAYS-1) of `key` in the set whose slots start at `first`, or -1, found by a group
// of LANES lanes (`lane` 0..LANES-1, its bits of a warp's ballot from `shift`; `mask` the lanes
// taking part): each lane loads WAYS / LANES of the set's keys at once (independent loads, so
// several groups' probes are in flight per warp), then ballots agree on the lowest way. With
// `probe` false the group loads nothing and finds nothing, but still takes part in the ballots.
__device__ __forceinline__ int group_way(const i64* slot_keys, const i64 first, const i64 key,
                                         const int lane, const unsigned mask, const int shift,
                                         const bool probe) {
  i64 stored[WAYS / LANES];
#pragma unroll
  for (int j = 0; j < WAYS / LANES; ++j) {
    stored[j] = probe ? slot_keys[first + j * LANES + lane] : 0;
  }
  int way = -1;
#pragma unroll
  for (int j = 0; j < WAYS / LANES; ++j) {
    const unsigned m = (__ballot_sync(mask, probe && stored[j] == key) >> shift) & GROUP_MASK;
    if (way < 0 && m != 0u) way = j * LANES + __ffs(m) - 1;
  }
  return way;
}

// Row whose key hash is `h` among the sorted hashes[p, end) of its bucket, or -1.
__device__ __forceinline__ i64 row_in_bucket(const u64* __restrict__ hashes, const u64 h, i64 p,
                                             const i64 end) {
  for (; p < end; ++p) {
    const u64 candidate = hashes[p];
    if (candidate == h) return p;
    if (candidate > h) break;  // sorted inside a bucket
  }
  return -1;
}

// Row of `key` in a static table's hash index as hps_core.tiers.hash_layout lays it out (the
// rows' key hashes sorted within buckets, `starts` the bucket directory on the hash's top
// `bits` bits), or -1: the function find_rows computes.
__device__ __forceinline__ i64 hashed_row(const i64 key, const u64* __restrict__ hashes,
                                          const i64* __restrict__ starts, const int bits) {
  const u64 h = mix64(key);
  const i64 bucket = (i64)(h >> (64 - bits));
  return row_in_bucket(hashes, h, starts[bucket], starts[bucket + 1]);
}
