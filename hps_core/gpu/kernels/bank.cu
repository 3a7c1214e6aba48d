// Embedding lookup of every table of a model in one launch, and the insertion of its misses.
//
// Loaded by hps_core/gpu/kernels.py, which prepends the #defines shared with Python (WAYS, LANES,
// EMPTY_KEY, counter positions) and puts cache_set.cuh in place of its #include. The Table
// struct is mirrored by TABLE_DTYPE in hps_core/gpu/bank.py, Miss by MISS_DTYPE and Pending by
// PENDING_DTYPE there; change them together.
//
// A batch is a jagged batch of bags: bag (b, g) holds the keys of sample b in slot g (slots of
// all tables numbered together), given by CSR row offsets per table, or, for a one-hot table
// (flagged in the header after the number of samples), one key per bag. Work is slot-major (bag = g * batch + b), so the lanes of a
// block mostly serve one table. Per key, in this order:
//   1. the table's dynamic GPU cache (set-associative, 64 ways; 8 lanes probe a set at once),
//   2. the table's row index (sorted mixed keys + bucket directory, on the GPU) and its rows,
//      which live in GPU memory (static table) or in the host tier, read in place through a
//      registered mapping of its shared-memory segment (zero copy),
//   3. for a table with tiers below its host tier (Redis, RocksDB), the rows the host fetched
//      from them for this batch (sorted keys + rows in GPU memory; see bank_probe),
//   4. the table's default value.
// The bag's vectors are pooled (sum or mean, in key order) straight into the dense network's
// input buffer. Keys found in the host tier but not in the cache are recorded as misses;
// bank_insert then puts them into the cache. Nothing waits for the host.

#include "cache_set.cuh"  // i64, u64, WARP, find_way, lru_way, mix64

struct Table {
  const i64* cache_keys;      // [cache_sets * WAYS], EMPTY_KEY in free slots
  u64* cache_stamps;          // last touch, GPU global timer (ns)
  const float* cache_values;  // [cache_sets * WAYS, dim]
  int* locks;                 // [2 * cache_sets]: insert locks (0 = free), misses per set
  const u64* index_hashes;    // mix64 of every row's key, sorted (+1 padding entry)
  const void* index_starts;   // bucket directory, int32 or int64 (starts64)
  const float* values;        // [rows, dim] in index order: GPU memory or mapped host memory
  const i64* extra_keys;      // keys the host fetched from the lower tiers for this batch, sorted
  const float* extra_values;  // [extra_count, dim], GPU memory
  u64 cache_sets;             // 0: no dynamic cache
  i64 extra_count;
  i64 keys_at;                // this table's keys start at batch * keys_at in the key buffer
  i64 offsets_at;             // its row offsets start at batch * offsets_at + table index
  i64 out_at;                 // its output starts at batch * out_at + out_shift ...
  i64 out_shift;
  i64 out_stride;             // ... with out_stride elements per sample
  int slot_num;
  int dim;
  int bucket_bits;
  int starts64;
  int combiner;               // COMBINER_SUM or COMBINER_MEAN
  int host_values;            // values are in host memory (a found row is a cache miss)
  float default_value;
  int keys_cap;               // key room per sample: its keys fill at most batch * keys_cap
  int lower;                  // the table has tiers below its host tier (see bank_probe)
  int pad;                    // the struct's size stays a multiple of 8, explicitly
};

struct Miss {
  i64 key;
  const float* src;  // the row to insert (the bag's output row, or the host tier's row)
  int table;
  int pad;
};

// A key neither the cache nor the host tier holds, in a table with lower tiers.
struct Pending {
  i64 key;
  int table;
  int pad;
};

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Row of `key` in the table's index, or -1 (hps_core.tiers.hash_layout.find_rows).
__device__ __forceinline__ i64 index_row(const Table& t, const i64 key) {
  const u64 h = mix64(key);
  const i64 bucket = (i64)(h >> (64 - t.bucket_bits));
  i64 p, end;
  if (t.starts64) {
    const i64* s = (const i64*)t.index_starts;
    p = s[bucket];
    end = s[bucket + 1];
  } else {
    const int* s = (const int*)t.index_starts;
    p = s[bucket];
    end = s[bucket + 1];
  }
  for (; p < end; ++p) {
    const u64 c = t.index_hashes[p];
    if (c == h) return p;
    if (c > h) break;  // sorted inside a bucket
  }
  return -1;
}

// The row the host fetched for `key` from the lower tiers for this batch, or nullptr.
__device__ __forceinline__ const float* extra_row(const Table& t, const i64 key) {
  i64 lo = 0, hi = t.extra_count;
  while (lo < hi) {
    const i64 mid = (lo + hi) >> 1;
    if (t.extra_keys[mid] < key) lo = mid + 1; else hi = mid;
  }
  return lo < t.extra_count && t.extra_keys[lo] == key ? t.extra_values + lo * t.dim : nullptr;
}

// The cached row of `key`, or nullptr. The LANES lanes of `mask` each load WAYS / LANES of the
// set's keys (independent loads in flight), then agree through ballots; a hit stamps its slot.
__device__ __forceinline__ const float* probe_cache(const Table& t, const i64 key, const int lane,
                                                    const unsigned mask, const int shift) {
  const i64 first = (i64)(mix64(key) % t.cache_sets) * WAYS;
  i64 stored[WAYS / LANES];
#pragma unroll
  for (int j = 0; j < WAYS / LANES; ++j) stored[j] = t.cache_keys[first + j * LANES + lane];
  int way = -1;
#pragma unroll
  for (int j = 0; j < WAYS / LANES; ++j) {
    const unsigned m = (__ballot_sync(mask, stored[j] == key) >> shift) & GROUP_MASK;
    if (way < 0 && m != 0u) way = j * LANES + __ffs(m) - 1;
  }
  if (way < 0) return nullptr;
  if (lane == 0) t.cache_stamps[first + way] = now_ns();
  return t.cache_values + (first + way) * t.dim;
}

// Loads per lane issued before any store: `dst` and `src` may alias as far as the compiler
// knows, so a load/store loop would wait for each load in turn, and a row in host memory
// costs one PCIe round trip per load.
#define ROW_UNROLL 4

// dst = src (or the default value), or dst += it; the group's lanes split the row.
__device__ __forceinline__ void pool_row(float* dst, const float* src, const float fill,
                                         const int dim, const int lane, const bool first,
                                         const bool vec) {
  if (vec) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    const float4* s4 = reinterpret_cast<const float4*>(src);
    const int n = dim / 4;
    for (int base = lane; base < n; base += LANES * ROW_UNROLL) {
      float4 v[ROW_UNROLL];
#pragma unroll
      for (int u = 0; u < ROW_UNROLL; ++u) {
        const int d = base + u * LANES;
        if (d < n) v[u] = src ? s4[d] : make_float4(fill, fill, fill, fill);
      }
#pragma unroll
      for (int u = 0; u < ROW_UNROLL; ++u) {
        const int d = base + u * LANES;
        if (d >= n) break;
        if (first) {
          d4[d] = v[u];
        } else {
          float4 a = d4[d];
          a.x += v[u].x; a.y += v[u].y; a.z += v[u].z; a.w += v[u].w;
          d4[d] = a;
        }
      }
    }
  } else {
    for (int base = lane; base < dim; base += LANES * ROW_UNROLL) {
      float v[ROW_UNROLL];
#pragma unroll
      for (int u = 0; u < ROW_UNROLL; ++u) {
        const int d = base + u * LANES;
        if (d < dim) v[u] = src ? src[d] : fill;
      }
#pragma unroll
      for (int u = 0; u < ROW_UNROLL; ++u) {
        const int d = base + u * LANES;
        if (d >= dim) break;
        dst[d] = first ? v[u] : dst[d] + v[u];
      }
    }
  }
}

__device__ __forceinline__ void scale_row(float* dst, const float f, const int dim,
                                          const int lane) {
  for (int d = lane; d < dim; d += LANES) dst[d] *= f;
}

// Keys [begin, end) of table t's bag of sample b, slot s (indices into the table's keys).
__device__ __forceinline__ void bag_range(const Table& tab, const int t, const int s, const i64 b,
                                          const i64 batch, const int* __restrict__ header,
                                          const int* __restrict__ offsets, int& begin, int& end) {
  const i64 row = b * tab.slot_num + s;
  if (header[1 + t]) {  // one-hot: key `row` fills bag `row`; padded samples have none
    begin = (int)row;
    end = b < header[0] ? begin + 1 : begin;
  } else {
    const int* off = offsets + batch * tab.offsets_at + t;
    // The host checks the offsets of host batches; those of a batch handed over on the
    // device are not read back, so keep every key read inside the table's key region.
    const int cap = (int)(batch * tab.keys_cap);
    begin = min(max(off[row], 0), cap);
    end = min(max(off[row + 1], begin), cap);
  }
}

extern "C" __global__ void bank_lookup(
    const Table* __restrict__ tables, const int* __restrict__ slot_table,
    const int* __restrict__ slot_local, const int slot_begin, const int slot_end,
    const i64 batch,
    const i64* __restrict__ keys, const int* __restrict__ header,
    const int* __restrict__ offsets, float* __restrict__ out,
    Miss* __restrict__ misses, u64* __restrict__ miss_count, const u64 miss_capacity,
    u64* __restrict__ counters) {
  __shared__ u64 block_counts[4];  // C_KEYS .. C_UNKNOWN of the table of the block's first bag
  // Bag `g * batch + b` is sample b's slot g; a launch serves the slots [slot_begin, slot_end).
  const i64 first_bag = (i64)slot_begin * batch + ((i64)blockIdx.x * blockDim.x) / LANES;
  const i64 bag = first_bag + threadIdx.x / LANES;
  const int lane = threadIdx.x % LANES;
  const int shift = (threadIdx.x % WARP) / LANES * LANES;
  const unsigned mask = GROUP_MASK << shift;
  const i64 bags = batch * slot_end;
  const int block_table = first_bag < bags ? slot_table[first_bag / batch] : -1;
  if (threadIdx.x < 4) block_counts[threadIdx.x] = 0;
  __syncthreads();
  u64 n_keys = 0, n_hits = 0, n_misses = 0, n_unknown = 0;
  int t = -1;
  if (bag < bags) {  // no early return: the block meets at __syncthreads below
    const int g = (int)(bag / batch);
    const i64 b = bag - (i64)g * batch;
    t = slot_table[g];
    const Table& tab = tables[t];
    const int s = slot_local[g];
    int begin, end;
    bag_range(tab, t, s, b, batch, header, offsets, begin, end);
    const i64* bag_keys = keys + batch * tab.keys_at;
    float* dst = out + batch * tab.out_at + tab.out_shift + b * tab.out_stride + (i64)s * tab.dim;
    const bool vec = tab.dim % 4 == 0;  // the host aligns every region to 16 bytes
    for (int i = begin; i < end; ++i) {
      const i64 key = bag_keys[i];
      const float* src = nullptr;
      bool hit = false;
      if (tab.cache_sets != 0 && key != EMPTY_KEY) {
        src = probe_cache(tab, key, lane, mask, shift);
        hit = src != nullptr;
      }
      if (!hit) {
        const i64 r = index_row(tab, key);
        if (r >= 0) {
          src = tab.values + r * tab.dim;
          hit = !tab.host_values;  // a static table answers from GPU memory
        } else if (tab.extra_count != 0) {
          src = extra_row(tab, key);  // a miss, inserted like the host tier's rows
        }
      }
      pool_row(dst, src, tab.default_value, tab.dim, lane, i == begin, vec);
      if (lane == 0) {
        ++n_keys;
        if (hit) {
          ++n_hits;
        } else {
          ++n_misses;
          if (src == nullptr) ++n_unknown;
        }
        // A set takes at most WAYS new keys per batch (more would only evict each other):
        // the rank of a miss in its set caps the inserts, and with them the warps that queue
        // for one set's lock in bank_insert.
        if (!hit && src != nullptr && tab.cache_sets != 0 &&
            atomicAdd(tab.locks + tab.cache_sets + (i64)(mix64(key) % tab.cache_sets), 1) < WAYS) {
          Miss m;
          m.key = key;
          // A bag of one key holds the row itself, in GPU memory: insert from there.
          m.src = end - begin == 1 ? dst : src;
          m.table = t;
          m.pad = 0;
          // Valid batches never fill the list; clamped device offsets could (a bag may then
          // read a whole key region), so a miss past the end is not inserted.
          const u64 at = atomicAdd(miss_count, 1ull);
          if (at < miss_capacity) misses[at] = m;
        }
      }
    }
    if (begin == end) {
      pool_row(dst, nullptr, 0.0f, tab.dim, lane, true, vec);
    } else if (tab.combiner == COMBINER_MEAN && end - begin > 1) {
      __syncwarp(mask);
      scale_row(dst, 1.0f / (float)(end - begin), tab.dim, lane);
    }
  }
  if (lane == 0 && n_keys != 0) {
    if (t == block_table) {
      atomicAdd(&block_counts[C_KEYS], n_keys);
      atomicAdd(&block_counts[C_HITS], n_hits);
      atomicAdd(&block_counts[C_MISSES], n_misses);
      atomicAdd(&block_counts[C_UNKNOWN], n_unknown);
    } else {
      u64* c = counters + (i64)t * NUM_COUNTERS;
      atomicAdd(c + C_KEYS, n_keys);
      atomicAdd(c + C_HITS, n_hits);
      atomicAdd(c + C_MISSES, n_misses);
      atomicAdd(c + C_UNKNOWN, n_unknown);
    }
  }
  __syncthreads();
  if (threadIdx.x < 4 && block_table >= 0 && block_counts[threadIdx.x] != 0) {
    atomicAdd(counters + (i64)block_table * NUM_COUNTERS + threadIdx.x, block_counts[threadIdx.x]);
  }
}

// Run before bank_lookup only when a table has tiers below its host tier: records each key of
// such a table that neither its cache nor its host tier holds (repeats included; the host
// deduplicates), so that the host fetches them from the lower tiers in one round trip per
// batch and bank_lookup finds them among the table's extra rows. Bags map to lanes as in
// bank_lookup.
extern "C" __global__ void bank_probe(
    const Table* __restrict__ tables, const int* __restrict__ slot_table,
    const int* __restrict__ slot_local, const int slot_begin, const int slot_end,
    const i64 batch, const i64* __restrict__ keys, const int* __restrict__ header,
    const int* __restrict__ offsets, Pending* __restrict__ pending,
    u64* __restrict__ pending_count, const u64 pending_capacity) {
  // All LANES lanes of a bag return together: probe_cache's ballots need the whole group.
  const i64 bag = (i64)slot_begin * batch + ((i64)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
  if (bag >= batch * slot_end) return;
  const int lane = threadIdx.x % LANES;
  const int shift = (threadIdx.x % WARP) / LANES * LANES;
  const unsigned mask = GROUP_MASK << shift;
  const int g = (int)(bag / batch);
  const i64 b = bag - (i64)g * batch;
  const int t = slot_table[g];
  const Table& tab = tables[t];
  if (!tab.lower) return;
  int begin, end;
  bag_range(tab, t, slot_local[g], b, batch, header, offsets, begin, end);
  const i64* bag_keys = keys + batch * tab.keys_at;
  for (int i = begin; i < end; ++i) {
    const i64 key = bag_keys[i];
    if (tab.cache_sets != 0 && key != EMPTY_KEY &&
        probe_cache(tab, key, lane, mask, shift) != nullptr) {
      continue;
    }
    if (index_row(tab, key) >= 0) continue;
    if (lane == 0) {
      const u64 at = atomicAdd(pending_count, 1ull);
      if (at < pending_capacity) {
        Pending p;
        p.key = key;
        p.table = t;
        p.pad = 0;
        pending[at] = p;
      }
    }
  }
}

// One warp per recorded miss (grid-stride: the count is known on the GPU only; at most WAYS
// per set). The warp takes its set's lock, so misses of one set are applied one at a time in
// any order: a key already
// stored (a repeat in the batch) is only re-stamped; a new key takes a free way, else evicts
// the least recently used one. Slots are read through L2 (another SM may have just written
// them under the same lock).
extern "C" __global__ void bank_insert(const Table* __restrict__ tables,
                                       const Miss* __restrict__ misses,
                                       const u64* __restrict__ miss_count,
                                       const u64 miss_capacity, u64* __restrict__ counters) {
  const int lane = threadIdx.x % WARP;
  const i64 warps = ((i64)gridDim.x * blockDim.x) / WARP;
  const i64 n = (i64)min(*miss_count, miss_capacity);
  for (i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP; item < n; item += warps) {
    const Miss m = misses[item];
    const Table& tab = tables[m.table];
    const i64 set = (i64)(mix64(m.key) % tab.cache_sets);
    const i64 first = set * WAYS;
    int* lock = tab.locks + set;
    if (lane == 0) {
      while (atomicCAS(lock, 0, 1) != 0) __nanosleep(32);
    }
    __syncwarp();
    __threadfence();
    long long* slot_keys = const_cast<long long*>(tab.cache_keys);
    const i64 key_lo = __ldcg(slot_keys + first + lane);
    const i64 key_hi = __ldcg(slot_keys + first + WARP + lane);
    const u64 stamp_lo = __ldcg(tab.cache_stamps + first + lane);
    const u64 stamp_hi = __ldcg(tab.cache_stamps + first + WARP + lane);
    int way = find_way(key_lo, key_hi, m.key);
    bool inserted = false, evicted = false;
    if (way < 0) {
      inserted = true;
      way = find_way(key_lo, key_hi, EMPTY_KEY);
      if (way < 0) {
        way = lru_way(stamp_lo, stamp_hi, lane);
        evicted = true;
      }
      float* row = const_cast<float*>(tab.cache_values) + (first + way) * tab.dim;
      for (int base = lane; base < tab.dim; base += WARP * ROW_UNROLL) {
        float v[ROW_UNROLL];
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; ++u) {
          const int d = base + u * WARP;
          if (d < tab.dim) v[u] = m.src[d];
        }
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; ++u) {
          const int d = base + u * WARP;
          if (d < tab.dim) __stcg(row + d, v[u]);
        }
      }
    }
    if (lane == way % WARP) {
      if (inserted) __stcg(slot_keys + first + way, m.key);
      __stcg(tab.cache_stamps + first + way, now_ns());
    }
    __threadfence();
    __syncwarp();
    if (lane == 0) {
      lock[tab.cache_sets] = 0;  // the set's miss count, for the next batch
      atomicExch(lock, 0);
      u64* c = counters + (i64)m.table * NUM_COUNTERS;
      if (inserted) atomicAdd(c + C_INSERTS, 1ull);
      if (evicted) atomicAdd(c + C_EVICTIONS, 1ull);
    }
  }
}
