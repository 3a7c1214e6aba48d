// The dynamic cache's kernels (cache_query, cache_replace, cache_update) and the static
// table's (static_query, static_find); semantics in hps_core/cache/dynamic.py and
// hps_core/cache/static_table.py, the NumPy twin in tests/unit/cache/cache_twin.py.
//
// Loaded by hps_core/cache/cupy_cache.py through hps_core/cuda/kernels.py, which prepends the
// #defines shared with Python and with bank.cu (WAYS, EMPTY_KEY, THREADS, LANES, GROUP_MASK and
// the counter positions HITS ... NUM_COUNTERS of hps_core/cache/stats.py, all written by
// shared_defines in hps_core/cache/kernel_consts.py) and puts cache_set.cuh in place of its
// #include. The kernels add to HITS, MISSES, RESERVED_KEY_MISSES, INSERTS, EVICTIONS and
// UPDATED; the other positions of the counter array are bank.cu's and stay 0.
//
// Work split: cache_query gives each key a group of LANES (8) lanes (4 keys per warp), each
// lane loading 8 of the set's 64 slot keys, so that many probes are in flight; ballots find
// the key (group_way of cache_set.cuh, the probe bank.cu's bank_find makes too).
// static_query gives each key LANES lanes too. cache_replace and cache_update use one
// warp per work item, lane l holding slots l and l + 32 of a set, with one item per run of a
// hps_core.cache.layout.RunPlan, and walk the run in batch order, so no two warps touch the
// same set and no locks are needed.
//
// Rows are stored as hps_core/quant/rows.py lays them out (row_words 32-bit words each):
// cache_replace and cache_update copy stored rows word for word, cache_query and static_query
// decode them to float32 (row_codec.cuh) for the storage type they are given.

#include "cache_set.cuh"
#include "row_codec.cuh"

// All lanes of a warp share one work item index.
__device__ __forceinline__ i64 warp_item() {
  return ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
}

// A stored row of `words` 32-bit words copied by a warp.
__device__ __forceinline__ void copy_row(unsigned* dst, const unsigned* src, const int words,
                                         const int lane) {
  for (int w = lane; w < words; w += WARP) dst[w] = src[w];
}

// Eight lanes per key, four keys per warp: each lane loads 8 of the set's 64 slot keys at once
// (independent loads, so four keys' probes are in flight per warp instead of one), then the
// group copies the row. Hit rows of `out` get the stored vector, miss rows are not written.
// A hit stamps its slot with clock + position; atomicMax keeps the later of duplicate keys.
// The set is computed here and the counters are summed per block (one atomic per block), so
// a query is a single launch.
extern "C" __global__ void cache_query(
    const i64* __restrict__ keys, const i64 n, const u64 num_sets,
    const i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps,
    const unsigned* __restrict__ slot_values, const int dim, const int words, const int storage,
    const u64 clock, float* __restrict__ out, bool* __restrict__ hit,
    i64* __restrict__ counters, const bool vectorized) {
  const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
  const int lane = threadIdx.x % LANES;
  const int group_shift = (threadIdx.x % WARP) / LANES * LANES;
  const bool valid = item < n;  // no early return: every lane takes part in ballots and counts
  const i64 key = valid ? keys[item] : EMPTY_KEY;
  const bool probe = valid && key != EMPTY_KEY;
  const i64 first = probe ? set_start(key, num_sets) : 0;
  const int way = group_way(slot_keys, first, key, lane, FULL_MASK, group_shift, probe);
  if (valid && lane == 0) {
    hit[item] = way >= 0;
    if (way >= 0) atomicMax(&slot_stamps[first + way], clock + (u64)item);
  }
  if (way >= 0) {
    // `vectorized` (16-byte stores) needs a width of whole float4s and aligned rows.
    decode_row_as(storage, out + item * dim, slot_values + (first + way) * words, dim, lane,
                  LANES, vectorized);
  }
  const int hits = __syncthreads_count(valid && lane == 0 && way >= 0);
  const int misses = __syncthreads_count(valid && lane == 0 && way < 0);
  const int reserved = __syncthreads_count(valid && lane == 0 && key == EMPTY_KEY);
  if (threadIdx.x == 0) {
    if (hits) atomicAdd((u64*)&counters[HITS], (u64)hits);
    if (misses) atomicAdd((u64*)&counters[MISSES], (u64)misses);
    if (reserved) atomicAdd((u64*)&counters[RESERVED_KEY_MISSES], (u64)reserved);
  }
}

// One warp per run (one set). The set's keys and stamps stay in registers while the warp
// applies the run's keys in batch order: a stored key gets a new stamp; a new key takes the
// lowest empty way, else evicts the LRU way, and its vector is copied in.
extern "C" __global__ void cache_replace(
    const i64* __restrict__ keys, const unsigned* __restrict__ values,
    const i64* __restrict__ order, const i64* __restrict__ bounds, const i64 runs,
    const i64* __restrict__ sets, i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps,
    unsigned* __restrict__ slot_values, const int words, const u64 clock,
    i64* __restrict__ counters) {
  const i64 run = warp_item();
  if (run >= runs) return;
  const int lane = threadIdx.x % WARP;
  const i64 begin = bounds[run];
  const i64 end = bounds[run + 1];
  const i64 first = sets[order[begin]] * WAYS;
  i64 key_lo = slot_keys[first + lane];
  i64 key_hi = slot_keys[first + WARP + lane];
  u64 stamp_lo = slot_stamps[first + lane];
  u64 stamp_hi = slot_stamps[first + WARP + lane];
  u64 inserted = 0;
  u64 evicted = 0;
  for (i64 i = begin; i < end; ++i) {
    const i64 pos = order[i];
    const i64 key = keys[pos];
    const u64 stamp = clock + (u64)pos;
    bool fresh, evicts;
    const int way = insert_way(key_lo, key_hi, stamp_lo, stamp_hi, key, lane, fresh, evicts);
    if (fresh) {
      inserted += 1;
      evicted += evicts;
      copy_row(slot_values + (first + way) * words, values + pos * words, words, lane);
    }
    if (lane == way % WARP) {
      if (way < WARP) {
        key_lo = key;
        stamp_lo = stamp;
      } else {
        key_hi = key;
        stamp_hi = stamp;
      }
    }
  }
  slot_keys[first + lane] = key_lo;
  slot_keys[first + WARP + lane] = key_hi;
  slot_stamps[first + lane] = stamp_lo;
  slot_stamps[first + WARP + lane] = stamp_hi;
  if (lane == 0) {
    atomicAdd((u64*)&counters[INSERTS], inserted);
    atomicAdd((u64*)&counters[EVICTIONS], evicted);
  }
}

// One warp per run (one set): overwrite the vectors of stored keys in batch order, so the
// last occurrence of a duplicated key wins. Stamps are not touched.
extern "C" __global__ void cache_update(
    const i64* __restrict__ keys, const unsigned* __restrict__ values,
    const i64* __restrict__ order, const i64* __restrict__ bounds, const i64 runs,
    const i64* __restrict__ sets, const i64* __restrict__ slot_keys,
    unsigned* __restrict__ slot_values, const int words, i64* __restrict__ counters) {
  const i64 run = warp_item();
  if (run >= runs) return;
  const int lane = threadIdx.x % WARP;
  const i64 begin = bounds[run];
  const i64 end = bounds[run + 1];
  const i64 first = sets[order[begin]] * WAYS;
  const i64 key_lo = slot_keys[first + lane];
  const i64 key_hi = slot_keys[first + WARP + lane];
  u64 updated = 0;
  for (i64 i = begin; i < end; ++i) {
    const i64 pos = order[i];
    const int way = find_way(key_lo, key_hi, keys[pos]);
    if (way >= 0) {
      copy_row(slot_values + (first + way) * words, values + pos * words, words, lane);
      ++updated;
    }
  }
  if (lane == 0) atomicAdd((u64*)&counters[UPDATED], updated);
}

// Static table query: LANES lanes per key probe its bucket (the same addresses, served
// once) and copy the row; counters summed per block. Miss rows of `out` are not written.
extern "C" __global__ void static_query(
    const i64* __restrict__ keys, const i64 n, const u64* __restrict__ hashes,
    const i64* __restrict__ starts, const int bits, const unsigned* __restrict__ values,
    const int dim, const int words, const int storage, float* __restrict__ out,
    bool* __restrict__ hit, i64* __restrict__ counters, const bool vectorized) {
  const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
  const int lane = threadIdx.x % LANES;
  const bool valid = item < n;
  const i64 row = valid ? hashed_row(keys[item], hashes, starts, bits) : -1;
  if (valid && lane == 0) hit[item] = row >= 0;
  if (row >= 0) {
    decode_row_as(storage, out + item * dim, values + row * words, dim, lane, LANES, vectorized);
  }
  const int hits = __syncthreads_count(valid && lane == 0 && row >= 0);
  const int misses = __syncthreads_count(valid && lane == 0 && row < 0);
  if (threadIdx.x == 0) {
    if (hits) atomicAdd((u64*)&counters[HITS], (u64)hits);
    if (misses) atomicAdd((u64*)&counters[MISSES], (u64)misses);
  }
}

// Row of each key in a static table, or -1 (one thread per key).
extern "C" __global__ void static_find(
    const i64* __restrict__ keys, const i64 n, const u64* __restrict__ hashes,
    const i64* __restrict__ starts, const int bits, i64* __restrict__ rows) {
  const i64 item = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (item < n) rows[item] = hashed_row(keys[item], hashes, starts, bits);
}
