// DGC's device functors: what one index of a Thrust algorithm computes, for both builds of
// csrc/device/dgc_device.cu (nvcc: CUDA; g++: the OpenMP twin). Plain C++ (no Thrust, no
// PyTorch). Each functor writes only the output words of its own index (no atomics), and every
// reduction that decides a payload is integer arithmetic (counts, keys), so its result does not
// depend on the backend or the number of threads.
//
// Magnitudes are integer keys, as in csrc/cpu/dgc_cpu.cpp: the value's bits with the sign bit
// cleared (uint16 for fp16/bf16, uint32 for fp32, uint64 for fp64); key order is magnitude
// order, +inf below every NaN.
#pragma once

#include <cstdint>

#include "../dgc_accumulate_step.h"
#include "../host_device.h"
#include "../splitmix64.h"
#include "chunk_map.h"
#include "half_bits.h"

namespace hgc_dev {
namespace dgc {

// (~U(0) is an int for uint16: cast back to U before the shift.)
template <typename U> HGC_HOST_DEVICE inline U abs_key(U bits) {
  return static_cast<U>(bits & static_cast<U>(static_cast<U>(~U(0)) >> 1));
}

// key(x_i), i an index (over a counting iterator).
template <typename U> struct KeyAt {
  const U* p;
  HGC_HOST_DEVICE U operator()(int64_t i) const { return abs_key(p[i]); }
};

// s[j] = key of sample j: the value at hgc::dgc_sample_place(key, j, n), as the CPU draws it.
template <typename U> struct GatherSample {
  const U* p;
  int64_t n;
  uint64_t key;
  U* s;
  HGC_HOST_DEVICE void operator()(int64_t j) const { s[j] = abs_key(p[hgc::dgc_sample_place(key, j, n)]); }
};

// The threshold as a function of keys in device memory (so that it is never read back before
// the count that needs it): at[0] is the r-th largest sampled key (exact: the k-th largest key,
// at[1] the (k+1)-th); t = max(at[0], 1), and exact: 1 when at[1] == 0 (at most k nonzero keys).
template <typename U> struct ThresholdAt {
  const U* at;
  bool exact;
  HGC_HOST_DEVICE U operator()() const {
    if (exact && at[1] == 0) return U(1);
    return at[0] > U(1) ? at[0] : U(1);
  }
};

// #{key >= t} and t itself, reduced together so that one read-back gives both (integers: any
// order of the reduction gives the same result).
struct CountKey {
  int64_t count;
  uint64_t key;
};

struct CombineCountKey {
  HGC_HOST_DEVICE CountKey operator()(const CountKey& a, const CountKey& b) const {
    return CountKey{a.count + b.count, a.key > b.key ? a.key : b.key};
  }
};

// Index i's term of that reduction: (key_i >= t, t).
template <typename U> struct CountAtLeast {
  const U* p;
  ThresholdAt<U> th;
  HGC_HOST_DEVICE CountKey operator()(int64_t i) const {
    const U t = th();
    return CountKey{abs_key(p[i]) >= t ? 1 : 0, static_cast<uint64_t>(t)};
  }
};

// key(x_i) >= t, for an index i.
template <typename U> struct IndexAtLeast {
  const U* p;
  U t;
  HGC_HOST_DEVICE bool operator()(int64_t i) const { return abs_key(p[i]) >= t; }
};

// key >= t, for a key.
template <typename U> struct KeyAtLeast {
  U t;
  HGC_HOST_DEVICE bool operator()(U key) const { return key >= t; }
};

// key(bits) >= t, for a value's bits (copy_if's stencil).
template <typename U> struct BitsAtLeast {
  U t;
  HGC_HOST_DEVICE bool operator()(U bits) const { return abs_key(bits) >= t; }
};

// Descending key order (the sorts that find the r-th largest key).
template <typename U> struct Greater {
  HGC_HOST_DEVICE bool operator()(U a, U b) const { return a > b; }
};

// ---- scatter-sum ------------------------------------------------------------------------------

// The K payloads of a decode-sum as one table in device memory: payload r owns the positions
// [off[r], off[r+1]) of the concatenation of all payloads' pairs; idx[r] its indices.
template <typename I> struct PayloadTable {
  const int64_t* off;  // K + 1 offsets, off[0] = 0
  const I* const* idx;  // K index buffers
  int64_t K;

  // The payload holding concatenated position j (off[r] <= j < off[r+1]; empty payloads skipped).
  HGC_HOST_DEVICE int64_t payload_of(int64_t j) const {
    int64_t lo = 0, hi = K - 1;  // invariant: off[lo] <= j < off[hi + 1]
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (off[mid] <= j) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
};

// 1 when concatenated position j breaks its payload's rule (indices strictly increasing and in
// [0, n)): the CPU's hgc::dgc_indices_valid, one position at a time.
template <typename I> struct BadPosition {
  PayloadTable<I> tab;
  int64_t n;
  HGC_HOST_DEVICE int64_t operator()(int64_t j) const {
    const int64_t r = tab.payload_of(j);
    const int64_t q = j - tab.off[r];
    const I* ix = tab.idx[r];
    const int64_t v = static_cast<int64_t>(ix[q]);
    const bool ok = v >= 0 && v < n && (q == 0 || static_cast<int64_t>(ix[q - 1]) < v);
    return ok ? 0 : 1;
  }
};

// bad[r] = the number of bad positions of payload r, from the inclusive scan `sums` of
// BadPosition over all positions.
struct BadOfPayload {
  const int64_t* off;
  const int64_t* sums;
  int64_t* bad;
  HGC_HOST_DEVICE void operator()(int64_t r) const {
    const int64_t b = off[r], e = off[r + 1];
    bad[r] = e == b ? 0 : sums[e - 1] - (b > 0 ? sums[b - 1] : 0);
  }
};

// acc[idx[j]] += value j, for the pairs of one payload: its indices are strictly increasing
// (checked first), so no two positions write one word. A is float (double for fp64).
template <typename T, typename A, typename I> struct ScatterAdd {
  const I* idx;
  const T* vals;
  A* acc;
  HGC_HOST_DEVICE void operator()(int64_t j) const {
    const int64_t i = static_cast<int64_t>(idx[j]);
    acc[i] = acc[i] + static_cast<A>(Elem<T>::load(vals[j]));
  }
};

// out[i] = round(acc[i] * scale) to T. acc and out may be the same memory (fp32/fp64): index i
// reads and writes only its own word.
template <typename T, typename A> struct ScaleStore {
  const A* acc;
  A scale;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t i) const { out[i] = Elem<T>::store(acc[i] * scale); }
};

template <typename A> struct FillZero {
  A* acc;
  HGC_HOST_DEVICE void operator()(int64_t i) const { acc[i] = A(0); }
};

// ---- index code -------------------------------------------------------------------------------

// What the encoder needs from its indices: the number of positions that break the rule and
// the largest gap code (integer reduction: any order gives the same result).
struct GapStats {
  int64_t bad;
  int64_t top;
};

struct CombineGapStats {
  HGC_HOST_DEVICE GapStats operator()(const GapStats& a, const GapStats& b) const {
    return GapStats{a.bad + b.bad, a.top > b.top ? a.top : b.top};
  }
};

// Position j's gap code idx_j - idx_{j-1} - 1 (idx_{-1} = -1) and whether it breaks the rule.
template <typename I> struct GapAt {
  const I* idx;
  int64_t n;
  HGC_HOST_DEVICE GapStats operator()(int64_t j) const {
    const int64_t v = static_cast<int64_t>(idx[j]);
    const int64_t prev = j > 0 ? static_cast<int64_t>(idx[j - 1]) : -1;
    const bool ok = v >= 0 && v < n && prev < v;
    const int64_t g = v - prev - 1;
    return GapStats{ok ? 0 : 1, g > 0 ? g : 0};
  }
};

// Position j's gap code as w = 1 or 2 little-endian bytes at code[w * j].
template <typename I> struct WriteGap {
  const I* idx;
  int w;
  uint8_t* code;
  HGC_HOST_DEVICE void operator()(int64_t j) const {
    const int64_t prev = j > 0 ? static_cast<int64_t>(idx[j - 1]) : -1;
    const int64_t g = static_cast<int64_t>(idx[j]) - prev - 1;
    code[j * w] = static_cast<uint8_t>(g);
    if (w == 2) code[j * w + 1] = static_cast<uint8_t>(g >> 8);
  }
};

// The step from index j-1 to index j: gap code + 1 (j = 0: the gap code itself, idx_{-1} = -1),
// so that the inclusive scan of the steps is the indices.
struct StepAt {
  const uint8_t* code;
  int w;
  HGC_HOST_DEVICE int64_t operator()(int64_t j) const {
    const int64_t g = w == 1 ? static_cast<int64_t>(code[j])
                             : (static_cast<int64_t>(code[2 * j]) | (static_cast<int64_t>(code[2 * j + 1]) << 8));
    return j == 0 ? g : g + 1;
  }
};

// idx[j] = sums[j] as I; int32 results are clamped to n (as the CPU's decode: out of range is
// caught by the check that follows, never wrapped into range).
template <typename I> struct StoreIndex {
  const int64_t* sums;
  int64_t n;
  I* idx;
  HGC_HOST_DEVICE void operator()(int64_t j) const {
    const int64_t v = sums[j];
    idx[j] = static_cast<I>(sizeof(I) == 4 && v > n ? n : v);
  }
};

// 1 when position j of decoded indices breaks the rule (strictly increasing, in [0, n)).
template <typename I> struct BadIndex {
  const I* idx;
  int64_t n;
  HGC_HOST_DEVICE bool operator()(int64_t j) const {
    const int64_t v = static_cast<int64_t>(idx[j]);
    return !(v >= 0 && v < n && (j == 0 || static_cast<int64_t>(idx[j - 1]) < v));
  }
};

// ---- momentum correction ----------------------------------------------------------------------

// hgc::dgc_accumulate_step on index i (u, v: in place; each index its own words).
template <typename T, bool kClip, bool kNesterov> struct Accumulate {
  T* u;
  T* v;
  const T* g;
  T m;
  T c;
  HGC_HOST_DEVICE void operator()(int64_t i) const { hgc::dgc_accumulate_step(u[i], v[i], g[i], m, c, kClip, kNesterov); }
};

// ---- a bucket at once (dgc_device.cu's *_many launchers, multi_tensor.cuh's stages) ---------
// These run per payload or per tensor under MultiFor: q is the index inside the payload.

// The little-endian integer of w = 1, 2, 4 or 8 bytes at p (any alignment); w = 4 sign-extended
// (int32 indices), w = 1, 2 unsigned (gap codes).
HGC_HOST_DEVICE inline int64_t read_le(const uint8_t* p, int w) {
  uint64_t x = 0;
  for (int b = w - 1; b >= 0; --b) x = (x << 8) | p[b];
  if (w == 4) return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(x)));
  return static_cast<int64_t>(x);
}

// steps[q] = the step of position q of a payload whose indices are coded with w bytes: the gap
// code's StepAt for w = 1, 2 (so that an inclusive scan gives the indices), 0 for the absolute
// indices (w = 4, 8), which are read as they are.
struct PayloadSteps {
  const uint8_t* code;
  int w;
  int64_t* steps;
  HGC_HOST_DEVICE void operator()(int64_t q) const { steps[q] = w <= 2 ? StepAt{code, w}(q) : 0; }
};

// Position q of one payload: idx[q] = its index as int64 (from the inclusive scan `sums` of every
// payload's steps, less the sum before this payload at *before (nullptr: none), or read from the
// absolute code), and bad[q] = 1 when it breaks the rule (strictly increasing, in [0, n)): the
// int64 indices the per-tensor decode gives (int32 ones without its clamp, which only keeps an
// out-of-range value out of range) and the rule its checks apply.
struct PayloadIndices {
  const uint8_t* code;
  int w;
  const int64_t* sums;
  const int64_t* before;
  int64_t n;
  int64_t* idx;
  int64_t* bad;
  HGC_HOST_DEVICE int64_t at(int64_t q) const {
    if (w >= 4) return read_le(code + q * w, w);
    return sums[q] - (before ? *before : 0);
  }
  HGC_HOST_DEVICE void operator()(int64_t q) const {
    const int64_t v = at(q);
    const int64_t prev = q > 0 ? at(q - 1) : -1;
    idx[q] = v;
    bad[q] = v >= 0 && v < n && prev < v ? 0 : 1;
  }
};

// *out = the number of bad positions in [b, e) from the inclusive scan `scan` of the bad flags
// (one index per payload).
struct BadInRange {
  const int64_t* scan;
  int64_t b, e;
  int64_t* out;
  HGC_HOST_DEVICE void operator()(int64_t) const { *out = e == b ? 0 : scan[e - 1] - (b > 0 ? scan[b - 1] : 0); }
};

// Momentum factor masking and the emptying of the accumulation at a payload's indices (int32,
// or int64 when wide): v[idx[q]] = 0 and u[idx[q]] = 0 (u: nullptr for none), as index_fill_(0)
// writes them (every dtype's +0 is all zero bytes; esize = 2, 4 or 8). Indices out of [0, n)
// are not written (the selection never gives them).
struct ZeroSent {
  const void* idx;
  bool wide;
  int64_t n;
  int esize;
  void* v;
  void* u;
  HGC_HOST_DEVICE static void zero(void* base, int64_t i, int esize) {
    if (esize == 2) static_cast<uint16_t*>(base)[i] = 0;
    else if (esize == 4) static_cast<uint32_t*>(base)[i] = 0;
    else static_cast<uint64_t*>(base)[i] = 0;
  }
  HGC_HOST_DEVICE void operator()(int64_t q) const {
    const int64_t i = wide ? static_cast<const int64_t*>(idx)[q] : static_cast<int64_t>(static_cast<const int32_t*>(idx)[q]);
    if (i < 0 || i >= n) return;
    zero(v, i, esize);
    if (u) zero(u, i, esize);
  }
};


// ---- a bucket's selection and index code (dgc_device.cu's dgc_threshold_many, dgc_compact_many,
// dgc_index_*_many): the tensors' index spaces are laid end to end as the positions of a put()
// stage (multi_tensor.cuh): each tensor's indices in chunks of one power-of-two size, its last
// chunk padded. A ChunkMap gives position p its tensor and its index there by a shift and a mask
// (no search); padding positions carry the neutral term of their tensor (a count of 0, nothing
// kept), so every per-tensor result is that of its real indices alone.

// key(x_i) of a tensor of esize = 2, 4 or 8 bytes per value, widened to 64 bits (order kept).
HGC_HOST_DEVICE inline uint64_t key_at(const void* x, int esize, int64_t i) {
  if (esize == 2) return abs_key(static_cast<const uint16_t*>(x)[i]);
  if (esize == 4) return abs_key(static_cast<const uint32_t*>(x)[i]);
  return abs_key(static_cast<const uint64_t*>(x)[i]);
}

// One key of a bucket's segmented sort: (tensor, key), ordered by tensor, then key descending
// (so that each tensor's keys form one descending run: its r-th largest at its base + r - 1).
struct SegKey {
  int64_t seg;
  uint64_t key;
};

struct SegKeyOrder {
  HGC_HOST_DEVICE bool operator()(const SegKey& a, const SegKey& b) const {
    return a.seg < b.seg || (a.seg == b.seg && a.key > b.key);
  }
};

// Position q of a tensor's keys to sort: sampled: sample q (GatherSample's place); else the
// key of value q. out[q] = (seg, key).
struct GatherSegKeys {
  const void* x;
  int esize;
  int64_t n;
  uint64_t key;
  bool sampled;
  int64_t seg;
  SegKey* out;
  HGC_HOST_DEVICE void operator()(int64_t q) const {
    const int64_t i = sampled ? hgc::dgc_sample_place(key, q, n) : q;
    out[q] = SegKey{seg, key_at(x, esize, i)};
  }
};

// A tensor's threshold rule, evaluated from device memory (ThresholdAt over sorted SegKeys):
// mode 0: t = 1 (k >= n: every nonzero value); 1: t = max(at[0], 1) (the sampled estimate);
// 2: exact: 1 when at[1] == 0 (at most k nonzero keys), else max(at[0], 1).
struct ThresholdRule {
  const void* x;
  int esize;
  int mode;
  const SegKey* at;
  HGC_HOST_DEVICE uint64_t operator()() const {
    if (mode == 0) return 1;
    if (mode == 2 && at[1].key == 0) return 1;
    return at[0].key > 1 ? at[0].key : 1;
  }
};

// The tensor of position p (the keys of a scan by tensor).
struct ChunkTensor {
  ChunkMap map;
  HGC_HOST_DEVICE int64_t operator()(int64_t p) const { return map.tensor(p); }
};

// Position p's term of the per-tensor (count, t) reduction: (key >= t, t); padding (0, t).
struct SegCountTerm {
  const ThresholdRule* rules;
  ChunkMap map;
  HGC_HOST_DEVICE CountKey operator()(int64_t p) const {
    int64_t i;
    const ThresholdRule& r = rules[map.at(p, &i)];
    const uint64_t t = r();
    return CountKey{i >= 0 && key_at(r.x, r.esize, i) >= t ? 1 : 0, t};
  }
};

// ---- the refinement, on the device: a segmented radix select ----------------------------------
// A sampled tensor whose estimate is off by more than 2x (c0 outside [k/2, 2k]) needs the exact
// rule over all its keys (its k-th largest key; 1 when at most k keys are nonzero), found without
// reading c0 back: its key's bytes from the top, one 8-bit digit per pass (2, 4 or 8 passes by
// the key's width), each pass a histogram of the digit among the keys that match the bytes
// chosen so far (per tile of at most kRadixTile values, then per tensor), then the digit where
// the count from the top reaches the rank still sought. Integer counts: the same in any order, so
// the twin and CUDA agree bitwise. The count of keys >= the k-th largest falls out of the same
// histograms (the keys above it plus the keys equal to it), so no counting pass follows. Over all
// keys on both paths: path 1's candidates (the c0 > 2k keys >= t0) hold the k + 1 largest keys,
// so the rule over them is the rule over all keys, as the CPU computes it.

constexpr int kRadixBins = 257;          // the 256 digits, then the number of zero keys
constexpr int64_t kRadixTile = 1024;     // values per tile histogram

// A tensor's selection result in device memory: the threshold t (as a key), the path, and the
// number of keys >= t (what the bucket op reads back, all tensors in one copy).
struct SelectResult {
  int64_t count;
  uint64_t key;
  int64_t path;
};

// One sampled tensor's radix select: active (refined), the rank k still sought among the keys
// matching `prefix` on the bytes above `byte` (the byte the next pass decides; -1 when done),
// and the number of keys above that range.
struct RadixState {
  uint64_t prefix;
  int64_t k;
  int64_t above;
  int32_t byte;
  int32_t active;
};

HGC_HOST_DEVICE inline bool radix_live(const RadixState& s) { return s.active != 0 && s.byte >= 0; }

// Per tensor (one position): reads its round-1 (count c0, t0) at `last` (the end of its scan by
// tensor), decides its path as the CPU does (mode 1: 0 when k/2 <= c0 <= 2k, else 1 when c0 > 2k,
// else 2; modes 0 and 2: 2), writes its result, and starts its radix select when refined (st:
// the tensor's state, nullptr unless mode 1).
struct DecideRefine {
  const CountKey* last;
  int mode;
  int64_t k;
  int esize;
  RadixState* st;
  SelectResult* out;
  HGC_HOST_DEVICE void operator()(int64_t) const {
    const CountKey c = *last;
    bool refine = false;
    int64_t path = 2;
    if (mode == 1) {
      if (2 * c.count >= k && c.count <= 2 * k) {
        path = 0;
      } else {
        refine = true;
        path = c.count > 2 * k ? 1 : 2;
      }
    }
    *out = SelectResult{c.count, c.key, path};
    if (st) *st = RadixState{0, k, 0, esize - 1, refine ? 1 : 0};
  }
};

// Tile q of a tensor's `tiles` (its values q, q + tiles, q + 2 tiles, ... < n: at most
// kRadixTile, and neighbouring tiles read neighbouring values, as a GPU warp reads best): the
// histogram of the current byte's digit among its keys that match the state's prefix, and its
// zero keys, into hist[q * kRadixBins + d]. Does nothing unless the tensor's select is live.
struct TileHistogram {
  const void* x;
  int esize;
  int64_t n;
  int64_t tiles;
  const RadixState* st;
  int32_t* hist;
  HGC_HOST_DEVICE void operator()(int64_t q) const {
    const RadixState s = *st;
    if (!radix_live(s)) return;
    int32_t h[kRadixBins];
    for (int d = 0; d < kRadixBins; ++d) h[d] = 0;
    const int shift = 8 * s.byte;
    const uint64_t high = s.byte == 7 ? 0 : ~uint64_t(0) << (shift + 8);  // the bytes already chosen
    for (int64_t i = q; i < n; i += tiles) {
      const uint64_t key = key_at(x, esize, i);
      if (key == 0) ++h[kRadixBins - 1];
      if ((key & high) == s.prefix) ++h[(key >> shift) & 0xff];
    }
    int32_t* row = hist + q * kRadixBins;
    for (int d = 0; d < kRadixBins; ++d) row[d] = h[d];
  }
};

// Bin b of a tensor's histogram: the sum of its `tiles` tile histograms' bin b into sums[b].
struct BinSum {
  const RadixState* st;
  const int32_t* hist;
  int64_t tiles;
  int64_t* sums;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    if (!radix_live(*st)) return;
    int64_t s = 0;
    for (int64_t q = 0; q < tiles; ++q) s += hist[q * kRadixBins + b];
    sums[b] = s;
  }
};

// Per tensor (one position): the digit of the current byte where the count of matching keys from
// the top (digit 255 down) reaches the rank sought; the state moves to the next byte. After the
// last byte, prefix is the k-th largest key K and the result is the exact rule's: nnz <= k
// (nnz = the nonzero keys): t = 1, count nnz; else t = K (>= 1) and count = #{key > K} +
// #{key == K}.
struct PickDigit {
  RadixState* st;
  const int64_t* sums;
  int64_t n;
  int64_t k;
  SelectResult* out;
  HGC_HOST_DEVICE void operator()(int64_t) const {
    RadixState s = *st;
    if (!radix_live(s)) return;
    int64_t run = 0;  // matching keys with a larger digit
    int d = 255;
    for (; d > 0 && run + sums[d] < s.k; --d) run += sums[d];
    s.prefix |= static_cast<uint64_t>(d) << (8 * s.byte);
    s.above += run;
    s.k -= run;
    s.byte -= 1;
    *st = s;
    if (s.byte >= 0) return;
    const int64_t nnz = n - sums[kRadixBins - 1];
    out->count = nnz <= k ? nnz : s.above + sums[d];
    out->key = nnz <= k ? 1 : s.prefix;
  }
};

// ---- a bucket's compaction ----------------------------------------------------------------------

// A tensor's values against a bound: (x, esize) and the bound `t`.
struct KeyBound {
  const void* x;
  int esize;
  uint64_t t;
};

// Position p is kept (1: a value whose key >= its tensor's bound) or not (0, padding too): the
// flags whose exclusive scan places the selected values.
struct KeptAt {
  const KeyBound* b;
  ChunkMap map;
  HGC_HOST_DEVICE int64_t operator()(int64_t p) const {
    int64_t i;
    const KeyBound& kb = b[map.at(p, &i)];
    return i >= 0 && key_at(kb.x, kb.esize, i) >= kb.t ? 1 : 0;
  }
};

// One tensor's outputs of a bucket's compaction: idx (int32, or int64 when wide) and vals (the
// values' bits) of `count` entries; `before`: the selected values of the tensors before it (the
// exclusive scan's value at its first position).
struct CompactOut {
  bool wide;
  void* idx;
  void* vals;
  int64_t count;
  int64_t before;
};

// Position p, when selected (KeptAt): its place q among its tensor's selected values (rank:
// KeptAt's exclusive scan, less the tensor's `before`, so ascending indices get ascending places,
// as a stable compaction gives them), idx[q] = its index and vals[q] = its value's bits (esize
// bytes).
struct WriteSelected {
  KeptAt kept;
  const int64_t* rank;
  const CompactOut* out;
  HGC_HOST_DEVICE void operator()(int64_t p) const {
    int64_t i;
    const int64_t t = kept.map.at(p, &i);
    if (i < 0) return;
    const KeyBound& b = kept.b[t];
    if (key_at(b.x, b.esize, i) < b.t) return;
    const CompactOut& o = out[t];
    const int64_t q = rank[p] - o.before;
    if (q < 0 || q >= o.count) return;  // (count is the threshold's count of selected keys: never)
    if (o.wide) static_cast<int64_t*>(o.idx)[q] = i;
    else static_cast<int32_t*>(o.idx)[q] = static_cast<int32_t>(i);
    if (b.esize == 2) static_cast<uint16_t*>(o.vals)[q] = static_cast<const uint16_t*>(b.x)[i];
    else if (b.esize == 4) static_cast<uint32_t*>(o.vals)[q] = static_cast<const uint32_t*>(b.x)[i];
    else static_cast<uint64_t*>(o.vals)[q] = static_cast<const uint64_t*>(b.x)[i];
  }
};

// sums[s] = the last value of tensor s of an inclusive scan by tensor over a stage's positions
// (`start`: its padded prefix counts; every tensor owns a position): the tensor's reduction, left
// in device memory (reduce_by_key would read its output's size back).
template <typename V> struct SegmentLast {
  const V* scan;
  const int64_t* start;
  V* sums;
  HGC_HOST_DEVICE void operator()(int64_t s) const { sums[s] = scan[start[s + 1] - 1]; }
};

// Index j of one tensor's indices (int32, or int64 when wide), as int64.
HGC_HOST_DEVICE inline int64_t index_at(const void* idx, bool wide, int64_t j) {
  return wide ? static_cast<const int64_t*>(idx)[j] : static_cast<int64_t>(static_cast<const int32_t*>(idx)[j]);
}

// One tensor's indices for the index code: `idx` (wide: int64) of a tensor of n values.
struct IndexList {
  const void* idx;
  bool wide;
  int64_t n;
};

// Position p's GapAt term (the per-tensor GapStats reduction of the index code; padding: none).
struct SegGapTerm {
  const IndexList* lists;
  ChunkMap map;
  HGC_HOST_DEVICE GapStats operator()(int64_t p) const {
    int64_t j;
    const IndexList& l = lists[map.at(p, &j)];
    if (j < 0) return GapStats{0, 0};
    const int64_t v = index_at(l.idx, l.wide, j);
    const int64_t prev = j > 0 ? index_at(l.idx, l.wide, j - 1) : -1;
    const bool ok = v >= 0 && v < l.n && prev < v;
    const int64_t gap = v - prev - 1;
    return GapStats{ok ? 0 : 1, gap > 0 ? gap : 0};
  }
};

// Position j of one tensor's index code (under MultiFor), w bytes at code[w * j]: w = 1, 2: its
// gap code (WriteGap's bytes); w = 4, 8: the index itself, little-endian (the bytes of the int32 /
// int64 index: the per-tensor code's byte copy).
struct WriteIndexCode {
  const void* idx;
  bool wide;
  int w;
  uint8_t* code;
  HGC_HOST_DEVICE void operator()(int64_t j) const {
    const int64_t v = index_at(idx, wide, j);
    const uint64_t c = w <= 2 ? static_cast<uint64_t>(v - (j > 0 ? index_at(idx, wide, j - 1) : -1) - 1)
                              : static_cast<uint64_t>(v);
    for (int b = 0; b < w; ++b) code[j * w + b] = static_cast<uint8_t>(c >> (8 * b));
  }
};

}  // namespace dgc
}  // namespace hgc_dev
