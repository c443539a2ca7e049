// DGC sparsification, CPU.
//
// Magnitudes are compared as integer keys: the value's bits with the sign bit cleared
// (uint16 for fp16/bf16, uint32 for fp32, uint64 for fp64). For IEEE formats the key
// order is the magnitude order, +inf below every NaN, so one integer compare per value
// selects {|x| >= t} and nth_element on keys is exact.
//
// Select: (1) m sampled keys, nth_element -> t0 = the ceil(k*m/n)-th largest (>= the
// smallest positive key); (2) parallel count of keys >= t0 per chunk of kChunk values;
// the same pass keeps each chunk's candidate indices (blocks without a hit are skipped
// after a vectorized count); (3) accept t0 when k/2 <= count <= 2k; when count > 2k, take
// the exact k-th largest among the candidates and filter them; when count < k/2 (and for
// tensors too small to sample), exact selection over all nonzero keys by radix select
// (histogram of the top 11 key bits, then nth_element within one bin); (4) parallel compaction: chunk counts, prefix sum, each chunk writes its
// (index, value) pairs at its offset, so the output is in ascending index order.
// Scatter-sum: parallel over output chunks; every payload's (sorted) indices are cut by
// binary search, so each output value is accumulated by one thread, ranks in order.
#include "dgc_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>

#include "../checks.h"
#include "../payload_checks.h"
#include "../splitmix64.h"

namespace {

constexpr int64_t kChunk = 1 << 16;

template <typename U> constexpr U abs_mask() { return static_cast<U>(std::numeric_limits<U>::max() >> 1); }

int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// #{i in [lo, hi) : key_i >= t}.
template <typename U>
uint32_t count_range(const U* p, int64_t lo, int64_t hi, U t) {
  const U mask = abs_mask<U>();
  uint32_t cnt = 0;
  for (int64_t i = lo; i < hi; ++i) cnt += static_cast<U>(p[i] & mask) >= t ? 1u : 0u;
  return cnt;
}

int64_t sum_counts(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total;
}

// counts[c] = #{i in chunk c : key_i >= t}; returns the total.
template <typename U>
int64_t count_at(const U* p, int64_t n, U t, std::vector<int64_t>& counts) {
  const int64_t nc = num_chunks(n);
  counts.assign(nc, 0);
  at::parallel_for(0, nc, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) counts[c] = count_range(p, c * kChunk, std::min(n, c * kChunk + kChunk), t);
  });
  return sum_counts(counts);
}

// Appends to l the indices i in [lo, hi) with key_i >= t, in order. Blocks of kBlock
// values are first counted with a loop the compiler vectorizes; only blocks with a hit
// are scanned element by element (at DGC's densities most blocks have none).
template <typename U>
void collect_range(const U* p, int64_t lo, int64_t hi, U t, std::vector<int64_t>& l) {
  constexpr int64_t kBlock = 64;
  const U mask = abs_mask<U>();
  int64_t i = lo;
  for (; i + kBlock <= hi; i += kBlock) {
    if (count_range(p, i, i + kBlock, t) == 0) continue;
    for (int64_t j = i; j < i + kBlock; ++j)
      if (static_cast<U>(p[j] & mask) >= t) l.push_back(j);
  }
  for (; i < hi; ++i)
    if (static_cast<U>(p[i] & mask) >= t) l.push_back(i);
}

// count_at, and each chunk's indices with key >= t into lists[c], in one pass.
template <typename U>
int64_t count_collect(const U* p, int64_t n, U t, std::vector<int64_t>& counts,
                      std::vector<std::vector<int64_t>>& lists) {
  const int64_t nc = num_chunks(n);
  counts.assign(nc, 0);
  lists.assign(nc, {});
  at::parallel_for(0, nc, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
      collect_range(p, lo, hi, t, lists[c]);
      counts[c] = static_cast<int64_t>(lists[c].size());
    }
  });
  return sum_counts(counts);
}

// The r-th largest of s (1 <= r <= s.size()), counting repeated values. A small r (DGC's
// ceil(k * m / n): about density * m) keeps the r largest in a min-heap: one comparison for
// most values, instead of nth_element's passes over all of them. s may be reordered.
template <typename U>
U rth_largest(std::vector<U>& s, int64_t r) {
  if (8 * r > static_cast<int64_t>(s.size())) {
    std::nth_element(s.begin(), s.begin() + (r - 1), s.end(), std::greater<U>());
    return s[r - 1];
  }
  std::vector<U> heap(s.begin(), s.begin() + r);
  std::make_heap(heap.begin(), heap.end(), std::greater<U>());  // heap.front(): the smallest kept
  for (size_t j = static_cast<size_t>(r); j < s.size(); ++j) {
    if (s[j] <= heap.front()) continue;
    std::pop_heap(heap.begin(), heap.end(), std::greater<U>());
    heap.back() = s[j];
    std::push_heap(heap.begin(), heap.end(), std::greater<U>());
  }
  return heap.front();
}

// Exclusive prefix sum of counts (size nc + 1).
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t c = 0; c < counts.size(); ++c) off[c + 1] = off[c] + counts[c];
  return off;
}

// The exact threshold: the k-th largest of the candidate keys (which hold every key >= the
// threshold), at least 1 (zeros are never selected).
template <typename U>
U kth_largest(std::vector<U>& cand, int64_t k) {
  if (static_cast<int64_t>(cand.size()) <= k) return U(1);
  std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(), std::greater<U>());
  return std::max<U>(cand[k - 1], U(1));
}

// The exact threshold over all n keys: the k-th largest nonzero key (1 when at most k
// keys are nonzero). Radix select: a histogram of the keys' top kRadixBits bits finds the
// bin holding the k-th largest; only that bin's keys are then ordered (nth_element).
template <typename U>
U exact_threshold(const U* p, int64_t n, int64_t k) {
  constexpr int kRadixBits = 11;
  constexpr int kShift = static_cast<int>(sizeof(U)) * 8 - 1 - kRadixBits;
  constexpr int64_t kBins = int64_t(1) << kRadixBits;
  const U mask = abs_mask<U>();
  std::vector<int64_t> hist(kBins, 0);
  int64_t zeros = 0;
  std::mutex merge;
  at::parallel_for(0, num_chunks(n), 1, [&](int64_t b, int64_t e) {
    std::vector<int64_t> h(kBins, 0);
    int64_t z = 0;
    for (int64_t i = b * kChunk, hi = std::min(n, e * kChunk); i < hi; ++i) {
      const U a = static_cast<U>(p[i] & mask);
      ++h[a >> kShift];
      z += a == 0;
    }
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t j = 0; j < kBins; ++j) hist[j] += h[j];
    zeros += z;
  });
  if (n - zeros <= k) return U(1);
  int64_t above = 0, bin = kBins - 1;
  for (; bin > 0 && above + hist[bin] < k; --bin) above += hist[bin];
  std::vector<U> cand;
  cand.reserve(hist[bin]);
  for (int64_t i = 0; i < n; ++i) {
    const U a = static_cast<U>(p[i] & mask);
    if ((a >> kShift) == static_cast<U>(bin)) cand.push_back(a);
  }
  // The bin holds at least k - above >= 1 keys: the threshold is the (k - above)-th largest.
  const int64_t r = k - above;
  std::nth_element(cand.begin(), cand.begin() + (r - 1), cand.end(), std::greater<U>());
  return std::max<U>(cand[r - 1], U(1));
}

template <typename U, typename I>
void compact_lists(const U* p, const std::vector<std::vector<int64_t>>& lists, I* idx, U* vals) {
  std::vector<int64_t> counts(lists.size());
  for (size_t c = 0; c < lists.size(); ++c) counts[c] = static_cast<int64_t>(lists[c].size());
  const auto off = offsets_of(counts);
  at::parallel_for(0, static_cast<int64_t>(lists.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t o = off[c];
      for (int64_t i : lists[c]) {
        idx[o] = static_cast<I>(i);
        vals[o] = p[i];
        ++o;
      }
    }
  });
}

template <typename U, typename I>
void compact(const U* p, int64_t n, U t, const std::vector<int64_t>& counts, I* idx, U* vals) {
  const U mask = abs_mask<U>();
  const auto off = offsets_of(counts);
  at::parallel_for(0, static_cast<int64_t>(counts.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      if (counts[c] == 0) continue;
      int64_t o = off[c];
      for (int64_t i = c * kChunk, hi = std::min(n, (c + 1) * kChunk); i < hi; ++i) {
        const U v = p[i];
        if (static_cast<U>(v & mask) >= t) {
          idx[o] = static_cast<I>(i);
          vals[o] = v;
          ++o;
        }
      }
    }
  });
}

template <typename U>
int64_t choose_threshold(const U* p, int64_t n, int64_t k, int64_t m, uint64_t key, U& t,
                         std::vector<int64_t>& counts, std::vector<std::vector<int64_t>>& lists) {
  const U one = U(1);
  auto exact_all = [&]() {
    t = exact_threshold<U>(p, n, k);
    count_at<U>(p, n, t, counts);
  };
  if (k >= n) {  // every nonzero value
    t = one;
    count_at<U>(p, n, t, counts);
    return 2;
  }
  if (m <= 0) {
    exact_all();
    return 2;
  }
  // (1) sample: the places of a block of samples first, each prefetched, then their values
  // (random reads of a tensor that is not in cache: many misses in flight instead of one).
  const U mask = abs_mask<U>();
  std::vector<U> s(m);
  at::parallel_for(0, m, 4096, [&](int64_t b, int64_t e) {
    constexpr int64_t kBlock = 32;
    int64_t at_[kBlock];
    for (int64_t j0 = b; j0 < e; j0 += kBlock) {
      const int64_t j1 = std::min(e, j0 + kBlock);
      for (int64_t j = j0; j < j1; ++j) {
        at_[j - j0] = hgc::dgc_sample_place(key, j, n);
        __builtin_prefetch(p + at_[j - j0]);
      }
      for (int64_t j = j0; j < j1; ++j) s[j] = static_cast<U>(p[at_[j - j0]] & mask);
    }
  });
  int64_t r = static_cast<int64_t>(std::ceil(static_cast<double>(k) * static_cast<double>(m) / n));
  r = std::min(std::max<int64_t>(r, 1), m);
  const U t0 = std::max<U>(rth_largest(s, r), one);
  // (2) count, collecting the candidates' indices
  const int64_t c0 = count_collect<U>(p, n, t0, counts, lists);
  if (2 * c0 >= k && c0 <= 2 * k) {
    t = t0;
    return 0;
  }
  if (c0 > 2 * k) {  // (3) the exact k-th largest among the candidates, then filter them
    std::vector<U> cand;
    cand.reserve(c0);
    for (const auto& l : lists)
      for (int64_t i : l) cand.push_back(static_cast<U>(p[i] & mask));
    t = kth_largest<U>(cand, k);
    if (t != t0) {
      at::parallel_for(0, static_cast<int64_t>(lists.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          auto& l = lists[c];
          l.erase(std::remove_if(l.begin(), l.end(), [&](int64_t i) { return static_cast<U>(p[i] & mask) < t; }),
                  l.end());
          counts[c] = static_cast<int64_t>(l.size());
        }
      });
    }
    return 1;
  }
  lists.clear();
  exact_all();
  return 2;
}

template <typename U> double key_value(U t, at::ScalarType st) {
  if (st == at::kHalf) {
    const c10::Half h(static_cast<uint16_t>(t), c10::Half::from_bits());
    return static_cast<double>(static_cast<float>(h));
  }
  if (st == at::kBFloat16) {
    const c10::BFloat16 h(static_cast<uint16_t>(t), c10::BFloat16::from_bits());
    return static_cast<double>(static_cast<float>(h));
  }
  if (st == at::kFloat) {
    float f;
    uint32_t b = static_cast<uint32_t>(t);
    std::memcpy(&f, &b, 4);
    return f;
  }
  double d;
  uint64_t b = static_cast<uint64_t>(t);
  std::memcpy(&d, &b, 8);
  return d;
}

template <typename U>
std::tuple<at::Tensor, at::Tensor, double, int64_t> select_impl(const at::Tensor& x, int64_t k, int64_t m,
                                                                uint64_t key) {
  const int64_t n = x.numel();
  const U* p = static_cast<const U*>(x.data_ptr());
  U t = U(1);
  std::vector<int64_t> counts;
  std::vector<std::vector<int64_t>> lists;  // filled by the sampled paths (0, 1)
  const int64_t path = choose_threshold<U>(p, n, k, m, key, t, counts, lists);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const bool wide = n >= (int64_t(1) << 31);
  auto idx = at::empty({total}, x.options().dtype(wide ? at::kLong : at::kInt));
  auto vals = at::empty({total}, x.options());
  U* vp = static_cast<U*>(vals.data_ptr());
  if (path != 2) {
    if (wide)
      compact_lists<U, int64_t>(p, lists, idx.data_ptr<int64_t>(), vp);
    else
      compact_lists<U, int32_t>(p, lists, idx.data_ptr<int32_t>(), vp);
  } else if (wide) {
    compact<U, int64_t>(p, n, t, counts, idx.data_ptr<int64_t>(), vp);
  } else {
    compact<U, int32_t>(p, n, t, counts, idx.data_ptr<int32_t>(), vp);
  }
  return {idx, vals, key_value<U>(t, x.scalar_type()), path};
}

// Output chunk by chunk: every place no payload names gets the value an empty sum would
// (0 * scale, rounded), written as one streaming fill; the places the payloads name are summed
// in acc_t in rank order, scaled once and rounded once. acc is touched only at those places
// (zeroed, accumulated, read back), so a chunk costs a fill plus O(payload entries), not
// three passes over acc.
template <typename T, typename I>
void scatter_impl(const std::vector<const I*>& idx, const std::vector<const T*>& val,
                  const std::vector<int64_t>& cnt, int64_t n, double scale, T* out) {
  using acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
  const acc_t sc = static_cast<acc_t>(scale);
  const T empty = static_cast<T>(acc_t(0) * sc);
  const int64_t K = static_cast<int64_t>(idx.size());
  at::parallel_for(0, num_chunks(n), 1, [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(kChunk);
    std::vector<const I*> from(K), to(K);
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
      std::fill(out + lo, out + hi, empty);
      for (int64_t r = 0; r < K; ++r) {
        const I* ib = idx[r];
        const I* ie = ib + cnt[r];
        from[r] = std::lower_bound(ib, ie, static_cast<I>(lo));
        to[r] = std::lower_bound(from[r], ie, static_cast<I>(hi));  // hi <= n fits I (see the index dtype rule)
        for (const I* q = from[r]; q < to[r]; ++q) acc[*q - lo] = acc_t(0);
      }
      for (int64_t r = 0; r < K; ++r) {
        const T* v = val[r] + (from[r] - idx[r]);
        for (const I* q = from[r]; q < to[r]; ++q, ++v) acc[*q - lo] += static_cast<acc_t>(*v);
      }
      for (int64_t r = 0; r < K; ++r)
        for (const I* q = from[r]; q < to[r]; ++q) out[*q] = static_cast<T>(acc[*q - lo] * sc);
    }
  });
}

template <typename I>
void check_sorted(const at::Tensor& ix, int64_t n, int64_t r) {
  TORCH_CHECK(hgc::dgc_indices_valid(ix.data_ptr<I>(), ix.numel(), n), "dgc_decode: payload ", r,
              ": indices must be strictly increasing and in [0, ", n, ")");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select_cpu(const at::Tensor& x, int64_t k,
                                                                   int64_t sample_count, int64_t key) {
  hgc::check_values_input(x, at::kCPU, "x");
  hgc::check_dgc_select_args(k, sample_count);
  const int64_t n = x.numel();
  if (n == 0 || k == 0) {
    auto idx = at::empty({0}, x.options().dtype(hgc::dgc_index_type(n)));
    return {idx, at::empty({0}, x.options()), std::numeric_limits<double>::infinity(), 2};
  }
  const uint64_t ukey = static_cast<uint64_t>(key);
  switch (x.scalar_type()) {
    case at::kHalf:
    case at::kBFloat16: return select_impl<uint16_t>(x, k, sample_count, ukey);
    case at::kFloat: return select_impl<uint32_t>(x, k, sample_count, ukey);
    default: return select_impl<uint64_t>(x, k, sample_count, ukey);
  }
}

at::Tensor dgc_scatter_sum_cpu(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values,
                               int64_t n, at::ScalarType dtype, double scale,
                               const c10::optional<at::Tensor>& out_opt) {
  const bool wide = hgc::check_dgc_scatter_args(indices, values, n, dtype, at::kCPU) == at::kLong;
  const int64_t K = static_cast<int64_t>(indices.size());
  std::vector<at::Tensor> ix(K), vx(K);
  std::vector<int64_t> cnt(K);
  for (int64_t r = 0; r < K; ++r) {
    ix[r] = indices[r].contiguous();
    vx[r] = values[r].contiguous();
    cnt[r] = ix[r].numel();
    if (wide)
      check_sorted<int64_t>(ix[r], n, r);
    else
      check_sorted<int32_t>(ix[r], n, r);
  }
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, at::kCPU, "dgc_decode");
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "dgc_scatter_sum_cpu", [&] {
    std::vector<const scalar_t*> vp(K);
    for (int64_t r = 0; r < K; ++r) vp[r] = vx[r].data_ptr<scalar_t>();
    if (wide) {
      std::vector<const int64_t*> ip(K);
      for (int64_t r = 0; r < K; ++r) ip[r] = ix[r].data_ptr<int64_t>();
      scatter_impl<scalar_t, int64_t>(ip, vp, cnt, n, scale, out.data_ptr<scalar_t>());
    } else {
      std::vector<const int32_t*> ip(K);
      for (int64_t r = 0; r < K; ++r) ip[r] = ix[r].data_ptr<int32_t>();
      scatter_impl<scalar_t, int32_t>(ip, vp, cnt, n, scale, out.data_ptr<scalar_t>());
    }
  });
  return out;
}
