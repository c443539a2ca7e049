// DGC, device source: Thrust algorithms over the functors of dgc_functors.h, built by nvcc (CUDA)
// and by g++ with Thrust's OpenMP backend (the twin, csrc/twin/dgc_twin.cpp).
//
// Selection: every quantity that decides the payload is an integer (keys, counts) or a sort of
// integer keys, so the threshold, the path and the count are the CPU's on any backend and any
// number of threads: the sampled keys are gathered (the CPU's stream) and sorted descending;
// the count of keys above the r-th is an integer reduction that also returns that key (one
// read-back); when the estimate is off by more than 2x, the candidate keys (path 1) or all keys
// (path 2) are sorted and counted above the exact k-th largest likewise. Compaction: one stable copy_if over (index, value) pairs, so the indices
// ascend. Scatter-sum: the indices are checked first (one scan, K flags read back at once), then
// one for_each per payload, in payload order, each over its strictly increasing indices.
#include "dgc_device.h"

#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/scan.h>
#include <thrust/sort.h>
#include <thrust/transform_scan.h>
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "dgc_functors.h"
#include "exec.cuh"

namespace hgc_dev {
namespace {

using dgc::abs_key;

// Calls f(U*) with U the key type of dtype (the unsigned integer of its width).
template <typename F> auto dispatch_key(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kHalf:
    case DType::kBFloat16: return f(static_cast<uint16_t*>(nullptr));
    case DType::kFloat: return f(static_cast<uint32_t*>(nullptr));
    case DType::kDouble: return f(static_cast<uint64_t*>(nullptr));
  }
  throw std::invalid_argument("dgc: unknown dtype");
}

double key_value(uint64_t t, DType dtype) {
  switch (dtype) {
    case DType::kHalf: return static_cast<double>(half_to_float(static_cast<uint16_t>(t)));
    case DType::kBFloat16: return static_cast<double>(bf16_to_float(static_cast<uint16_t>(t)));
    case DType::kFloat: return static_cast<double>(bits_float(static_cast<uint32_t>(t)));
    case DType::kDouble: {
      double d;
      std::memcpy(&d, &t, 8);
      return d;
    }
  }
  throw std::invalid_argument("dgc: unknown dtype");
}

// #{i : key_i >= t}: an integer count (exact in any order).
template <typename U> int64_t count_at(Exec& ex, const U* p, int64_t n, U t) {
  return static_cast<int64_t>(thrust::count_if(ex.policy(), thrust::counting_iterator<int64_t>(0),
                                               thrust::counting_iterator<int64_t>(n), dgc::IndexAtLeast<U>{p, t}));
}

// (#{i : key_i >= t}, t) for the threshold rule th over keys in device memory: one integer
// reduction, one read-back.
template <typename U> dgc::CountKey count_threshold(Exec& ex, const U* p, int64_t n, dgc::ThresholdAt<U> th) {
  return thrust::transform_reduce(ex.policy(), thrust::counting_iterator<int64_t>(0),
                                  thrust::counting_iterator<int64_t>(n), dgc::CountAtLeast<U>{p, th},
                                  dgc::CountKey{0, 0}, dgc::CombineCountKey());
}

// The exact threshold over the keys >= lo (lo = t0: the len = c0 candidates, which hold the k
// largest keys; lo = 0: all len = n keys), sorted descending: their k-th largest, or 1 when the
// (k+1)-th is zero (at most k nonzero keys: the CPU's exact_threshold); len > k. Returns it and
// the count of keys >= it.
template <typename U> dgc::CountKey exact_threshold(Exec& ex, const U* p, int64_t n, U lo, int64_t len, int64_t k) {
  Scratch<U> keys(ex, len);
  const auto key_of = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), dgc::KeyAt<U>{p});
  thrust::copy_if(ex.policy(), key_of, key_of + n, keys.get(), dgc::KeyAtLeast<U>{lo});
  thrust::sort(ex.policy(), keys.get(), keys.get() + len, thrust::greater<U>());
  return count_threshold<U>(ex, p, n, dgc::ThresholdAt<U>{keys.get() + (k - 1), true});
}

template <typename U>
DgcThreshold threshold_typed(Exec& ex, const U* p, int64_t n, int64_t k, int64_t m, uint64_t key) {
  DgcThreshold r{1, 0.0, 2, 0};
  if (k >= n) {  // every nonzero value
    r.count = count_at<U>(ex, p, n, U(1));
    return r;
  }
  dgc::CountKey t;
  if (m > 0) {
    Scratch<U> s(ex, m);
    ex.for_each_index(m, dgc::GatherSample<U>{p, n, key, s.get()});
    thrust::sort(ex.policy(), s.get(), s.get() + m, thrust::greater<U>());
    int64_t rank = static_cast<int64_t>(std::ceil(static_cast<double>(k) * static_cast<double>(m) / n));
    rank = std::min(std::max<int64_t>(rank, 1), m);
    const dgc::CountKey c = count_threshold<U>(ex, p, n, dgc::ThresholdAt<U>{s.get() + (rank - 1), false});
    const int64_t c0 = c.count;
    if (2 * c0 >= k && c0 <= 2 * k) {
      r.key = c.key;
      r.path = 0;
      r.count = c0;
      return r;
    }
    if (c0 > 2 * k) {
      t = exact_threshold<U>(ex, p, n, static_cast<U>(c.key), c0, k);
      r.path = 1;
    } else {
      t = exact_threshold<U>(ex, p, n, U(0), n, k);
    }
  } else {
    t = exact_threshold<U>(ex, p, n, U(0), n, k);
  }
  r.key = t.key;
  r.count = t.count;
  return r;
}

template <typename U, typename I>
void compact_typed(Exec& ex, const U* p, int64_t n, U t, I* idx, U* vals, int64_t count) {
  if (count == 0) return;
  const auto in = thrust::make_zip_iterator(thrust::counting_iterator<I>(0), p);
  thrust::copy_if(ex.policy(), in, in + n, p, thrust::make_zip_iterator(idx, vals), dgc::BitsAtLeast<U>{t});
}

template <typename I>
void check_typed(Exec& ex, const void* const* idx, const int64_t* counts, int64_t K, int64_t n, int64_t* bad) {
  // The table (offsets, then the K pointers) in one upload.
  std::vector<int64_t> host(2 * K + 1);
  int64_t total = 0;
  for (int64_t r = 0; r < K; ++r) {
    host[r] = total;
    total += counts[r];
  }
  host[K] = total;
  std::fill(bad, bad + K, 0);
  if (total == 0) return;
  static_assert(sizeof(const I*) == sizeof(int64_t), "pointers are 64-bit");
  for (int64_t r = 0; r < K; ++r) std::memcpy(&host[K + 1 + r], &idx[r], sizeof(int64_t));
  Scratch<int64_t> table(ex, 2 * K + 1), flags(ex, K), sums(ex, total);
  ex.to_device(table.get(), host.data(), sizeof(int64_t) * host.size());
  const int64_t* off = table.get();
  const dgc::PayloadTable<I> tab{off, reinterpret_cast<const I* const*>(table.get() + K + 1), K};
  thrust::transform_inclusive_scan(ex.policy(), thrust::counting_iterator<int64_t>(0),
                                   thrust::counting_iterator<int64_t>(total), sums.get(), dgc::BadPosition<I>{tab, n},
                                   thrust::plus<int64_t>());
  ex.for_each_index(K, dgc::BadOfPayload{off, sums.get(), flags.get()});
  ex.to_host(bad, flags.get(), sizeof(int64_t) * K);
}

template <typename T, typename I>
void scatter_typed(Exec& ex, const void* const* idx, const void* const* vals, const int64_t* counts, int64_t K,
                   int64_t n, double scale, T* out) {
  using A = typename Elem<T>::acc;
  // fp32/fp64 accumulate in `out` itself; fp16/bf16 in a float scratch.
  Scratch<A> scratch(ex, std::is_same<A, T>::value ? 0 : n);
  A* acc = std::is_same<A, T>::value ? reinterpret_cast<A*>(out) : scratch.get();
  ex.for_each_index(n, dgc::FillZero<A>{acc});
  for (int64_t r = 0; r < K; ++r)  // payloads in order: every value summed in the CPU's order
    ex.for_each_index(counts[r], dgc::ScatterAdd<T, A, I>{static_cast<const I*>(idx[r]),
                                                          static_cast<const T*>(vals[r]), acc});
  ex.for_each_index(n, dgc::ScaleStore<T, A>{acc, static_cast<A>(scale), out});
}

template <typename I> DgcIndexScan index_scan_typed(Exec& ex, const I* idx, int64_t count, int64_t n) {
  const dgc::GapStats s = thrust::transform_reduce(
      ex.policy(), thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(count),
      dgc::GapAt<I>{idx, n}, dgc::GapStats{0, 0}, dgc::CombineGapStats());
  return DgcIndexScan{s.top, s.bad == 0};
}

template <typename I> bool indices_ok_typed(Exec& ex, const I* idx, int64_t count, int64_t n) {
  return thrust::count_if(ex.policy(), thrust::counting_iterator<int64_t>(0),
                          thrust::counting_iterator<int64_t>(count), dgc::BadIndex<I>{idx, n}) == 0;
}

template <typename I>
bool read_gaps_typed(Exec& ex, const uint8_t* code, int w, int64_t count, int64_t n, I* idx) {
  // The indices are the inclusive scan of the steps (gap + 1), in int64; stored clamped as I.
  Scratch<int64_t> scratch(ex, sizeof(I) == 8 ? 0 : count);
  int64_t* sums = sizeof(I) == 8 ? reinterpret_cast<int64_t*>(idx) : scratch.get();
  thrust::transform_inclusive_scan(ex.policy(), thrust::counting_iterator<int64_t>(0),
                                   thrust::counting_iterator<int64_t>(count), sums, dgc::StepAt{code, w},
                                   thrust::plus<int64_t>());
  if (sizeof(I) == 4) ex.for_each_index(count, dgc::StoreIndex<I>{sums, n, idx});
  return indices_ok_typed<I>(ex, idx, count, n);
}

template <typename T>
void accumulate_typed(Exec& ex, T* u, T* v, const T* g, int64_t n, T m, T c, bool clip, bool nesterov) {
  if (clip) {
    if (nesterov) ex.for_each_index(n, dgc::Accumulate<T, true, true>{u, v, g, m, c});
    else ex.for_each_index(n, dgc::Accumulate<T, true, false>{u, v, g, m, c});
  } else {
    if (nesterov) ex.for_each_index(n, dgc::Accumulate<T, false, true>{u, v, g, m, c});
    else ex.for_each_index(n, dgc::Accumulate<T, false, false>{u, v, g, m, c});
  }
}

}  // namespace

DgcThreshold dgc_threshold(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t k, int64_t sample_count,
                           uint64_t key) {
  if (n <= 0 || k <= 0 || sample_count < 0) throw std::invalid_argument("dgc_threshold: n, k >= 1, sample_count >= 0");
  Exec ex(ctx);
  return dispatch_key(dtype, [&](auto* tag) {
    using U = std::remove_pointer_t<decltype(tag)>;
    DgcThreshold r = threshold_typed<U>(ex, static_cast<const U*>(x), n, k, sample_count, key);
    r.value = key_value(r.key, dtype);
    return r;
  });
}

void dgc_compact(const Ctx& ctx, DType dtype, const void* x, int64_t n, uint64_t t_key, bool wide, void* idx,
                 void* vals, int64_t count) {
  Exec ex(ctx);
  dispatch_key(dtype, [&](auto* tag) {
    using U = std::remove_pointer_t<decltype(tag)>;
    const U* p = static_cast<const U*>(x);
    if (wide)
      compact_typed<U, int64_t>(ex, p, n, static_cast<U>(t_key), static_cast<int64_t*>(idx), static_cast<U*>(vals),
                                count);
    else
      compact_typed<U, int32_t>(ex, p, n, static_cast<U>(t_key), static_cast<int32_t*>(idx), static_cast<U*>(vals),
                                count);
  });
}

void dgc_check_indices(const Ctx& ctx, const void* const* idx, bool wide, const int64_t* counts, int64_t K, int64_t n,
                       int64_t* bad) {
  Exec ex(ctx);
  if (wide)
    check_typed<int64_t>(ex, idx, counts, K, n, bad);
  else
    check_typed<int32_t>(ex, idx, counts, K, n, bad);
}

void dgc_scatter_sum(const Ctx& ctx, DType dtype, const void* const* idx, bool wide, const void* const* vals,
                     const int64_t* counts, int64_t K, int64_t n, double scale, void* out) {
  if (n <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (wide)
      scatter_typed<T, int64_t>(ex, idx, vals, counts, K, n, scale, static_cast<T*>(out));
    else
      scatter_typed<T, int32_t>(ex, idx, vals, counts, K, n, scale, static_cast<T*>(out));
  });
}

DgcIndexScan dgc_index_scan(const Ctx& ctx, const void* idx, bool wide, int64_t count, int64_t n) {
  if (count <= 0) return DgcIndexScan{0, true};
  Exec ex(ctx);
  if (wide) return index_scan_typed<int64_t>(ex, static_cast<const int64_t*>(idx), count, n);
  return index_scan_typed<int32_t>(ex, static_cast<const int32_t*>(idx), count, n);
}

void dgc_index_write_gaps(const Ctx& ctx, const void* idx, bool wide, int64_t count, int w, uint8_t* code) {
  if (w != 1 && w != 2) throw std::invalid_argument("dgc_index_write_gaps: w must be 1 or 2");
  Exec ex(ctx);
  if (wide)
    ex.for_each_index(count, dgc::WriteGap<int64_t>{static_cast<const int64_t*>(idx), w, code});
  else
    ex.for_each_index(count, dgc::WriteGap<int32_t>{static_cast<const int32_t*>(idx), w, code});
}

void dgc_copy_bytes(const Ctx& ctx, const void* src, int64_t bytes, void* dst) {
  if (bytes <= 0) return;
  Exec ex(ctx);
  const auto* s = static_cast<const uint8_t*>(src);
  thrust::copy(ex.policy(), s, s + bytes, static_cast<uint8_t*>(dst));
}

bool dgc_index_read_gaps(const Ctx& ctx, const uint8_t* code, int w, int64_t count, int64_t n, bool wide, void* idx) {
  if (w != 1 && w != 2) throw std::invalid_argument("dgc_index_read_gaps: w must be 1 or 2");
  if (count <= 0) return true;
  Exec ex(ctx);
  if (wide) return read_gaps_typed<int64_t>(ex, code, w, count, n, static_cast<int64_t*>(idx));
  return read_gaps_typed<int32_t>(ex, code, w, count, n, static_cast<int32_t*>(idx));
}

bool dgc_indices_ok(const Ctx& ctx, const void* idx, bool wide, int64_t count, int64_t n) {
  if (count <= 0) return true;
  Exec ex(ctx);
  if (wide) return indices_ok_typed<int64_t>(ex, static_cast<const int64_t*>(idx), count, n);
  return indices_ok_typed<int32_t>(ex, static_cast<const int32_t*>(idx), count, n);
}

void dgc_accumulate(const Ctx& ctx, DType dtype, void* u, void* v, const void* g, int64_t n, double momentum,
                    bool nesterov, double coef) {
  if (n <= 0) return;
  Exec ex(ctx);
  const bool clip = coef != 1.0;
  if (dtype == DType::kFloat)
    accumulate_typed<float>(ex, static_cast<float*>(u), static_cast<float*>(v), static_cast<const float*>(g), n,
                            static_cast<float>(momentum), static_cast<float>(coef), clip, nesterov);
  else if (dtype == DType::kDouble)
    accumulate_typed<double>(ex, static_cast<double*>(u), static_cast<double*>(v), static_cast<const double*>(g), n,
                             momentum, coef, clip, nesterov);
  else
    throw std::invalid_argument("dgc_accumulate: fp32 or fp64 only");
}

}  // namespace hgc_dev
