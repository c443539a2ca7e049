// 1-bit codec, device source: Thrust algorithms (for_each over the functors of
// onebit_functors.h) for CUDA (nvcc) and the OpenMP twin (g++). Calls per op: encode 3 for a
// matrix (block sums, column finish, pack), 4 for a one-column tensor (block sums, lane totals,
// lane finish, pack), 0 for n == 0; decode-sum 1 (0 for n == 0).
#include <type_traits>

#include "exec.cuh"
#include "onebit_device.h"
#include "onebit_functors.h"

namespace hgc_dev {

using namespace onebit;

namespace {

template <typename T, bool kRes>
void encode_typed(Exec& ex, const T* g, T* r, int64_t n, int64_t cols, int64_t ld, uint8_t* bits, float* scales) {
  using A = typename Elem<T>::acc;
  // The column sums' matrix: the tensor itself, or a one-column tensor's [ceil(n / kLanes), kLanes] view.
  const bool one_col = cols == 1;
  const int64_t scols = one_col ? kLanes : cols;
  const int64_t sld = one_col ? kLanes : ld;
  const int64_t rows = (n + scols - 1) / scols;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  Scratch<A> part(ex, 3 * blocks * scols);
  A* sp = part.get();
  A* sn = sp + blocks * scols;
  A* sc = sn + blocks * scols;
  ex.for_each_index(blocks * scols, BlockSums<T, kRes>{g, r, rows, scols, sld, n, sp, sn, sc});
  if (one_col) {
    Scratch<double> totals(ex, 3 * kLanes);
    ex.for_each_index(kLanes, LaneTotals<A>{sp, sn, sc, blocks, totals.get()});
    ex.for_each_index(1, FinishLanes{totals.get(), n, scales});
  } else {
    ex.for_each_index(cols, FinishColumns<A>{sp, sn, sc, blocks, cols, rows, scales});
  }
  ex.for_each_index((n + 7) / 8, Pack<T, kRes>{g, r, n, cols, ld, scales, bits});
}

}  // namespace

void onebit_encode(const Ctx& ctx, DType dtype, const void* grad, void* residual, int64_t n, int64_t cols,
                   int64_t ld, uint8_t* bits, float* scales) {
  if (n <= 0) return;  // the caller's scales are zeros
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* g = static_cast<const T*>(grad);
    T* r = static_cast<T*>(residual);
    if (r) {
      encode_typed<T, true>(ex, g, r, n, cols, ld, bits, scales);
    } else {
      encode_typed<T, false>(ex, g, nullptr, n, cols, ld, bits, scales);
    }
  });
}

void onebit_decode_sum(const Ctx& ctx, DType dtype, const uint8_t* bits, int64_t bits_stride, const float* scales,
                       int64_t scales_stride, int64_t K, int64_t n, int64_t cols, int64_t ld, double scale,
                       void* out) {
  if (n <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Elem<T>::acc;
    ex.for_each_index((n + 7) / 8, DecodeSum<T>{bits, bits_stride, scales, scales_stride, K, n, cols, ld,
                                                 static_cast<A>(scale), static_cast<T*>(out)});
  });
}

}  // namespace hgc_dev
