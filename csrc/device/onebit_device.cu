// 1-bit codec, device source: Thrust algorithms (for_each over the functors of
// onebit_functors.h) for CUDA (nvcc) and the OpenMP twin (g++). Calls per op: encode 3 for a
// matrix (block sums, column finish, pack), 4 for a one-column tensor or rows mode (block sums,
// lane totals, lane finish, pack), 0 for n == 0 (the scales alone: all but the pack; the pack alone: 1);
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

// One encode's layout: the matrix (cols columns, rows `ld` apart), its groups of scales and the
// statistics' segments: one matrix of cols >= 2 columns (FinishColumns), or one-column segments
// (lanes: a one-column tensor is one segment of n values, rows mode `groups` segments of a row
// each: LaneTotals, FinishLanes). Builds the functors of every stage.
struct Layout {
  int64_t n, groups, cols, ld;
  bool by_rows, lanes;
  int64_t segs, seg_len, scols, sld, srows, blocks, cells;

  Layout(int64_t n_, int64_t groups_, int64_t ld_, bool by_rows_) : n(n_), groups(groups_), by_rows(by_rows_) {
    cols = by_rows ? (groups > 0 ? n / groups : 0) : groups;
    ld = by_rows ? cols : ld_;
    lanes = by_rows || cols == 1;
    segs = by_rows ? groups : 1;
    seg_len = by_rows ? cols : n;
    scols = lanes ? kLanes : cols;
    sld = lanes ? kLanes : ld;
    srows = seg_len > 0 ? (seg_len + scols - 1) / scols : 0;
    blocks = (srows + kRowBlock - 1) / kRowBlock;
    cells = blocks * scols;
  }
  int64_t partials() const { return 3 * segs * cells; }  // BlockSums' outputs (sp, sn, sc)
  int64_t sum_count() const { return segs * cells; }
  int64_t lane_totals() const { return lanes ? 3 * kLanes * segs : 0; }
  int64_t bytes() const { return (n + 7) / 8; }

  template <typename T, bool kRes, typename A>
  BlockSums<T, kRes> sums(const T* g, const T* r, A* sp) const {
    return {g, r, srows, scols, sld, seg_len, cells, seg_len, sp, sp + sum_count(), sp + 2 * sum_count()};
  }
  template <typename A> LaneTotals<A> lane_stage(const A* sp, double* totals) const {
    return {sp, sp + sum_count(), sp + 2 * sum_count(), blocks, totals};
  }
  FinishLanes finish_lanes(const double* totals, float* scales) const { return {totals, seg_len, segs, scales}; }
  template <typename A> FinishColumns<A> finish_columns(const A* sp, float* scales) const {
    return {sp, sp + sum_count(), sp + 2 * sum_count(), blocks, cols, srows, scales};
  }
  template <typename T, bool kRes> Pack<T, kRes> pack(const T* g, T* r, const float* scales, uint8_t* bits) const {
    return {g, r, n, cols > 0 ? cols : 1, ld, groups, by_rows, scales, bits};
  }
};

// onebit_encode of one tensor laid out as L: the statistics' stages (unless kPack), then the pack
// (unless kScales).
template <typename T, bool kRes>
void encode_typed(Exec& ex, const T* g, T* r, const Layout& L, uint8_t* bits, float* scales, OnebitPasses passes) {
  using A = typename Elem<T>::acc;
  if (passes != OnebitPasses::kPack) {
    Scratch<A> part(ex, L.partials());
    ex.for_each_index(L.sum_count(), L.sums<T, kRes>(g, r, part.get()));
    if (L.lanes) {
      Scratch<double> totals(ex, L.lane_totals());
      ex.for_each_index(L.segs * kLanes, L.lane_stage<A>(part.get(), totals.get()));
      ex.for_each_index(L.segs, L.finish_lanes(totals.get(), scales));
    } else {
      ex.for_each_index(L.cols, L.finish_columns<A>(part.get(), scales));
    }
  }
  if (passes != OnebitPasses::kScales) ex.for_each_index(L.bytes(), L.pack<T, kRes>(g, r, scales, bits));
}

// The bucket version of encode_typed: the same functors per tensor, each stage one call for all.
template <typename T, bool kRes>
void encode_many_typed(Exec& ex, const OnebitEncodeItem* items, int64_t count, OnebitPasses passes) {
  const bool stats = passes != OnebitPasses::kPack, pack = passes != OnebitPasses::kScales;
  using A = typename Elem<T>::acc;
  std::vector<Layout> layouts;
  int64_t partials = 0, lane_totals = 0;
  for (int64_t t = 0; t < count; ++t) {
    const OnebitEncodeItem& it = items[t];
    layouts.emplace_back(it.n, it.cols, it.ld, it.by_rows);
    partials += stats ? layouts.back().partials() : 0;
    lane_totals += stats ? layouts.back().lane_totals() : 0;
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
    const Layout& L = layouts[static_cast<std::size_t>(t)];
    const T* g = static_cast<const T*>(it.grad);
    T* r = static_cast<T*>(it.residual);
    if (stats) {
      sums.add(L.sums<T, kRes>(g, r, sp), L.sum_count());
      if (L.lanes) {
        lanes.add(L.lane_stage<A>(sp, tot), L.segs * kLanes);
        finish_lanes.add(L.finish_lanes(tot, it.scales), L.segs);
        tot += L.lane_totals();
      } else {
        finish_columns.add(L.finish_columns<A>(sp, it.scales), L.cols);
      }
      sp += L.partials();
    }
    if (pack) pack_stage.add(L.pack<T, kRes>(g, r, it.scales, it.bits), L.bytes());
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

// The decode-sum functor of an n-value matrix in `groups` groups (see onebit_decode_sum).
template <typename T>
DecodeSum<T> decode_functor(const uint8_t* bits, int64_t bits_stride, const float* scales, int64_t scales_stride,
                            int64_t K, int64_t n, int64_t groups, int64_t ld, bool by_rows, double scale, void* out) {
  const Layout L(n, groups, ld, by_rows);
  return {bits, bits_stride, scales, scales_stride, K, n, L.cols > 0 ? L.cols : 1, L.ld, groups, by_rows,
          static_cast<typename Elem<T>::acc>(scale), static_cast<T*>(out)};
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
    Stage<DecodeSum<T>> decode;
    for (int64_t t = 0; t < count; ++t) {
      const OnebitDecodeItem& it = items[t];
      decode.add(decode_functor<T>(it.bits, it.bits_stride, it.scales, it.scales_stride, K, it.n, it.cols, it.ld,
                                   it.by_rows, scale, it.out),
                 (it.n + 7) / 8);
    }
    TableSet tables(ex);
    tables.put(decode);
    tables.upload();
    tables.run(decode);
  });
}

void onebit_encode(const Ctx& ctx, DType dtype, const void* grad, void* residual, int64_t n, int64_t cols,
                   int64_t ld, uint8_t* bits, float* scales, OnebitPasses passes, bool by_rows) {
  if (n <= 0) return;  // the caller's scales are zeros
  Exec ex(ctx);
  const Layout L(n, cols, ld, by_rows);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* g = static_cast<const T*>(grad);
    T* r = static_cast<T*>(residual);
    if (r) {
      encode_typed<T, true>(ex, g, r, L, bits, scales, passes);
    } else {
      encode_typed<T, false>(ex, g, nullptr, L, bits, scales, passes);
    }
  });
}

void onebit_decode_sum(const Ctx& ctx, DType dtype, const uint8_t* bits, int64_t bits_stride, const float* scales,
                       int64_t scales_stride, int64_t K, int64_t n, int64_t cols, int64_t ld, double scale,
                       void* out, bool by_rows) {
  if (n <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ex.for_each_index((n + 7) / 8, decode_functor<T>(bits, bits_stride, scales, scales_stride, K, n, cols, ld,
                                                      by_rows, scale, out));
  });
}

}  // namespace hgc_dev
