// The 1-bit codec's device launchers (onebit_device.cu, built by nvcc for CUDA and by g++ for
// the OpenMP twin): plain C++ over raw device pointers. Wire format, summation order and
// arithmetic are those of csrc/cpu/onebit_cpu.cpp (see onebit_functors.h): the same bytes and
// values. Arguments are checked by the caller (onebit_ops.cpp).
#pragma once

#include <cstdint>

#include "context.h"

namespace hgc_dev {

// What an encode runs: both passes, the first alone (the scales, read-only: onebit_scales) or
// the second alone, with the scales the first gave (the exchange measures before its preamble
// and packs after it; the same bits, scales and residual as kBoth).
enum class OnebitPasses { kBoth, kScales, kPack };

// Encodes the n-value matrix of `cols` >= 1 columns whose row i starts at element i * ld of
// `grad` (and of `residual`; nullptr: none): bits[ceil(n / 8)] (element i -> byte i / 8, bit
// i % 8) and scales[2 * cols] (a+ of every column, then a-); the residual, when given, becomes
// v - decoded in place. ld == cols: contiguous; ld > cols: a column window (cols >= 2). n == 0:
// every scale 0. `passes`: see OnebitPasses (kScales: bits unused; kPack: scales read).
// by_rows (rows mode): `cols` counts the ROWS of the contiguous [cols, n / cols] matrix (ld
// unused), each row with its a+ and a- (scales[2 * rows]), summed as a one-column tensor of the
// row's values; the bits in the same flat order.
void onebit_encode(const Ctx& ctx, DType dtype, const void* grad, void* residual, int64_t n, int64_t cols,
                   int64_t ld, uint8_t* bits, float* scales, OnebitPasses passes = OnebitPasses::kBoth,
                   bool by_rows = false);

// out = scale * the sum of K payloads (payload k's bits at bits + k * bits_stride, its scales at
// scales + k * scales_stride) of an n-value matrix of `cols` columns, row i written from element
// i * ld of `out` (ld == cols: contiguous; the other columns of a window are left as they are).
// by_rows: as in onebit_encode.
void onebit_decode_sum(const Ctx& ctx, DType dtype, const uint8_t* bits, int64_t bits_stride, const float* scales,
                       int64_t scales_stride, int64_t K, int64_t n, int64_t cols, int64_t ld, double scale,
                       void* out, bool by_rows = false);

// One tensor of a bucket encode: the arguments of onebit_encode (all of a bucket's tensors have
// one dtype, and a residual each or none).
struct OnebitEncodeItem {
  const void* grad;
  void* residual;
  int64_t n, cols, ld;
  uint8_t* bits;
  float* scales;
  bool by_rows = false;
};

// onebit_encode of every item, bitwise the same outputs, in a fixed number of device algorithm
// calls whatever `count` is (multi_tensor.cuh): at most 5 (block sums, column finish, lane
// totals, lane finish, pack) and one copy of the tables. n == 0 items get zero scales.
// `passes` as in onebit_encode, for every item (kScales: 4 calls at most, kPack: 1).
void onebit_encode_many(const Ctx& ctx, DType dtype, const OnebitEncodeItem* items, int64_t count,
                        bool with_residual, OnebitPasses passes = OnebitPasses::kBoth);

// One tensor of a bucket decode: the arguments of onebit_decode_sum (K and scale are the
// bucket's).
struct OnebitDecodeItem {
  const uint8_t* bits;
  int64_t bits_stride;
  const float* scales;
  int64_t scales_stride, n, cols, ld;
  void* out;
  bool by_rows = false;
};

// onebit_decode_sum of every item with the bucket's K and scale, bitwise the same outputs: one
// device algorithm call and one copy of the table.
void onebit_decode_sum_many(const Ctx& ctx, DType dtype, const OnebitDecodeItem* items, int64_t count, int64_t K,
                            double scale);

}  // namespace hgc_dev
