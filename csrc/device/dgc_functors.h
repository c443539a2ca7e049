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
// dgc_index_*_many): the tensors' index spaces are concatenated; a table of per-tensor
// descriptors and the prefix counts `start` (segments + 1 entries, start[0] = 0) give each
// concatenated position g its tensor s (start[s] <= g < start[s + 1]) and its index g - start[s].

// The tensor of concatenated position g (a binary search; empty segments own no position).
HGC_HOST_DEVICE inline int64_t segment_of(const int64_t* start, int64_t segs, int64_t g) {
  int64_t lo = 0, hi = segs;  // start[lo] <= g < start[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (start[mid] <= g) lo = mid; else hi = mid;
  }
  return lo;
}

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

// Concatenated position g's term of the per-tensor (count, t) reduction: (key >= t, t).
struct SegCountTerm {
  const ThresholdRule* rules;
  const int64_t* start;
  int64_t segs;
  HGC_HOST_DEVICE CountKey operator()(int64_t g) const {
    const int64_t s = segment_of(start, segs, g);
    const ThresholdRule& r = rules[s];
    const uint64_t t = r();
    return CountKey{key_at(r.x, r.esize, g - start[s]) >= t ? 1 : 0, t};
  }
};

// The tensor of concatenated position g (the keys of segment_reduce's scan by tensor).
struct SegmentAt {
  const int64_t* start;
  int64_t segs;
  HGC_HOST_DEVICE int64_t operator()(int64_t g) const { return segment_of(start, segs, g); }
};

// A tensor's values against a bound: (x, esize) and the bound `t`.
struct KeyBound {
  const void* x;
  int esize;
  uint64_t t;
};

// Concatenated position g as (tensor, key) (the refinement's candidates, filtered by KeepAtLeast).
struct SegKeyAt {
  const KeyBound* b;
  const int64_t* start;
  int64_t segs;
  HGC_HOST_DEVICE SegKey operator()(int64_t g) const {
    const int64_t s = segment_of(start, segs, g);
    return SegKey{s, key_at(b[s].x, b[s].esize, g - start[s])};
  }
};

// key >= its tensor's bound (lo = t0: path 1's candidates; lo = 0: path 2's every key).
struct KeepAtLeast {
  const KeyBound* b;
  HGC_HOST_DEVICE bool operator()(const SegKey& k) const { return k.key >= b[k.seg].t; }
};

// Concatenated position g is kept (1: its key >= its tensor's bound) or not (0): the flags whose
// exclusive scan places the refinement's candidates and the compaction's selected values.
struct KeptAt {
  SegKeyAt at;
  KeepAtLeast keep;
  HGC_HOST_DEVICE int64_t operator()(int64_t g) const { return keep(at(g)) ? 1 : 0; }
};

// Writes concatenated position g's key to out[rank[g]] when it is kept (rank: KeptAt's scan).
struct WriteKept {
  KeptAt kept;
  const int64_t* rank;
  SegKey* out;
  HGC_HOST_DEVICE void operator()(int64_t g) const {
    const SegKey k = kept.at(g);
    if (kept.keep(k)) out[rank[g]] = k;
  }
};

// One tensor's outputs of a bucket's compaction: idx (int32, or int64 when wide) and vals (the
// values' bits) of `count` entries.
struct CompactOut {
  bool wide;
  void* idx;
  void* vals;
  int64_t count;
};

// Concatenated position g, when selected (KeptAt: its key >= its tensor's threshold): its place q
// among its tensor's selected positions (rank: KeptAt's exclusive scan, so ascending positions
// get ascending places, as a stable compaction gives them), idx[q] = its index and vals[q] = its
// value's bits (esize bytes).
struct WriteSelected {
  KeptAt kept;
  const int64_t* rank;
  const CompactOut* out;
  HGC_HOST_DEVICE void operator()(int64_t g) const {
    const SegKey k = kept.at(g);
    if (!kept.keep(k)) return;
    const KeyBound& b = kept.at.b[k.seg];
    const CompactOut& o = out[k.seg];
    const int64_t first = kept.at.start[k.seg], i = g - first, q = rank[g] - rank[first];
    if (q >= o.count) return;  // (count is the threshold's count of selected keys: never)
    if (o.wide) static_cast<int64_t*>(o.idx)[q] = i;
    else static_cast<int32_t*>(o.idx)[q] = static_cast<int32_t>(i);
    if (b.esize == 2) static_cast<uint16_t*>(o.vals)[q] = static_cast<const uint16_t*>(b.x)[i];
    else if (b.esize == 4) static_cast<uint32_t*>(o.vals)[q] = static_cast<const uint32_t*>(b.x)[i];
    else static_cast<uint64_t*>(o.vals)[q] = static_cast<const uint64_t*>(b.x)[i];
  }
};

// sums[s] = the last value of segment s of an inclusive scan by segment (every segment non-empty):
// the segment's reduction, left in device memory (reduce_by_key would read its output's size back).
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

// Concatenated position g's GapAt term (the per-tensor GapStats reduction of the index code).
struct SegGapTerm {
  const IndexList* lists;
  const int64_t* start;
  int64_t segs;
  HGC_HOST_DEVICE GapStats operator()(int64_t g) const {
    const int64_t s = segment_of(start, segs, g);
    const IndexList& l = lists[s];
    const int64_t j = g - start[s];
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
