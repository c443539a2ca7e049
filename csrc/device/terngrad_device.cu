// TernGrad, device source: Thrust algorithms over the functors of terngrad_functors.h, for
// CUDA (nvcc) and the OpenMP twin (g++). Calls per op: max_abs 1 (transform_reduce: max is
// exact in any order), sigma 2 to 6 (two fixed-order sums, see terngrad_functors.h), encode 1,
// decode-sum 2 (plan + sum), sum_levels 1, sum_decode 1. A bucket of tensors of one dtype (the
// *_many launchers, multi_tensor.cuh): scale stats at most 10 (4 without sigma), encode 1,
// decode-sum 2, whatever its tensor count; each plus one copy of its tables.
#include <thrust/transform_reduce.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "exec.cuh"
#include "multi_tensor.cuh"
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

// The block levels of a bucket's fixed-order reductions: fixed_sum's loop with one stage per
// level, so a level runs once for all tensors (kSumLanes lanes need at most two levels).
constexpr int kLevels = 2;
static_assert(kSumLanes <= kSumBlock * kSumBlock, "two block levels reduce kSumLanes lanes");

template <typename Block> struct Levels {
  Stage<Block> stage[kLevels];

  // Adds the levels that reduce the m >= 1 values at `a` (`b`: scratch of ceil(m / kSumBlock)
  // values), alternating the two buffers as fixed_sum does; returns where the result lands.
  const double* add(int64_t m, double* a, double* b) {
    double *cur = a, *next = b;
    for (int level = 0; m > 1; ++level) {
      const int64_t nb = (m + kSumBlock - 1) / kSumBlock;
      stage[level].add(Block{cur, m, next}, nb);
      std::swap(cur, next);
      m = nb;
    }
    return cur;
  }
  void put(TableSet& tables) {
    for (Stage<Block>& s : stage) tables.put(s);
  }
  void run(TableSet& tables) {
    for (const Stage<Block>& s : stage) tables.run(s);
  }
};

// The scratch of one fixed-order reduction of n >= 1 values: the lanes, then the first level's blocks.
int64_t reduction_cells(int64_t n) {
  const int64_t lanes = sum_lanes(n);
  return lanes + (lanes + kSumBlock - 1) / kSumBlock;
}

// terngrad_scale_stats_many for one dtype: max |g| (LaneMax + levels) and, where asked, the
// sigma's two fixed-order sums (LaneSum + levels, as terngrad_sigma), each stage one call.
template <typename T> void stats_many_typed(Exec& ex, const TerngradStatsItem* items, int64_t count) {
  int64_t cells = 0;
  for (int64_t t = 0; t < count; ++t) {
    if (items[t].n > 0) cells += reduction_cells(items[t].n) * (items[t].sigma ? 3 : 1);
  }
  Scratch<double> scratch(ex, cells);
  Stage<LaneMax<T>> max_lanes;
  Stage<LaneSum<T, false>> sum_lanes_stage;
  Stage<LaneSum<T, true>> square_lanes;
  Levels<BlockMax> max_levels;
  Levels<BlockSum> sum_levels, square_levels;
  Stage<ScaleStats> finish;
  double* free_cells = scratch.get();
  for (int64_t t = 0; t < count; ++t) {
    const TerngradStatsItem& it = items[t];
    const T* x = static_cast<const T*>(it.grad);
    const double *max_abs = nullptr, *squares = nullptr;
    if (it.n > 0) {
      const int64_t lanes = sum_lanes(it.n);
      double* a = free_cells;
      max_lanes.add(LaneMax<T>{x, it.n, lanes, a}, lanes);
      max_abs = max_levels.add(lanes, a, a + lanes);
      free_cells += reduction_cells(it.n);
      if (it.sigma) {
        a = free_cells;
        sum_lanes_stage.add(LaneSum<T, false>{x, it.n, lanes, nullptr, a}, lanes);
        const double* sum = sum_levels.add(lanes, a, a + lanes);
        free_cells += reduction_cells(it.n);
        a = free_cells;
        square_lanes.add(LaneSum<T, true>{x, it.n, lanes, sum, a}, lanes);
        squares = square_levels.add(lanes, a, a + lanes);
        free_cells += reduction_cells(it.n);
      }
    }
    finish.add(ScaleStats{max_abs, squares, it.n, it.max_abs, it.sigma}, 1);
  }
  TableSet tables(ex);
  tables.put(max_lanes);
  max_levels.put(tables);
  tables.put(sum_lanes_stage);
  sum_levels.put(tables);
  tables.put(square_lanes);
  square_levels.put(tables);
  tables.put(finish);
  tables.upload();
  tables.run(max_lanes);
  max_levels.run(tables);
  tables.run(sum_lanes_stage);
  sum_levels.run(tables);
  tables.run(square_lanes);
  square_levels.run(tables);
  tables.run(finish);
}

}  // namespace

void terngrad_scale_stats_many(const Ctx& ctx, DType dtype, const TerngradStatsItem* items, int64_t count) {
  if (count <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) { stats_many_typed<std::remove_pointer_t<decltype(tag)>>(ex, items, count); });
}

void terngrad_encode_many(const Ctx& ctx, DType dtype, const TerngradEncodeItem* items, int64_t count) {
  if (count <= 0) return;
  Exec ex(ctx);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Elem<T>::acc;
    Stage<EncodeByte<T>> encode;
    for (int64_t t = 0; t < count; ++t) {
      const TerngradEncodeItem& it = items[t];
      encode.add(EncodeByte<T>{static_cast<const T*>(it.grad), it.n, static_cast<A>(it.scale), static_cast<A>(it.clip),
                               it.key0, it.key1, it.scale == 0.0, it.codes},
                 (it.n + 3) / 4);
    }
    TableSet tables(ex);
    tables.put(encode);
    tables.upload();
    tables.run(encode);
  });
}

void terngrad_decode_sum_many(const Ctx& ctx, DType dtype, const TerngradDecodeItem* items, int64_t count, int64_t K,
                              double scale) {
  if (count <= 0 || K <= 0) return;
  Exec ex(ctx);
  Scratch<int> shared(ex, count);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    Stage<DecodePlan> plans;
    Stage<DecodeSum<T>> sums;
    for (int64_t t = 0; t < count; ++t) {
      const TerngradDecodeItem& it = items[t];
      if (it.n <= 0) continue;  // as terngrad_decode_sum: nothing to write
      plans.add(DecodePlan{it.scales, it.sstride, K, shared.get() + t}, 1);
      sums.add(DecodeSum<T>{it.codes, it.cstride, it.scales, it.sstride, K, it.n, scale, shared.get() + t,
                            static_cast<T*>(it.out)},
               (it.n + 3) / 4);
    }
    TableSet tables(ex);
    tables.put(plans);
    tables.put(sums);
    tables.upload();
    tables.run(plans);
    tables.run(sums);
  });
}

double terngrad_max_abs(const Ctx& ctx, DType dtype, const void* g, int64_t n) {
  if (n <= 0) return 0.0;
  Exec ex(ctx);
  double m = 0.0;
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    m = thrust::transform_reduce(ex.policy_read(), thrust::counting_iterator<int64_t>(0),
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
