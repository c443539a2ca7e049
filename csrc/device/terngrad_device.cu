// TernGrad, device source: Thrust algorithms over the functors of terngrad_functors.h, for
// CUDA (nvcc) and the OpenMP twin (g++). Calls per op: max_abs 1 (transform_reduce: max is
// exact in any order), sigma 2 to 6 (two fixed-order sums, see terngrad_functors.h), encode 1,
// decode-sum 2 (plan + sum), sum_levels 1, sum_decode 1.
#include <thrust/transform_reduce.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "exec.cuh"
#include "terngrad_device.h"
#include "terngrad_functors.h"

namespace hgc_dev {

using namespace terngrad;

namespace {

// The fixed-order sum (terngrad_functors.h) of the summands of g[0, n), n >= 1: lanes, then
// blocks of blocks. Returns a device pointer to the sum (in `a` or `b`, each >= sum_lanes(n)).
template <typename T, bool kSquares>
const double* fixed_sum(Exec& ex, const T* g, int64_t n, const double* total, double* a, double* b) {
  int64_t m = sum_lanes(n);
  ex.for_each_index(m, LaneSum<T, kSquares>{g, n, m, total, a});
  double *cur = a, *next = b;
  while (m > 1) {
    const int64_t nb = (m + kSumBlock - 1) / kSumBlock;
    ex.for_each_index(nb, BlockSum{cur, m, next});
    double* t = cur;
    cur = next;
    next = t;
    m = nb;
  }
  return cur;
}

}  // namespace

double terngrad_max_abs(const Ctx& ctx, DType dtype, const void* g, int64_t n) {
  if (n <= 0) return 0.0;
  Exec ex(ctx);
  double m = 0.0;
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    m = thrust::transform_reduce(ex.policy(), thrust::counting_iterator<int64_t>(0),
                                 thrust::counting_iterator<int64_t>(n), AbsOf<T>{static_cast<const T*>(g)}, 0.0,
                                 MaxNan());
  });
  return m != m ? std::numeric_limits<double>::quiet_NaN() : m;
}

double terngrad_sigma(const Ctx& ctx, DType dtype, const void* g, int64_t n) {
  if (n <= 0) return 0.0;
  Exec ex(ctx);
  const int64_t lanes = sum_lanes(n), blocks = (lanes + kSumBlock - 1) / kSumBlock;
  Scratch<double> a1(ex, lanes), b1(ex, blocks), a2(ex, lanes), b2(ex, blocks);
  double var_sum = 0.0;
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(g);
    const double* sum = fixed_sum<T, false>(ex, x, n, nullptr, a1.get(), b1.get());
    const double* sq = fixed_sum<T, true>(ex, x, n, sum, a2.get(), b2.get());
    ex.to_host(&var_sum, sq, sizeof(double));
  });
  return std::sqrt(var_sum / static_cast<double>(n));
}

void terngrad_encode(const Ctx& ctx, DType dtype, const void* g, int64_t n, double scale, double clip, uint32_t key0,
                     uint32_t key1, uint8_t* codes) {
  const int64_t nbytes = (n + 3) / 4;
  if (nbytes <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Elem<T>::acc;
    ex.for_each_index(nbytes, EncodeByte<T>{static_cast<const T*>(g), n, static_cast<A>(scale),
                                            static_cast<A>(clip), key0, key1, scale == 0.0, codes});
  });
}

void terngrad_decode_sum(const Ctx& ctx, DType dtype, const uint8_t* codes, int64_t cstride, const float* scales,
                         int64_t sstride, int64_t K, int64_t n, double scale, void* out) {
  if (n <= 0 || K <= 0) return;
  Exec ex(ctx);
  Scratch<int> shared(ex, 1);
  ex.for_each_index(1, DecodePlan{scales, sstride, K, shared.get()});
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ex.for_each_index((n + 3) / 4, DecodeSum<T>{codes, cstride, scales, sstride, K, n, scale, shared.get(),
                                                static_cast<T*>(out)});
  });
}

void terngrad_sum_levels(const Ctx& ctx, const uint8_t* codes, int64_t cstride, int64_t K, int64_t n, int width,
                         uint8_t* levels) {
  if (n <= 0) return;
  Exec ex(ctx);
  ex.for_each_index((n + 3) / 4, SumLevels{codes, cstride, K, n, width, levels});
}

void terngrad_sum_decode(const Ctx& ctx, DType dtype, const uint8_t* levels, int64_t n, int64_t K, int width,
                         double mult, void* out) {
  if (n <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ex.for_each_index(n, SumDecode<T>{levels, K, width, mult, static_cast<T*>(out)});
  });
}

}  // namespace hgc_dev
