// DGC, device source: Thrust algorithms over the functors of dgc_functors.h, built by nvcc (CUDA)
// and by g++ with Thrust's OpenMP backend (the twin, csrc/twin/dgc_twin.cpp).
//
// Selection: every quantity that decides the payload is an integer (keys, counts) or a sort of
// integer keys, so the threshold, the path and the count are the CPU's on any backend and any
// number of threads: the sampled keys are gathered (the CPU's stream) and sorted descending;
// the count of keys above the r-th is an integer reduction that also returns that key (one
// read-back); when the estimate is off by more than 2x, the candidate keys (path 1) or all keys
// (path 2) are sorted and counted above the exact k-th largest likewise (per tensor: a second
// read-back; the bucket op below refines on the device instead). Compaction: one stable copy_if
// over (index, value) pairs, so the indices ascend. Scatter-sum: the indices are checked first (one scan, K flags read back at once), then
// one for_each per payload, in payload order, each over its strictly increasing indices.
//
// A bucket (the *_many launchers, multi_tensor.cuh): each stage of the per-tensor launchers runs
// once for all tensors. Decode-sum: the int64 indices of every payload from one scan of their
// steps, their check from one scan of bad flags, the flags of all payloads read back in one copy,
// then per dtype a fill, one stage per payload rank, the scaling. Momentum correction: one
// for_each per dtype. Masking: one for_each.
// Selection (dgc_threshold_many, dgc_compact_many): the keys to sort of every tensor (sampled
// keys, or all keys of the exactly selected ones) widened to (tensor, uint64 key) pairs, one
// gather and one sort by (tensor, key descending) for the bucket; every tensor's (count, t0) by one
// scan by tensor over the concatenated values, left on the device; a for_each that decides each
// tensor's path there (an estimate off by more than 2x: the exact rule, path 1 or 2); the exact
// rule by a segmented radix select over all keys of the sampled tensors (per byte of the widest
// sampled key: tile histograms, their per-tensor sums, the digit; tensors that need no refinement
// return at once), whose histograms also give the count; then ONE read-back of every tensor's
// (count, t, path), the op's only host synchronization. The positions of the segmented scans are
// a stage's chunks (multi_tensor.cuh's ChunkMap: a shift and a mask, no per-element search). Then
// one scan of the selected flags (each position's place) and one for_each writing indices and
// values: the compaction reads nothing back (the counts are known).
// Index code (dgc_index_*_many): one segmented reduction of every tensor's GapStats, one
// read-back, one for_each. Their tables (a TableSet) go up in one copy per round.
// Every scan goes through scan.cuh (Thrust on CUDA, a parallel two-level scan in the twin).
#include "dgc_device.h"

#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/reduce.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/sort.h>
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "dgc_functors.h"
#include "exec.cuh"
#include "multi_tensor.cuh"
#include "scan.cuh"

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
  return static_cast<int64_t>(thrust::count_if(ex.policy_read(), thrust::counting_iterator<int64_t>(0),
                                               thrust::counting_iterator<int64_t>(n), dgc::IndexAtLeast<U>{p, t}));
}

// (#{i : key_i >= t}, t) for the threshold rule th over keys in device memory: one integer
// reduction, one read-back.
template <typename U> dgc::CountKey count_threshold(Exec& ex, const U* p, int64_t n, dgc::ThresholdAt<U> th) {
  return thrust::transform_reduce(ex.policy_read(), thrust::counting_iterator<int64_t>(0),
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
  thrust::copy_if(ex.policy_read(), key_of, key_of + n, keys.get(), dgc::KeyAtLeast<U>{lo});
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
  thrust::copy_if(ex.policy_read(), in, in + n, p, thrust::make_zip_iterator(idx, vals), dgc::BitsAtLeast<U>{t});
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
  scan_inclusive(ex, thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), dgc::BadPosition<I>{tab, n}),
                 total, sums.get(), thrust::plus<int64_t>());
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
      ex.policy_read(), thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(count),
      dgc::GapAt<I>{idx, n}, dgc::GapStats{0, 0}, dgc::CombineGapStats());
  return DgcIndexScan{s.top, s.bad == 0};
}

template <typename I> bool indices_ok_typed(Exec& ex, const I* idx, int64_t count, int64_t n) {
  return thrust::count_if(ex.policy_read(), thrust::counting_iterator<int64_t>(0),
                          thrust::counting_iterator<int64_t>(count), dgc::BadIndex<I>{idx, n}) == 0;
}

template <typename I>
bool read_gaps_typed(Exec& ex, const uint8_t* code, int w, int64_t count, int64_t n, I* idx) {
  // The indices are the inclusive scan of the steps (gap + 1), in int64; stored clamped as I.
  Scratch<int64_t> scratch(ex, sizeof(I) == 8 ? 0 : count);
  int64_t* sums = sizeof(I) == 8 ? reinterpret_cast<int64_t*>(idx) : scratch.get();
  scan_inclusive(ex, thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), dgc::StepAt{code, w}),
                 count, sums, thrust::plus<int64_t>());
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

// ---- a bucket at once ---------------------------------------------------------------------------

// The scatter-sum stages of a bucket's tensors of one dtype: fill, one stage per payload rank r
// (the payloads in order, as scatter_typed adds them), scaling.
template <typename T> struct SumStages {
  using A = typename Elem<T>::acc;
  Stage<dgc::FillZero<A>> fill;
  std::vector<Stage<dgc::ScatterAdd<T, A, int64_t>>> scatter;
  Stage<dgc::ScaleStore<T, A>> scale;
  bool used = false;

  explicit SumStages(int64_t K) : scatter(static_cast<std::size_t>(K)) {}

  // Tensor `t` with its K payloads (their int64 indices at idx + base[r]); fp16/bf16 accumulate in
  // `narrow` (advanced by n), fp32/fp64 in the output itself.
  void add(const DgcSumTensor& t, const DgcSumPayload* pays, const int64_t* base, const int64_t* idx, double s,
           float*& narrow) {
    if (t.n <= 0) return;
    used = true;
    T* out = static_cast<T*>(t.out);
    A* acc;
    if (std::is_same<A, T>::value) {
      acc = reinterpret_cast<A*>(out);
    } else {
      acc = reinterpret_cast<A*>(narrow);
      narrow += t.n;
    }
    fill.add(dgc::FillZero<A>{acc}, t.n);
    for (std::size_t r = 0; r < scatter.size(); ++r)
      scatter[r].add(dgc::ScatterAdd<T, A, int64_t>{idx + base[r], static_cast<const T*>(pays[r].values), acc},
                     pays[r].count);
    scale.add(dgc::ScaleStore<T, A>{acc, static_cast<A>(s), out}, t.n);
  }
  void put(TableSet& tables) {
    tables.put(fill);
    for (auto& st : scatter) tables.put(st);
    tables.put(scale);
  }
  void run(TableSet& tables) const {
    if (!used) return;
    tables.run(fill);
    for (const auto& st : scatter) tables.run(st);
    tables.run(scale);
  }
};

template <bool kClip, bool kNesterov>
void accumulate_many_typed(Exec& ex, const DgcAccumulateItem* items, int64_t count, double m, double c) {
  Stage<dgc::Accumulate<float, kClip, kNesterov>> f32;
  Stage<dgc::Accumulate<double, kClip, kNesterov>> f64;
  for (int64_t i = 0; i < count; ++i) {
    const DgcAccumulateItem& it = items[i];
    if (it.dtype == DType::kFloat)
      f32.add({static_cast<float*>(it.u), static_cast<float*>(it.v), static_cast<const float*>(it.g),
               static_cast<float>(m), static_cast<float>(c)},
              it.n);
    else if (it.dtype == DType::kDouble)
      f64.add({static_cast<double*>(it.u), static_cast<double*>(it.v), static_cast<const double*>(it.g), m, c}, it.n);
    else
      throw std::invalid_argument("dgc_accumulate_many: fp32 or fp64 only");
  }
  TableSet tables(ex);
  tables.put(f32);
  tables.put(f64);
  tables.upload();
  tables.run(f32);
  tables.run(f64);
}

// ---- a bucket's selection and index code -------------------------------------------------------

int esize_of(DType dtype) {
  switch (dtype) {
    case DType::kHalf:
    case DType::kBFloat16: return 2;
    case DType::kFloat: return 4;
    case DType::kDouble: return 8;
  }
  throw std::invalid_argument("dgc: unknown dtype");
}

// sums[s] = the reduction by `op` of term(p) over tensor s's positions p of a put() stage (every
// tensor owns a position; padding positions give op's neutral term), left in device memory: an
// inclusive scan by tensor and a gather of each tensor's last value (2 calls, no read back;
// reduce_by_key would read its output's size). op must be associative: the reductions here are
// of integers, so any order gives the same result.
template <typename V, typename F, typename Term, typename Op>
void segment_reduce(Exec& ex, const TableSet& tables, const Stage<F>& stage, Term term, Op op, V* sums) {
  const int64_t P = stage.positions();
  Scratch<V> scan(ex, P);
  const auto seg = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), dgc::ChunkTensor{tables.map(stage)});
  const auto terms = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), term);
  scan_inclusive_by_key(ex, seg, terms, P, scan.get(), op);
  ex.for_each_index(stage.tensors(), dgc::SegmentLast<V>{scan.get(), tables.padded_starts(stage), sums});
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

namespace hgc_dev {

bool dgc_scatter_sum_many(const Ctx& ctx, const DgcSumTensor* tensors, int64_t count, const DgcSumPayload* payloads,
                          int64_t K, double scale, int64_t* bad) {
  if (count <= 0 || K <= 0) return true;
  const int64_t P = count * K;
  std::vector<int64_t> base(static_cast<std::size_t>(P) + 1, 0);  // payload p's first position
  for (int64_t p = 0; p < P; ++p) base[p + 1] = base[p] + payloads[p].count;
  const int64_t total = base[P];
  int64_t narrow = 0;  // fp16/bf16 accumulators
  for (int64_t t = 0; t < count; ++t)
    if (tensors[t].dtype == DType::kHalf || tensors[t].dtype == DType::kBFloat16) narrow += tensors[t].n;
  Exec ex(ctx);
  Scratch<int64_t> sums(ex, total), idx(ex, total), flags(ex, total), bad_dev(ex, P);
  Scratch<float> acc(ex, narrow);

  // The indices of every payload and their check (one index per position, one per payload).
  Stage<dgc::PayloadSteps> steps;
  Stage<dgc::PayloadIndices> indices;
  Stage<dgc::BadInRange> per_payload;
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t r = 0; r < K; ++r) {
      const int64_t p = t * K + r, b = base[p], c = payloads[p].count;
      const DgcSumPayload& pay = payloads[p];
      steps.add(dgc::PayloadSteps{pay.index_bytes, pay.w, sums.get() + b}, c);
      indices.add(dgc::PayloadIndices{pay.index_bytes, pay.w, sums.get() + b, b > 0 ? sums.get() + b - 1 : nullptr,
                                      tensors[t].n, idx.get() + b, flags.get() + b},
                  c);
      per_payload.add(dgc::BadInRange{flags.get(), b, b + c, bad_dev.get() + p}, 1);
    }
  }
  // The sums, per dtype.
  PerDtype<SumStages> sum(K);
  float* cursor = acc.get();
  for (int64_t t = 0; t < count; ++t) {
    const DgcSumTensor& tt = tensors[t];
    with_dtype(sum, tt.dtype, nullptr, [&](auto& set, const auto*) {
      set.add(tt, payloads + t * K, base.data() + t * K, idx.get(), scale, cursor);
    });
  }
  TableSet tables(ex);
  tables.put(steps);
  tables.put(indices);
  tables.put(per_payload);
  sum.each([&](auto& set) { set.put(tables); });
  tables.upload();

  tables.run(steps);
  if (total > 0) scan_inclusive(ex, sums.get(), total, sums.get(), thrust::plus<int64_t>());
  tables.run(indices);
  if (total > 0) scan_inclusive(ex, flags.get(), total, flags.get(), thrust::plus<int64_t>());
  tables.run(per_payload);
  ex.to_host(bad, bad_dev.get(), sizeof(int64_t) * static_cast<std::size_t>(P));
  for (int64_t p = 0; p < P; ++p)
    if (bad[p] != 0) return false;  // nothing written: the caller names the payload

  sum.each([&](auto& set) { set.run(tables); });  // in DType order
  return true;
}

void dgc_accumulate_many(const Ctx& ctx, const DgcAccumulateItem* items, int64_t count, double momentum,
                         bool nesterov, double coef) {
  if (count <= 0) return;
  Exec ex(ctx);
  const bool clip = coef != 1.0;
  if (clip) {
    if (nesterov) accumulate_many_typed<true, true>(ex, items, count, momentum, coef);
    else accumulate_many_typed<true, false>(ex, items, count, momentum, coef);
  } else {
    if (nesterov) accumulate_many_typed<false, true>(ex, items, count, momentum, coef);
    else accumulate_many_typed<false, false>(ex, items, count, momentum, coef);
  }
}

void dgc_mask_many(const Ctx& ctx, const DgcMaskItem* items, int64_t count) {
  if (count <= 0) return;
  Exec ex(ctx);
  Stage<dgc::ZeroSent> zero;
  for (int64_t i = 0; i < count; ++i) {
    const DgcMaskItem& it = items[i];
    zero.add(dgc::ZeroSent{it.idx, it.wide, it.n, it.esize, it.v, it.u}, it.count);
  }
  TableSet tables(ex);
  tables.put(zero);
  tables.upload();
  tables.run(zero);
}


void dgc_threshold_many(const Ctx& ctx, const DgcSelectItem* items, int64_t count, DgcThreshold* out) {
  if (count <= 0) return;
  for (int64_t t = 0; t < count; ++t)
    if (items[t].n <= 0 || items[t].k <= 0 || items[t].sample_count < 0)
      throw std::invalid_argument("dgc_threshold_many: n, k >= 1, sample_count >= 0 for every tensor");
  Exec ex(ctx);
  // Mode 0 (k >= n: t = 1), 1 (sampled: t0 from the m sampled keys, refined on the device when
  // off by more than 2x), 2 (m == 0: exact over all n keys). The keys to sort, per tensor, at
  // base[t] of one pool; the sampled tensors' radix tiles at tile[t] of one histogram scratch.
  std::vector<int> mode(static_cast<std::size_t>(count));
  std::vector<int64_t> base(static_cast<std::size_t>(count), 0), rank(static_cast<std::size_t>(count), 0);
  std::vector<int64_t> tile(static_cast<std::size_t>(count), 0);
  int64_t M = 0, tiles = 0, sampled = 0;
  int passes = 0;  // the widest sampled key's bytes
  for (int64_t t = 0; t < count; ++t) {
    const DgcSelectItem& it = items[t];
    const int64_t m = it.sample_count;
    if (it.k >= it.n) {
      mode[t] = 0;
      continue;
    }
    base[t] = M;
    if (m > 0) {
      mode[t] = 1;
      int64_t r = static_cast<int64_t>(std::ceil(static_cast<double>(it.k) * static_cast<double>(m) / it.n));
      rank[t] = std::min(std::max<int64_t>(r, 1), m);
      M += m;
      tile[t] = tiles;
      tiles += (it.n + dgc::kRadixTile - 1) / dgc::kRadixTile;
      sampled += 1;
      passes = std::max(passes, esize_of(it.dtype));
    } else {
      mode[t] = 2;
      M += it.n;
    }
  }
  Scratch<dgc::SegKey> pool(ex, M);
  Scratch<dgc::SelectResult> result(ex, count);
  Scratch<dgc::RadixState> state(ex, sampled);
  Scratch<int32_t> tile_hist(ex, tiles * dgc::kRadixBins);
  Scratch<int64_t> bin_sums(ex, sampled * dgc::kRadixBins);
  Stage<dgc::GatherSegKeys> gather;
  Stage<dgc::ThresholdRule> rules;
  for (int64_t t = 0; t < count; ++t) {
    const DgcSelectItem& it = items[t];
    const int es = esize_of(it.dtype);
    dgc::SegKey* at = pool.get() + base[t];
    if (mode[t] == 1) gather.add({it.x, es, it.n, it.key, true, t, at}, it.sample_count);
    if (mode[t] == 2) gather.add({it.x, es, it.n, it.key, false, t, at}, it.n);
    const dgc::SegKey* th = mode[t] == 1 ? at + (rank[t] - 1) : mode[t] == 2 ? at + (it.k - 1) : nullptr;
    rules.add({it.x, es, mode[t], th}, it.n);
  }
  TableSet tables(ex);
  tables.put(gather);
  tables.put(rules);
  // Round 1's scan by tensor (its positions are known once `rules` is put), read by each tensor's
  // decision at its last position; then the radix stages of the sampled tensors.
  Scratch<dgc::CountKey> scan(ex, rules.positions());
  Stage<dgc::DecideRefine> decide;
  Stage<dgc::TileHistogram> hist;
  Stage<dgc::BinSum> sum;
  Stage<dgc::PickDigit> pick;
  for (int64_t t = 0, j = 0; t < count; ++t) {
    const DgcSelectItem& it = items[t];
    const int es = esize_of(it.dtype);
    dgc::RadixState* st = mode[t] == 1 ? state.get() + j : nullptr;
    decide.add({scan.get() + rules.padded_start(t + 1) - 1, mode[t], it.k, es, st, result.get() + t}, 1);
    if (mode[t] != 1) continue;
    const int64_t n_tiles = (it.n + dgc::kRadixTile - 1) / dgc::kRadixTile;
    int32_t* h = tile_hist.get() + tile[t] * dgc::kRadixBins;
    int64_t* bins = bin_sums.get() + j * dgc::kRadixBins;
    hist.add({it.x, es, it.n, n_tiles, st, h}, n_tiles);
    sum.add({st, h, n_tiles, bins}, dgc::kRadixBins);
    pick.add({st, bins, it.n, it.k, result.get() + t}, 1);
    ++j;
  }
  tables.put(decide);
  tables.put(hist);
  tables.put(sum);
  tables.put(pick);
  tables.upload();

  tables.run(gather);
  if (M > 0) thrust::sort(ex.policy(), pool.get(), pool.get() + M, dgc::SegKeyOrder());
  const auto seg = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), dgc::ChunkTensor{tables.map(rules)});
  const auto terms = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                                     dgc::SegCountTerm{tables.items(rules), tables.map(rules)});
  scan_inclusive_by_key(ex, seg, terms, rules.positions(), scan.get(), dgc::CombineCountKey());
  tables.run(decide);
  // The refinement, decided on the device: every pass runs whatever the estimates were (a tensor
  // that needs none skips at once: its tiles, bins and pick return on its state).
  for (int pass = 0; pass < passes; ++pass) {
    tables.run(hist);
    tables.run(sum);
    tables.run(pick);
  }
  // The bucket's one read-back: every tensor's (count, t, path).
  std::vector<dgc::SelectResult> host(static_cast<std::size_t>(count));
  ex.to_host(host.data(), result.get(), sizeof(dgc::SelectResult) * host.size());
  for (int64_t t = 0; t < count; ++t) {
    const dgc::SelectResult& r = host[static_cast<std::size_t>(t)];
    out[t] = DgcThreshold{r.key, key_value(r.key, items[t].dtype), r.path, r.count};
  }
}

void dgc_compact_many(const Ctx& ctx, const DgcCompactItem* items, int64_t count) {
  if (count <= 0) return;
  Stage<dgc::KeyBound> bounds;  // the tensors with a selection, their positions laid end to end
  std::vector<dgc::CompactOut> outs;
  int64_t before = 0;
  for (int64_t t = 0; t < count; ++t) {
    const DgcCompactItem& it = items[t];
    if (it.count <= 0 || it.n <= 0) continue;
    bounds.add({it.x, esize_of(it.dtype), it.t_key}, it.n);
    outs.push_back({it.wide, it.idx, it.vals, it.count, before});
    before += it.count;
  }
  if (bounds.total() == 0) return;
  Exec ex(ctx);
  TableSet tables(ex);
  tables.put(bounds);
  const std::size_t outs_at = tables.add(outs);
  tables.upload();
  // Each position's place among the selected ones (an integer scan: any order gives the same
  // places), then the writes; `count` is the number selected (dgc_threshold_many's), known on the
  // host, so nothing is read back.
  const int64_t P = bounds.positions();
  Scratch<int64_t> rank(ex, P);
  const dgc::KeptAt kept{tables.items(bounds), tables.map(bounds)};
  scan_exclusive(ex, thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), kept), P, rank.get(),
                 int64_t(0), thrust::plus<int64_t>());
  ex.for_each_index(P, dgc::WriteSelected{kept, rank.get(), tables.at<dgc::CompactOut>(outs_at)});
}

void dgc_index_scan_many(const Ctx& ctx, const DgcIndexItem* items, int64_t count, DgcIndexScan* out) {
  if (count <= 0) return;
  Stage<dgc::IndexList> lists;
  std::vector<int64_t> which;
  for (int64_t t = 0; t < count; ++t) {
    out[t] = DgcIndexScan{0, true};
    if (items[t].count <= 0) continue;
    lists.add({items[t].idx, items[t].wide, items[t].n}, items[t].count);
    which.push_back(t);
  }
  if (which.empty()) return;
  Exec ex(ctx);
  const int64_t T = lists.tensors();
  TableSet tables(ex);
  tables.put(lists);
  tables.upload();
  Scratch<dgc::GapStats> sums(ex, T);
  segment_reduce(ex, tables, lists, dgc::SegGapTerm{tables.items(lists), tables.map(lists)}, dgc::CombineGapStats(),
                 sums.get());
  // (sized by `which`, T of them: a size the compiler can see is not negative)
  std::vector<dgc::GapStats> host(which.size());
  ex.to_host(host.data(), sums.get(), sizeof(dgc::GapStats) * host.size());
  for (int64_t j = 0; j < T; ++j) out[which[j]] = DgcIndexScan{host[j].top, host[j].bad == 0};
}

void dgc_index_write_many(const Ctx& ctx, const DgcIndexItem* items, const int* w, uint8_t* const* code,
                          int64_t count) {
  if (count <= 0) return;
  Stage<dgc::WriteIndexCode> write;
  for (int64_t t = 0; t < count; ++t) {
    if (w[t] != 1 && w[t] != 2 && w[t] != 4 && w[t] != 8)
      throw std::invalid_argument("dgc_index_write_many: w must be 1, 2, 4 or 8");
    if (w[t] >= 4 && w[t] != (items[t].wide ? 8 : 4))
      throw std::invalid_argument("dgc_index_write_many: an absolute code has the indices' width");
    if (items[t].count > 0) write.add({items[t].idx, items[t].wide, w[t], code[t]}, items[t].count);
  }
  if (write.total() == 0) return;
  Exec ex(ctx);
  TableSet tables(ex);
  tables.put(write);
  tables.upload();
  tables.run(write);
}

}  // namespace hgc_dev
