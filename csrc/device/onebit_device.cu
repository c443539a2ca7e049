// 1-bit codec, device source: Thrust algorithms (for_each over the functors of
// onebit_functors.h) for CUDA (nvcc) and the OpenMP twin (g++). Calls per op: encode 3 for a
// matrix (block sums, column finish, pack), 4 for a one-column tensor (block sums, lane totals,
// lane finish, pack), 0 for n == 0 (the scales alone: all but the pack; the pack alone: 1);
// decode-sum 1 (0 for n == 0). A bucket of tensors of one dtype (the *_many launchers): encode at
// most 5 (scales alone 4, pack alone 1), decode-sum 1, whatever its tensor count.
#include <type_traits>
#include <vector>

#include "exec.cuh"
#include "multi_tensor.cuh"
#include "onebit_device.h"
#include "onebit_functors.h"

namespace hgc_dev {

using namespace onebit;

namespace {

template <typename T, bool kRes>
void encode_typed(Exec& ex, const T* g, T* r, int64_t n, int64_t cols, int64_t ld, uint8_t* bits, float* scales,
                  OnebitPasses passes) {
  using A = typename Elem<T>::acc;
  if (passes == OnebitPasses::kPack) {
    ex.for_each_index((n + 7) / 8, Pack<T, kRes>{g, r, n, cols, ld, scales, bits});
    return;
  }
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
  if (passes == OnebitPasses::kBoth) ex.for_each_index((n + 7) / 8, Pack<T, kRes>{g, r, n, cols, ld, scales, bits});
}

// The bucket version of encode_typed: the same functors per tensor, each stage one call for all.
template <typename T, bool kRes>
void encode_many_typed(Exec& ex, const OnebitEncodeItem* items, int64_t count, OnebitPasses passes) {
  const bool stats = passes != OnebitPasses::kPack, pack = passes != OnebitPasses::kScales;
  using A = typename Elem<T>::acc;
  struct Shape {
    int64_t scols, sld, rows, blocks;
  };
  std::vector<Shape> shapes(static_cast<std::size_t>(count));
  int64_t partials = 0, lane_totals = 0;
  for (int64_t t = 0; t < count; ++t) {
    const OnebitEncodeItem& it = items[t];
    const bool one_col = it.cols == 1;
    Shape& s = shapes[static_cast<std::size_t>(t)];
    s.scols = one_col ? kLanes : it.cols;
    s.sld = one_col ? kLanes : it.ld;
    s.rows = it.n > 0 ? (it.n + s.scols - 1) / s.scols : 0;
    s.blocks = stats ? (s.rows + kRowBlock - 1) / kRowBlock : 0;
    partials += 3 * s.blocks * s.scols;
    if (one_col && stats) lane_totals += 3 * kLanes;
  }
  Scratch<A> part(ex, partials);
  Scratch<double> totals(ex, lane_totals);
  Stage<BlockSums<T, kRes>> sums;
  Stage<FinishColumns<A>> finish_columns;
  Stage<LaneTotals<A>> lanes;
  Stage<FinishLanes> finish_lanes;
  Stage<Pack<T, kRes>> pack_stage;
  A* sp = part.get();
  double* tot = totals.get();
  for (int64_t t = 0; t < count; ++t) {
    const OnebitEncodeItem& it = items[t];
    const Shape& s = shapes[static_cast<std::size_t>(t)];
    const T* g = static_cast<const T*>(it.grad);
    T* r = static_cast<T*>(it.residual);
    const int64_t cells = s.blocks * s.scols;
    A* sn = sp + cells;
    A* sc = sn + cells;
    if (stats) {
      sums.add(BlockSums<T, kRes>{g, r, s.rows, s.scols, s.sld, it.n, sp, sn, sc}, cells);
      if (it.cols == 1) {
        lanes.add(LaneTotals<A>{sp, sn, sc, s.blocks, tot}, kLanes);
        finish_lanes.add(FinishLanes{tot, it.n, it.scales}, 1);
        tot += 3 * kLanes;
      } else {
        finish_columns.add(FinishColumns<A>{sp, sn, sc, s.blocks, it.cols, s.rows, it.scales}, it.cols);
      }
      sp = sc + cells;
    }
    if (pack) {
      pack_stage.add(Pack<T, kRes>{g, r, it.n, it.cols > 0 ? it.cols : 1, it.ld, it.scales, it.bits}, (it.n + 7) / 8);
    }
  }
  TableSet tables(ex);
  tables.put(sums);
  tables.put(finish_columns);
  tables.put(lanes);
  tables.put(finish_lanes);
  tables.put(pack_stage);
  tables.upload();
  tables.run(sums);
  tables.run(finish_columns);
  tables.run(lanes);
  tables.run(finish_lanes);
  tables.run(pack_stage);
}

}  // namespace

void onebit_encode_many(const Ctx& ctx, DType dtype, const OnebitEncodeItem* items, int64_t count,
                        bool with_residual, OnebitPasses passes) {
  if (count <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (with_residual) {
      encode_many_typed<T, true>(ex, items, count, passes);
    } else {
      encode_many_typed<T, false>(ex, items, count, passes);
    }
  });
}

void onebit_decode_sum_many(const Ctx& ctx, DType dtype, const OnebitDecodeItem* items, int64_t count, int64_t K,
                            double scale) {
  if (count <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Elem<T>::acc;
    Stage<DecodeSum<T>> decode;
    for (int64_t t = 0; t < count; ++t) {
      const OnebitDecodeItem& it = items[t];
      decode.add(DecodeSum<T>{it.bits, it.bits_stride, it.scales, it.scales_stride, K, it.n, it.cols > 0 ? it.cols : 1,
                              it.ld, static_cast<A>(scale), static_cast<T*>(it.out)},
                 (it.n + 7) / 8);
    }
    TableSet tables(ex);
    tables.put(decode);
    tables.upload();
    tables.run(decode);
  });
}

void onebit_encode(const Ctx& ctx, DType dtype, const void* grad, void* residual, int64_t n, int64_t cols,
                   int64_t ld, uint8_t* bits, float* scales, OnebitPasses passes) {
  if (n <= 0) return;  // the caller's scales are zeros
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* g = static_cast<const T*>(grad);
    T* r = static_cast<T*>(residual);
    if (r) {
      encode_typed<T, true>(ex, g, r, n, cols, ld, bits, scales, passes);
    } else {
      encode_typed<T, false>(ex, g, nullptr, n, cols, ld, bits, scales, passes);
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
