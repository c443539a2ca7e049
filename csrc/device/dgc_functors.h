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

}  // namespace dgc
}  // namespace hgc_dev
