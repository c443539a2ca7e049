// The scans of the device sources (inclusive, exclusive, and both by key), through one wrapper:
//   nvcc            -> Thrust's scans on the launcher's stream, as the launchers called them before;
//   g++ -DHGC_TWIN  -> a hand-written two-level scan on the CPU's OpenMP threads.
// Why the twin does not call Thrust: its OpenMP backend runs a scan as one left-to-right pass,
// so an operator that is not associative gives there the sequential result and on a GPU (cub's
// tiled scan) another one: the bitwise twin tests could not see it. The two-level scan groups the
// operands as a parallel scan does: blocks of kScanBlock values scanned on their own (in
// parallel), the blocks' totals scanned, each block's prefix combined with its values. The
// blocks do not depend on the thread count, so the result is the same at any thread count, and
// it equals the sequential scan whenever the operator is associative (integer sums and maxima:
// every scan of the device sources). tests/test_twin_scan.py shows a non-associative operator
// giving another result than the sequential scan through this wrapper (_C_twin.scan_probe).
//
// Each call is one device algorithm call (counted by Exec::policy(), as the Thrust call it
// replaces), with the argument order of its Thrust counterpart less the end iterator: a count
// n. The output is a raw pointer of the accumulator type V; it may be the input's memory (the
// scan in place). Keys are compared with ==; a segment starts at 0 and wherever a key differs
// from its predecessor's.
#pragma once

#include <thrust/functional.h>
#include <thrust/scan.h>

#include <cstdint>
#include <type_traits>

#if defined(HGC_TWIN)
#include <algorithm>
#include <vector>
#endif

#include "exec.cuh"

namespace hgc_dev {

// Values per block of the twin's two-level scan: small, so that the scans of the tests' small
// buckets already span several blocks.
constexpr int64_t kScanBlock = 64;

#if defined(HGC_TWIN)
namespace scan_detail {

// Segment heads of a scan without keys: only position 0.
struct NoKeys {
  bool head(int64_t i) const { return i == 0; }
};

// Segment heads of a scan by key: position 0 and every position whose key differs from the one before.
template <typename KeyIt> struct KeyHeads {
  KeyIt keys;
  bool head(int64_t i) const { return i == 0 || !(keys[i - 1] == keys[i]); }
};

// The two-level scan of in[0, n) into out, in segments (heads.head(i): a segment starts at i):
// inclusive, out[i] = in[h] op ... op in[i]; exclusive, out[i] = init op in[h] op ... op in[i - 1]
// (out[h] = init), with h the head of i's segment. Grouping: each block's values scanned from
// the block's start (or the segment's head inside it); a block that continues the segment of the
// block before gets the prefix `carry` of what precedes it (the blocks' totals scanned in order)
// combined on the left: carry op (its local value). The three passes touch disjoint ranges of
// out per thread; in == out is allowed (a position's input is read before its output is written).
template <bool kExclusive, typename Heads, typename InIt, typename V, typename Op>
void two_level(int64_t n, Heads heads, InIt in, V* out, V init, Op op, int64_t block) {
  if (n <= 0) return;
  const int64_t nb = (n + block - 1) / block;
  std::vector<V> tail(static_cast<std::size_t>(nb)), carry(static_cast<std::size_t>(nb));
  std::vector<char> open(static_cast<std::size_t>(nb)), cont(static_cast<std::size_t>(nb), 0);
  // 1. Every block on its own: its local scan, its last segment's local total and whether no
  // segment starts inside it (open: the whole block continues the segment before it).
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    bool has = false, opened = true;
    V acc{};
    for (int64_t i = lo; i < hi; ++i) {
      const V v = static_cast<V>(in[i]);
      if (heads.head(i)) {
        opened = false;
        has = kExclusive;
        if (kExclusive) acc = init;
      }
      if (kExclusive) {
        if (has) out[i] = acc;  // a continued segment's first value: its prefix comes in pass 3
        acc = has ? op(acc, v) : v;
      } else {
        acc = has ? op(acc, v) : v;
        out[i] = acc;
      }
      has = true;
    }
    tail[b] = acc;
    open[b] = opened;
  }
  // 2. The blocks' totals, in order: the prefix entering each block that continues a segment.
  for (int64_t b = 1; b < nb; ++b) {
    cont[b] = !heads.head(b * block);
    if (cont[b]) carry[b] = open[b - 1] ? op(carry[b - 1], tail[b - 1]) : tail[b - 1];
  }
  // 3. That prefix combined with the continued segment's values of each block.
#pragma omp parallel for schedule(static)
  for (int64_t b = 1; b < nb; ++b) {
    if (!cont[b]) continue;
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    for (int64_t i = lo; i < hi && (i == lo || !heads.head(i)); ++i)
      out[i] = (kExclusive && i == lo) ? carry[b] : op(carry[b], out[i]);
  }
}

}  // namespace scan_detail
#endif

// out[i] = in[0] op ... op in[i], i in [0, n).
template <typename InIt, typename V, typename Op> void scan_inclusive(Exec& ex, InIt in, int64_t n, V* out, Op op) {
#if defined(HGC_TWIN)
  (void)ex.policy();  // counted as the Thrust call it stands for
  scan_detail::two_level<false>(n, scan_detail::NoKeys{}, in, out, V{}, op, kScanBlock);
#else
  thrust::inclusive_scan(ex.policy(), in, in + n, out, op);
#endif
}

// out[i] = init op in[0] op ... op in[i - 1], i in [0, n) (out[0] = init).
template <typename InIt, typename V, typename Op>
void scan_exclusive(Exec& ex, InIt in, int64_t n, V* out, V init, Op op) {
#if defined(HGC_TWIN)
  (void)ex.policy();
  scan_detail::two_level<true>(n, scan_detail::NoKeys{}, in, out, init, op, kScanBlock);
#else
  thrust::exclusive_scan(ex.policy(), in, in + n, out, init, op);
#endif
}

// scan_inclusive restarted at every segment of equal consecutive keys.
template <typename KeyIt, typename InIt, typename V, typename Op>
void scan_inclusive_by_key(Exec& ex, KeyIt keys, InIt in, int64_t n, V* out, Op op) {
#if defined(HGC_TWIN)
  (void)ex.policy();
  scan_detail::two_level<false>(n, scan_detail::KeyHeads<KeyIt>{keys}, in, out, V{}, op, kScanBlock);
#else
  using K = std::decay_t<decltype(*keys)>;  // the key type (CCCL 13 deprecates thrust::iterator_value)
  thrust::inclusive_scan_by_key(ex.policy(), keys, keys + n, in, out, thrust::equal_to<K>(), op);
#endif
}

// scan_exclusive restarted (at init) at every segment of equal consecutive keys.
template <typename KeyIt, typename InIt, typename V, typename Op>
void scan_exclusive_by_key(Exec& ex, KeyIt keys, InIt in, int64_t n, V* out, V init, Op op) {
#if defined(HGC_TWIN)
  (void)ex.policy();
  scan_detail::two_level<true>(n, scan_detail::KeyHeads<KeyIt>{keys}, in, out, init, op, kScanBlock);
#else
  using K = std::decay_t<decltype(*keys)>;  // the key type (CCCL 13 deprecates thrust::iterator_value)
  thrust::exclusive_scan_by_key(ex.policy(), keys, keys + n, in, out, init, thrust::equal_to<K>(), op);
#endif
}

}  // namespace hgc_dev
