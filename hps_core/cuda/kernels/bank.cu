// Embedding lookup of every table of a model, in three launches for all tables, and the
// insertion of its misses into the dynamic caches.
//
// Loaded by hps_core/cuda/kernels.py, which prepends the #defines shared with Python (written by
// bank_defines in hps_core/infer/gpu/constants.py: those shared with cache.cu, WAYS, EMPTY_KEY,
// THREADS, LANES, GROUP_MASK and the counter positions HITS ... NUM_COUNTERS of
// hps_core/cache/stats.py, from shared_defines in hps_core/cache/kernel_consts.py; then the
// combiners and state positions) and puts cache_set.cuh in place of its #include. The kernels
// add to each table's row of NUM_COUNTERS counters at KEYS, HITS, MISSES, UNKNOWN, HOST_ROWS
// (bank_find), INSERTS and EVICTIONS (bank_insert); the other positions are cache.cu's and
// stay 0. The Table struct is mirrored by TABLE_DTYPE in hps_core/cuda/structs.py, Miss by
// MISS_DTYPE and Pending by PENDING_DTYPE there; change them together.
//
// A batch is a jagged batch of bags: bag (b, s) holds the keys of sample b in slot s of a
// table. The header (int32) holds the number of real samples, whether the keys are laid out
// sample-major, then per table its fixed hotness h (every slot holds h keys: key j of the table
// fills bag j / h) or 0 (CSR row offsets say where each bag starts). Keys are laid out either
// table-major (table t's keys from batch * keys_at on, in bag order) or, when every table has
// a fixed hotness filling its key room (keys_cap = slot_num * h), sample-major as requests carry
// them: sample b's keys of table t at b * key_room + keys_at, key_room the keys per sample of
// all tables. Either way `key_pos` gives the position of key j of table t.
//
// 1. bank_find, one group of LANES lanes per key position (so a bag of 100 keys is 100
//    groups, not one serial loop): where the key's row is, written to rows[position]:
//      the table's dynamic GPU cache (set-associative, 64 ways; the group probes a set at once),
//      else its row index (sorted mixed keys + bucket directory, on the GPU) into its rows,
//        which live in GPU memory (static table) or in the host tier, read in place through a
//        registered mapping of its shared-memory segment (zero copy),
//      else, for a table with tiers below its host tier, the rows the host fetched from them for
//        this batch (see bank_probe),
//      else nothing: the table's default value.
//    A key answered from outside GPU memory for a table with a dynamic cache is a miss: the
//    first group to meet it claims it in the table's miss set (a hash set of the batch's
//    misses), copies its row once into the table's staging rows in GPU memory, and lists it for
//    bank_insert; every other occurrence of the key in the batch refers to the claim and reads
//    the staged row. So a row crosses PCIe once per batch however often the batch repeats it.
// 2. bank_pool, one launch per part of a batch, a group of lanes per bag (several groups for
//    long bags; a group per LANES samples of a one-key slot): the bag's rows pooled (sum or
//    mean, in key order) in registers and written once, straight into the dense network's
//    input.
// 3. bank_insert, one warp per listed miss: the staged row goes into the cache (set lock, a
//    free way or the least recently used one), and the miss set is emptied for the next batch.
// Nothing waits for the host.

#include "cache_set.cuh"  // i64, u64, find_way, lru_way, mix64, set_index, group_way, ...
#include "row_codec.cuh"  // RowScale, row_scale, load_values4, load_value

// Every row (cache slots, host tier, static table, staging, extra rows) is a stored row of
// row_words 32-bit words in the table's storage type (hps_core/quant/rows.py): bank_find and
// bank_insert copy its words, bank_pool decodes it to float32 as it pools.
struct Table {
  const i64* cache_keys;      // [cache_sets * WAYS], EMPTY_KEY in free slots
  u64* cache_stamps;          // last touch, GPU global timer (ns)
  const unsigned* cache_values;  // [cache_sets * WAYS, row_words]
  int* locks;                 // [2 * cache_sets]: insert locks (0 = free), new misses per set
  const u64* index_hashes;    // mix64 of every row's key, sorted (+1 padding entry)
  const void* index_starts;   // bucket directory, int32 or int64 (starts64)
  const void* index_positions;  // row of each index entry, int32 or int64 (starts64); nullptr:
                                // the rows are in index order (a static table)
  const unsigned* values;     // [rows, row_words]: GPU or mapped host memory
  const i64* extra_keys;      // keys the host fetched from the lower tiers for this batch, sorted
  const unsigned* extra_values;  // [extra_count, row_words], GPU memory
  i64* miss_keys;             // [miss_slots]: the miss set's keys, EMPTY_KEY in free slots
  const unsigned** miss_rows;  // [miss_slots]: the row every occurrence of a claimed key reads
  unsigned* staging;          // [staging_rows, row_words]: GPU copies of the batch's missed rows
  u64 cache_sets;             // 0: no dynamic cache
  i64 extra_count;
  i64 keys_at;                // see key_pos
  i64 offsets_at;             // its row offsets start at batch * offsets_at + table index
  i64 out_at;                 // its output starts at batch * out_at + out_shift ...
  i64 out_shift;
  i64 out_stride;             // ... with out_stride elements per sample
  i64 miss_slots;             // a power of two; 0: no miss set (no dynamic cache)
  i64 staging_rows;
  int slot_num;
  int dim;
  int bucket_bits;
  int starts64;
  int combiner;               // COMBINER_SUM or COMBINER_MEAN
  int host_values;            // values are in host memory (a found row is a cache miss)
  float default_value;
  int keys_cap;               // key room per sample: its keys fill at most batch * keys_cap
  int lower;                  // the table has tiers below its host tier (see bank_probe)
  int row_words;              // 32-bit words of a stored row
  int storage;                // STORAGE_FP32, STORAGE_FP16, STORAGE_INT8 or STORAGE_FP8
  int pad;                    // the struct's size stays a multiple of 8, explicitly
};

// A key claimed in its table's miss set: its row in GPU memory and whether to cache it.
struct Miss {
  i64 key;
  const unsigned* src;  // the staged row (or, with the staging rows full, the host tier's)
  i64 slot;          // its entry in the table's miss set
  int table;
  int insert;        // 1: put it into the cache (a staged row among the first WAYS of its set)
};

// A key neither the cache nor the host tier holds, in a table with lower tiers.
struct Pending {
  i64 key;
  int table;
  int pad;
};

// The most entries of a miss set one key looks at before it gives up deduplicating (its row is
// then read in place and not cached): the sets are sized at least twice their staging rows.
#define MISS_PROBES 64
// Tables whose counts bank_find sums per block in shared memory (the others' go straight to
// the global counters).
#define BLOCK_TABLES 64
// bank_find's result for an occurrence of a key claimed by another group: the claim's entry,
// tagged in the low bit (rows are 4-byte aligned), resolved by bank_pool through miss_rows.
#define CLAIM_TAG 1ull

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The batch's header: samples, whether keys are sample-major, then each table's hotness.
__device__ __forceinline__ int hotness_of(const int* header, const int t) { return header[2 + t]; }

// Position in the key buffer of key j of table t (j in the table's bag order).
__device__ __forceinline__ i64 key_pos(const Table& tab, const int t, const i64 j,
                                       const i64 batch, const int* __restrict__ header,
                                       const int key_room) {
  if (header[1]) {  // sample-major: the table's keys of a sample are contiguous, keys_cap of them
    const i64 b = j / tab.keys_cap;
    return b * key_room + tab.keys_at + (j - b * tab.keys_cap);
  }
  return batch * tab.keys_at + j;
}

// Keys of table t in this batch (positions beyond hold padding or an older batch's keys).
__device__ __forceinline__ i64 table_keys(const Table& tab, const int t, const i64 batch,
                                          const int* __restrict__ header,
                                          const int* __restrict__ offsets) {
  const int h = hotness_of(header, t);
  const i64 cap = batch * tab.keys_cap;
  if (h > 0) return min((i64)header[0] * tab.slot_num * h, cap);
  // The host checks the offsets of host batches; those of a batch handed over on the device
  // are not read back, so keep every key read inside the table's key region.
  const i64 last = offsets[batch * tab.offsets_at + t + batch * tab.slot_num];
  return min(max(last, (i64)0), cap);
}

// Keys [begin, end) of table t's bag of sample b, slot s (indices in the table's bag order).
__device__ __forceinline__ void bag_range(const Table& tab, const int t, const int s, const i64 b,
                                          const i64 batch, const int* __restrict__ header,
                                          const int* __restrict__ offsets, i64& begin, i64& end) {
  const i64 row = b * tab.slot_num + s;
  const int h = hotness_of(header, t);
  if (h > 0) {  // fixed hotness: padded samples have none
    begin = row * h;
    end = b < header[0] ? begin + h : begin;
  } else {
    const int* off = offsets + batch * tab.offsets_at + t;
    const i64 cap = batch * tab.keys_cap;
    begin = min(max((i64)off[row], (i64)0), cap);
    end = min(max((i64)off[row + 1], begin), cap);
  }
}

// Row of `key` in the table's values, or -1 (hps_core.tiers.hash_layout.find_rows and
// entry_rows; cache.cu's hashed_row with a directory of int32 or int64 entries).
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
  const i64 entry = row_in_bucket(t.index_hashes, h, p, end);
  if (entry < 0 || t.index_positions == nullptr) return entry;
  return t.starts64 ? ((const i64*)t.index_positions)[entry]
                    : (i64)((const int*)t.index_positions)[entry];
}

// The row the host fetched for `key` from the lower tiers for this batch, or nullptr.
__device__ __forceinline__ const unsigned* extra_row(const Table& t, const i64 key) {
  i64 lo = 0, hi = t.extra_count;
  while (lo < hi) {
    const i64 mid = (lo + hi) >> 1;
    if (t.extra_keys[mid] < key) lo = mid + 1; else hi = mid;
  }
  return lo < t.extra_count && t.extra_keys[lo] == key ? t.extra_values + lo * t.row_words
                                                       : nullptr;
}

// The cached row of `key`, or nullptr, found by the group's LANES lanes (group_way); a hit
// stamps its slot.
__device__ __forceinline__ const unsigned* probe_cache(const Table& t, const i64 key,
                                                       const int lane, const unsigned mask,
                                                       const int shift) {
  const i64 first = set_start(key, t.cache_sets);
  const int way = group_way(t.cache_keys, first, key, lane, mask, shift, true);
  if (way < 0) return nullptr;
  if (lane == 0) t.cache_stamps[first + way] = now_ns();
  return t.cache_values + (first + way) * t.row_words;
}

// dst = src, a stored row of `words` words, the group's lanes splitting it (16-byte loads
// where `vec`); every load is issued before any store, so a row in host memory costs one PCIe
// round trip.
#define COPY_UNROLL 4
__device__ __forceinline__ void copy_row(unsigned* dst, const unsigned* src, const int words,
                                         const int lane, const bool vec) {
  if (vec) {
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    const int n = words / 4;
    for (int base = lane; base < n; base += LANES * COPY_UNROLL) {
      uint4 v[COPY_UNROLL];
#pragma unroll
      for (int u = 0; u < COPY_UNROLL; ++u) {
        if (base + u * LANES < n) v[u] = s4[base + u * LANES];
      }
#pragma unroll
      for (int u = 0; u < COPY_UNROLL; ++u) {
        if (base + u * LANES < n) d4[base + u * LANES] = v[u];
      }
    }
  } else {
    for (int w = lane; w < words; w += LANES) dst[w] = src[w];
  }
}

// The claim of `key` in its table's miss set, made by the group's lane 0 and handed to every
// lane: the entry, and whether this group made it (true) or found it made (false). -1: the
// set has no room within MISS_PROBES entries.
__device__ __forceinline__ i64 claim_miss(const Table& t, const i64 key, const int lane,
                                          const unsigned mask, const int leader, bool& fresh) {
  i64 slot = -1;
  int made = 0;
  if (lane == 0) {
    const u64 wrap = (u64)t.miss_slots - 1;
    u64 at = mix64(key) & wrap;
    for (int probe = 0; probe < MISS_PROBES; ++probe, at = (at + 1) & wrap) {
      const i64 seen = (i64)atomicCAS((unsigned long long*)(t.miss_keys + at),
                                      (unsigned long long)EMPTY_KEY, (unsigned long long)key);
      if (seen == EMPTY_KEY || seen == key) {
        slot = (i64)at;
        made = seen == EMPTY_KEY;
        break;
      }
    }
  }
  slot = __shfl_sync(mask, slot, leader);
  fresh = __shfl_sync(mask, made, leader) != 0;
  return slot;
}

extern "C" __global__ void bank_find(
    const Table* __restrict__ tables, const int* __restrict__ key_table, const int col_begin,
    const int col_end, const i64 sample_begin, const i64 sample_end, const int key_room,
    const i64 batch, const i64* __restrict__ keys, const int* __restrict__ header,
    const int* __restrict__ offsets, u64* __restrict__ rows, Miss* __restrict__ misses,
    u64* __restrict__ state, const u64 miss_capacity, u64* __restrict__ counters,
    const int by_column) {
  // Counts per table of the block's keys, added to `counters` once per block: a block's keys
  // (one sample's, sample-major) may come from several tables.
  __shared__ unsigned block_counts[BLOCK_TABLES * NUM_COUNTERS];
  // Key q of the launch: positions [batch * col_begin, batch * col_end) table-major, or the
  // columns [col_begin, col_end) of the key room of samples [sample_begin, sample_end)
  // sample-major: sample by sample, or with `by_column` column by column (the samples' keys
  // of one table before the next table's). Column by column, the host rows read in flight
  // lie in one table's part of the host tier rather than across all tables: the GPU reads
  // host memory at half the rate when its reads in flight spread over gigabytes
  // (BENCHMARKS.md, misses over PCIe by where the rows lie).
  const int span = col_end - col_begin;
  const i64 samples = sample_end - sample_begin;
  const bool sample_major = header[1] != 0;
  const i64 total = (sample_major ? samples : batch) * span;
  const i64 first_q = ((i64)blockIdx.x * blockDim.x) / LANES;
  const i64 q = first_q + threadIdx.x / LANES;
  const int lane = threadIdx.x % LANES;
  const int shift = (threadIdx.x % WARP) / LANES * LANES;
  const unsigned mask = GROUP_MASK << shift;
  for (int i = threadIdx.x; i < BLOCK_TABLES * NUM_COUNTERS; i += blockDim.x) {
    block_counts[i] = 0;
  }
  __syncthreads();
  int t = -1;
  bool counted = false, hit = false, found = false, over_pcie = false;
  if (q < total) {  // no early return: the block meets at __syncthreads below
    i64 pos, j;
    int column;
    i64 sample = 0;
    if (sample_major) {
      const i64 major = by_column ? q / samples : q / span;
      const i64 minor = by_column ? q - major * samples : q - major * span;
      sample = sample_begin + (by_column ? minor : major);
      column = col_begin + (int)(by_column ? major : minor);
      pos = sample * key_room + column;
    } else {
      column = col_begin + (int)(q / batch);
      pos = batch * col_begin + q;
    }
    t = key_table[column];
    const Table& tab = tables[t];
    if (sample_major) {
      j = sample * tab.keys_cap + (column - tab.keys_at);
    } else {
      j = pos - batch * tab.keys_at;
    }
    if (j < table_keys(tab, t, batch, header, offsets)) {
      counted = true;
      const i64 key = keys[pos];
      const unsigned* src = nullptr;
      if (tab.cache_sets != 0 && key != EMPTY_KEY) {
        src = probe_cache(tab, key, lane, mask, shift);
        hit = src != nullptr;
      }
      bool in_host = false;
      if (!hit) {
        const i64 r = index_row(tab, key);
        if (r >= 0) {
          src = tab.values + r * tab.row_words;
          hit = !tab.host_values;  // a static table answers from GPU memory
          in_host = tab.host_values != 0;
        } else if (tab.extra_count != 0) {
          src = extra_row(tab, key);  // a miss, staged and inserted like the host tier's rows
        }
      }
      found = src != nullptr;
      u64 where = (u64)src;
      over_pcie = in_host;  // read in place, unless another occurrence of the key reads it
      if (!hit && found && tab.miss_slots != 0 && key != EMPTY_KEY) {
        const int leader = shift;  // lane 0 of the group, as a lane of the warp
        bool fresh;
        const i64 slot = claim_miss(tab, key, lane, mask, leader, fresh);
        if (slot >= 0 && fresh) {
          u64 staged = 0;
          if (lane == 0) staged = atomicAdd(state + STATE_STAGED + t, 1ull);
          staged = __shfl_sync(mask, staged, leader);
          const unsigned* row = src;
          bool insert = false;
          if (staged < (u64)tab.staging_rows) {
            unsigned* copy = tab.staging + (i64)staged * tab.row_words;
            copy_row(copy, src, tab.row_words, lane, tab.row_words % 4 == 0);
            row = copy;
            // A set takes at most WAYS new keys per batch (more would only evict each
            // other): the rank of a miss in its set caps the inserts, and with them the
            // warps that queue for one set's lock in bank_insert.
            if (lane == 0) {
              const i64 set = set_index(key, tab.cache_sets);
              insert = atomicAdd(tab.locks + tab.cache_sets + set, 1) < WAYS;
            }
          }
          if (lane == 0) {
            tab.miss_rows[slot] = row;
            const u64 at = atomicAdd(state + STATE_MISSES, 1ull);
            if (at < miss_capacity) {
              Miss m;
              m.key = key;
              m.src = row;
              m.slot = slot;
              m.table = t;
              m.insert = insert ? 1 : 0;
              misses[at] = m;
            }
          }
          where = (u64)row;
        } else if (slot >= 0) {
          where = ((u64)slot << 2) | CLAIM_TAG;
          over_pcie = false;  // read by the claim's group (or, staging rows full, in place)
        }
      }
      if (lane == 0) rows[pos] = where;
    }
  }
  if (lane == 0 && counted) {
    const bool shared = t < BLOCK_TABLES;
    unsigned* mine = block_counts + (shared ? t : 0) * NUM_COUNTERS;
    u64* global = counters + (i64)t * NUM_COUNTERS;
    const int kinds[5] = {KEYS, hit ? HITS : MISSES, found ? -1 : UNKNOWN,
                          over_pcie ? HOST_ROWS : -1, -1};
    for (int k = 0; k < 4; ++k) {
      if (kinds[k] < 0) continue;
      if (shared) {
        atomicAdd(mine + kinds[k], 1u);
      } else {
        atomicAdd(global + kinds[k], 1ull);
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < BLOCK_TABLES * NUM_COUNTERS; i += blockDim.x) {
    if (block_counts[i] != 0) atomicAdd(counters + i, (u64)block_counts[i]);
  }
}

// Floats of a row one lane accumulates per pass: POOL_VECS float4s (LANES lanes cover
// LANES * 4 * POOL_VECS floats, 128 with 8 lanes; wider rows take several passes).
#define POOL_VECS 4
// Keys of a bag whose rows one lane of pool_bags loads before it adds any of them.
#define KEYS_IN_FLIGHT 4
// Rows of one-key bags one lane of pool_rows loads before it writes any of them.
#define ROWS_IN_FLIGHT 4

// The row bank_find recorded for a key: a row pointer (nullptr: the default value), or a claim
// in the table's miss set.
__device__ __forceinline__ const unsigned* row_of(const Table& tab, const u64 where) {
  if (where & CLAIM_TAG) return tab.miss_rows[where >> 2];
  return reinterpret_cast<const unsigned*>(where);
}

__device__ __forceinline__ void add4(float4& a, const float4 v) {
  a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
}

// Unit d of a stored row of type S decoded (a float4 of it, or where the row's width is not a
// multiple of 4 one float in .x): zeros where `present` is false or d is past the row's n units,
// the table's default value `fill` for a key the table lacks (src null).
template <int S>
__device__ __forceinline__ float4 row_unit(const unsigned* src, const RowScale r, const int d,
                                           const int n, const bool vec, const bool present,
                                           const float fill) {
  float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (present && d < n) {
    if (!src) {
      x = vec ? make_float4(fill, fill, fill, fill) : make_float4(fill, 0.0f, 0.0f, 0.0f);
    } else if (vec) {
      x = load_values4<S>(src, d, r);
    } else {
      x.x = load_value<S>(src, d, r);
    }
  }
  return x;
}

// The pooled bag of `n_keys` rows of storage type S (pool_bags' work for one bag), loading
// InFlight keys' rows at a time.
template <int S, int InFlight>
__device__ __forceinline__ void pool_bag(const Table& tab, const u64* __restrict__ bag_rows,
                                         const int n_keys, float* __restrict__ dst,
                                         const int lane, const int part, const int split,
                                         const int shift, const unsigned mask,
                                         const unsigned bag_mask) {
  const int bag_lanes = LANES * split;
  const float scale = tab.combiner == COMBINER_MEAN && n_keys > 1 ? 1.0f / (float)n_keys : 1.0f;
  const float fill = tab.default_value;
  const bool vec = tab.dim % 4 == 0;  // the host aligns every region and row to 16 bytes
  const int n = vec ? tab.dim / 4 : tab.dim;  // float4s (or floats) of a row
  for (int pass = 0; pass < n; pass += LANES * POOL_VECS) {
    float4 acc[POOL_VECS];
#pragma unroll
    for (int u = 0; u < POOL_VECS; ++u) acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int first = part * LANES; first < n_keys; first += bag_lanes) {
      const int count = min(LANES, n_keys - first);
      const u64 mine = lane < count ? (u64)row_of(tab, bag_rows[first + lane]) : 0ull;
      for (int k0 = 0; k0 < count; k0 += InFlight) {
        float4 v[InFlight][POOL_VECS];
#pragma unroll
        for (int kk = 0; kk < InFlight; ++kk) {
          const int k = k0 + kk;
          const unsigned* src = reinterpret_cast<const unsigned*>(
              __shfl_sync(mask, mine, shift + (k < count ? k : 0)));
          const RowScale r = src && k < count ? row_scale<S>(src, tab.dim) : RowScale{1.0f, 0.0f};
#pragma unroll
          for (int u = 0; u < POOL_VECS; ++u) {
            v[kk][u] = row_unit<S>(src, r, pass + lane + u * LANES, n, vec, k < count, fill);
          }
        }
#pragma unroll
        for (int kk = 0; kk < InFlight; ++kk) {
          if (k0 + kk < count) {
#pragma unroll
            for (int u = 0; u < POOL_VECS; ++u) add4(acc[u], v[kk][u]);
          }
        }
      }
    }
    for (int other = LANES; other < bag_lanes; other <<= 1) {
#pragma unroll
      for (int u = 0; u < POOL_VECS; ++u) {
        acc[u].x += __shfl_xor_sync(bag_mask, acc[u].x, other);
        acc[u].y += __shfl_xor_sync(bag_mask, acc[u].y, other);
        acc[u].z += __shfl_xor_sync(bag_mask, acc[u].z, other);
        acc[u].w += __shfl_xor_sync(bag_mask, acc[u].w, other);
      }
    }
    if (part != 0) continue;
#pragma unroll
    for (int u = 0; u < POOL_VECS; ++u) {
      const int d = pass + lane + u * LANES;
      if (d >= n) continue;
      if (vec) {
        reinterpret_cast<float4*>(dst)[d] = make_float4(acc[u].x * scale, acc[u].y * scale,
                                                        acc[u].z * scale, acc[u].w * scale);
      } else {
        dst[d] = acc[u].x * scale;
      }
    }
  }
}

// pool_bag for the table's storage type (the same for every lane of a bag).
template <int InFlight>
__device__ __forceinline__ void pool_stored_bag(const Table& tab, const u64* __restrict__ bag_rows,
                                                const int n_keys, float* __restrict__ dst,
                                                const int lane, const int part, const int split,
                                                const int shift, const unsigned mask,
                                                const unsigned bag_mask) {
  switch (tab.storage) {
    case STORAGE_FP16:
      pool_bag<STORAGE_FP16, InFlight>(tab, bag_rows, n_keys, dst, lane, part, split, shift, mask,
                                       bag_mask);
      break;
    case STORAGE_INT8:
      pool_bag<STORAGE_INT8, InFlight>(tab, bag_rows, n_keys, dst, lane, part, split, shift, mask,
                                       bag_mask);
      break;
    case STORAGE_FP8:
      pool_bag<STORAGE_FP8, InFlight>(tab, bag_rows, n_keys, dst, lane, part, split, shift, mask,
                                      bag_mask);
      break;
    default:
      pool_bag<STORAGE_FP32, InFlight>(tab, bag_rows, n_keys, dst, lane, part, split, shift, mask,
                                       bag_mask);
  }
}

// The bags of a segment's slots, `split` groups of LANES lanes per bag (thread: this thread's
// index within the segment). A bag's keys are consecutive in the key buffer (and in `rows`) in
// either layout. The group's lanes resolve LANES of the bag's row pointers at once (one lane
// each), then load the rows of KEYS_IN_FLIGHT keys before adding them in key order: a bag of
// 100 keys costs about 40 memory round trips instead of 200 one after the other. With `split`
// > 1 (the slots of long bags), `split` groups of a warp share a bag: group p takes the bag's
// runs of LANES keys p, p + split, ...; their sums are added in a fixed order through shuffles
// (the same result every time) and group 0 writes the bag.
__device__ __forceinline__ void pool_bags(
    const Table* __restrict__ tables, const int* __restrict__ slot_table,
    const int* __restrict__ slot_local, const int* __restrict__ slots, const int n_slots,
    const int split, const i64 thread, const i64 sample_begin, const i64 samples,
    const int key_room, const i64 batch, const int* __restrict__ header,
    const int* __restrict__ offsets, const u64* __restrict__ rows, float* __restrict__ out) {
  // Bag i is sample sample_begin + i % samples of the segment's slot i / samples.
  const int bag_lanes = LANES * split;
  const i64 bag = thread / bag_lanes;
  if (bag >= samples * n_slots) return;  // no lane of a bag returns alone
  const int lane = threadIdx.x % LANES;
  const int part = (threadIdx.x / LANES) % split;
  const int shift = (threadIdx.x % WARP) / LANES * LANES;
  const unsigned mask = GROUP_MASK << shift;
  const int bag_shift = (threadIdx.x % WARP) / bag_lanes * bag_lanes;
  const unsigned bag_mask = (unsigned)((1ull << bag_lanes) - 1ull) << bag_shift;
  const int i = (int)(bag / samples);
  const int g = slots[i];
  const i64 b = sample_begin + (bag - (i64)i * samples);
  const int t = slot_table[g];
  const Table& tab = tables[t];
  const int s = slot_local[g];
  i64 begin, end;
  bag_range(tab, t, s, b, batch, header, offsets, begin, end);
  const int n_keys = (int)(end - begin);
  const u64* bag_rows = rows + (n_keys > 0 ? key_pos(tab, t, begin, batch, header, key_room) : 0);
  float* dst = out + batch * tab.out_at + tab.out_shift + b * tab.out_stride + (i64)s * tab.dim;
  pool_stored_bag<KEYS_IN_FLIGHT>(tab, bag_rows, n_keys, dst, lane, part, split, shift, mask,
                                  bag_mask);
}

// The rows of a group's `count` one-key bags (lane r's row pointer in `mine`, bit r of `has`
// set where bag r holds its key) decoded into dst, dst + stride, ...: each lane loads its part
// of ROWS_IN_FLIGHT rows before it writes any. A bag without a key is zeros (as pool_bags
// pools it), a key the table lacks its default value.
template <int S>
__device__ __forceinline__ void copy_rows(const Table& tab, const u64 mine, const unsigned has,
                                          const int count, float* __restrict__ dst,
                                          const i64 stride, const int lane, const int shift,
                                          const unsigned mask) {
  const float fill = tab.default_value;
  const bool vec = tab.dim % 4 == 0;
  const int n = vec ? tab.dim / 4 : tab.dim;
  for (int r0 = 0; r0 < count; r0 += ROWS_IN_FLIGHT) {
    for (int pass = 0; pass < n; pass += LANES * POOL_VECS) {
      float4 v[ROWS_IN_FLIGHT][POOL_VECS];
#pragma unroll
      for (int rr = 0; rr < ROWS_IN_FLIGHT; ++rr) {
        const int r = r0 + rr;
        const unsigned* src = reinterpret_cast<const unsigned*>(
            __shfl_sync(mask, mine, shift + (r < count ? r : 0)));
        const bool key = r < count && ((has >> r) & 1u);
        const RowScale rs = key && src ? row_scale<S>(src, tab.dim) : RowScale{1.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < POOL_VECS; ++u) {
          v[rr][u] = row_unit<S>(src, rs, pass + lane + u * LANES, n, vec, key, fill);
        }
      }
#pragma unroll
      for (int rr = 0; rr < ROWS_IN_FLIGHT; ++rr) {
        if (r0 + rr >= count) break;
        float* row_dst = dst + (i64)(r0 + rr) * stride;
#pragma unroll
        for (int u = 0; u < POOL_VECS; ++u) {
          const int d = pass + lane + u * LANES;
          if (d >= n) continue;
          if (vec) {
            reinterpret_cast<float4*>(row_dst)[d] = v[rr][u];
          } else {
            row_dst[d] = v[rr][u].x;
          }
        }
      }
    }
  }
}

// The bags of a segment's one-key slots (tables with at most one key per slot and sample).
// Pooling a one-key bag is copying a row, and a group per bag leaves a lane two dependent loads
// (the row pointer, then the row) per 16 floats it writes; here a group of LANES lanes takes
// LANES consecutive samples of one slot: each lane resolves one bag's row pointer, then the
// group copies ROWS_IN_FLIGHT rows at a time. A group meeting a bag of several keys (a request
// may put two keys in one slot of a table of several slots) pools each of its bags as
// pool_bags does.
__device__ __forceinline__ void pool_rows(
    const Table* __restrict__ tables, const int* __restrict__ slot_table,
    const int* __restrict__ slot_local, const int* __restrict__ slots, const int n_slots,
    const i64 thread, const i64 sample_begin, const i64 samples, const int key_room,
    const i64 batch, const int* __restrict__ header, const int* __restrict__ offsets,
    const u64* __restrict__ rows, float* __restrict__ out) {
  const i64 per_slot = (samples + LANES - 1) / LANES;  // groups per slot
  const i64 q = thread / LANES;
  if (q >= per_slot * n_slots) return;  // no lane of a group returns alone
  const int lane = threadIdx.x % LANES;
  const int shift = (threadIdx.x % WARP) / LANES * LANES;
  const unsigned mask = GROUP_MASK << shift;
  const int i = (int)(q / per_slot);
  const int g = slots[i];
  const i64 first = sample_begin + (q - (i64)i * per_slot) * LANES;
  const int count = (int)min((i64)LANES, sample_begin + samples - first);
  const int t = slot_table[g];
  const Table& tab = tables[t];
  const int s = slot_local[g];
  i64 begin = 0, end = 0;
  if (lane < count) bag_range(tab, t, s, first + lane, batch, header, offsets, begin, end);
  const int n_keys = (int)(end - begin);
  float* dst = out + batch * tab.out_at + tab.out_shift + first * tab.out_stride + (i64)s * tab.dim;
  if (__any_sync(mask, n_keys > 1)) {
    for (int r = 0; r < count; ++r) {
      const i64 bag_begin = __shfl_sync(mask, begin, shift + r);
      const int bag_keys = __shfl_sync(mask, n_keys, shift + r);
      const u64* bag_rows =
          rows + (bag_keys > 0 ? key_pos(tab, t, bag_begin, batch, header, key_room) : 0);
      pool_stored_bag<1>(tab, bag_rows, bag_keys, dst + (i64)r * tab.out_stride, lane, 0, 1,
                         shift, mask, mask);
    }
    return;
  }
  const u64 mine =
      n_keys > 0 ? (u64)row_of(tab, rows[key_pos(tab, t, begin, batch, header, key_room)]) : 0ull;
  const unsigned has = (__ballot_sync(mask, n_keys > 0) >> shift) & GROUP_MASK;
  switch (tab.storage) {
    case STORAGE_FP16:
      copy_rows<STORAGE_FP16>(tab, mine, has, count, dst, tab.out_stride, lane, shift, mask);
      break;
    case STORAGE_INT8:
      copy_rows<STORAGE_INT8>(tab, mine, has, count, dst, tab.out_stride, lane, shift, mask);
      break;
    case STORAGE_FP8:
      copy_rows<STORAGE_FP8>(tab, mine, has, count, dst, tab.out_stride, lane, shift, mask);
      break;
    default:
      copy_rows<STORAGE_FP32>(tab, mine, has, count, dst, tab.out_stride, lane, shift, mask);
  }
}

// The pooling of a part of a batch (its slots `plan` lists, samples [sample_begin,
// sample_end)) in one launch, whatever its tables' hotness. `plan` (int32, from
// hps_core/infer/gpu/placement.py's PoolPlan) cuts the slots into segments:
//   plan[0] segments; segment k: plan[1 + 3k] its split (POOL_ROWS: one-key slots, copied by
//   pool_rows; else groups of LANES lanes per bag in pool_bags), plan[2 + 3k] its slot count,
//   plan[3 + 3k] where its slots are listed in plan.
// Segments take consecutive runs of whole blocks, in plan order (the longest bags first, so
// that the shorter segments' blocks fill the SMs while the long bags' blocks finish). One
// launch instead of one per run of alike slots: the small launches of a part (a few slots of
// a few thousand samples each) left the GPU idle between them. Two blocks per SM: the compiler
// then keeps the keys in flight in 128 registers without spilling (164 unbounded, one block
// per SM, an eighth of the SM's threads).
extern "C" __global__ void __launch_bounds__(THREADS, 2) bank_pool(
    const Table* __restrict__ tables, const int* __restrict__ slot_table,
    const int* __restrict__ slot_local, const int* __restrict__ plan, const i64 sample_begin,
    const i64 sample_end, const int key_room, const i64 batch, const int* __restrict__ header,
    const int* __restrict__ offsets, const u64* __restrict__ rows, float* __restrict__ out) {
  const i64 samples = sample_end - sample_begin;
  i64 first_block = 0;
  for (int k = 0; k < plan[0]; ++k) {
    const int split = plan[1 + 3 * k], n_slots = plan[2 + 3 * k];
    const i64 lanes = split == POOL_ROWS ? (samples + LANES - 1) / LANES * LANES * n_slots
                                         : samples * n_slots * LANES * split;
    const i64 blocks = (lanes + THREADS - 1) / THREADS;
    if ((i64)blockIdx.x < first_block + blocks) {
      const i64 thread = ((i64)blockIdx.x - first_block) * THREADS + threadIdx.x;
      const int* slots = plan + plan[3 + 3 * k];
      if (split == POOL_ROWS) {
        pool_rows(tables, slot_table, slot_local, slots, n_slots, thread, sample_begin, samples,
                  key_room, batch, header, offsets, rows, out);
      } else {
        pool_bags(tables, slot_table, slot_local, slots, n_slots, split, thread, sample_begin,
                  samples, key_room, batch, header, offsets, rows, out);
      }
      return;
    }
    first_block += blocks;
  }
}

// Run before bank_find only when a table has tiers below its host tier: records each key of
// such a table that neither its cache nor its host tier holds (repeats included; the host
// deduplicates), so that the host fetches them from the lower tiers in one round trip per
// batch and bank_find finds them among the table's extra rows. A group of LANES lanes per bag,
// slot-major.
extern "C" __global__ void bank_probe(
    const Table* __restrict__ tables, const int* __restrict__ slot_table,
    const int* __restrict__ slot_local, const int slot_begin, const int slot_end,
    const int key_room, const i64 batch, const i64* __restrict__ keys,
    const int* __restrict__ header, const int* __restrict__ offsets, Pending* __restrict__ pending,
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
  i64 begin, end;
  bag_range(tab, t, slot_local[g], b, batch, header, offsets, begin, end);
  for (i64 i = begin; i < end; ++i) {
    const i64 key = keys[key_pos(tab, t, i, batch, header, key_room)];
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

// One warp per listed miss (grid-stride: the count is known on the GPU only). A miss to insert
// takes its set's lock, so misses of one set are applied one at a time in any order: a key
// already stored (another process's insert, with shared caches) is only re-stamped; a new key
// takes a free way, else evicts the least recently used one. Slots are read through L2 (another
// SM may have just written them under the same lock). Every listed miss's entry of the miss set
// is emptied, and its set's count of new misses reset, ready for the next batch.
extern "C" __global__ void bank_insert(const Table* __restrict__ tables,
                                       const Miss* __restrict__ misses,
                                       const u64* __restrict__ state, const u64 miss_capacity,
                                       u64* __restrict__ counters) {
  const int lane = threadIdx.x % WARP;
  const i64 warps = ((i64)gridDim.x * blockDim.x) / WARP;
  const i64 n = (i64)min(state[STATE_MISSES], miss_capacity);
  for (i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP; item < n; item += warps) {
    const Miss m = misses[item];
    const Table& tab = tables[m.table];
    const i64 set = set_index(m.key, tab.cache_sets);
    int* lock = tab.locks + set;
    if (m.insert) {
      const i64 first = set * WAYS;
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
      bool inserted, evicted;
      const int way =
          insert_way(key_lo, key_hi, stamp_lo, stamp_hi, m.key, lane, inserted, evicted);
      if (inserted) {
        unsigned* row = const_cast<unsigned*>(tab.cache_values) + (first + way) * tab.row_words;
        for (int base = lane; base < tab.row_words; base += WARP * COPY_UNROLL) {
          unsigned v[COPY_UNROLL];
#pragma unroll
          for (int u = 0; u < COPY_UNROLL; ++u) {
            const int w = base + u * WARP;
            if (w < tab.row_words) v[u] = m.src[w];
          }
#pragma unroll
          for (int u = 0; u < COPY_UNROLL; ++u) {
            const int w = base + u * WARP;
            if (w < tab.row_words) __stcg(row + w, v[u]);
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
        atomicExch(lock, 0);
        u64* c = counters + (i64)m.table * NUM_COUNTERS;
        if (inserted) atomicAdd(c + INSERTS, 1ull);
        if (evicted) atomicAdd(c + EVICTIONS, 1ull);
      }
    }
    if (lane == 0) {
      lock[tab.cache_sets] = 0;  // the set's count of new misses, for the next batch
      tab.miss_keys[m.slot] = EMPTY_KEY;
    }
  }
}
