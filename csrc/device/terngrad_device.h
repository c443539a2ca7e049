// TernGrad's device launchers (terngrad_device.cu, built by nvcc for CUDA and by g++ for the
// OpenMP twin): plain C++ over raw device pointers. Wire format, random stream and arithmetic
// are csrc/cpu/terngrad_cpu.h's: the same bytes and values. Arguments are checked by the
// caller (terngrad_ops.cpp).
#pragma once

#include <cstdint>

#include "context.h"

namespace hgc_dev {

// max |g_i| over n values (exact; NaN when g holds one; 0 for n == 0), read back to the host.
double terngrad_max_abs(const Ctx& ctx, DType dtype, const void* g, int64_t n);

// The population standard deviation of g's n >= 1 values in double, both sums in the fixed
// order of terngrad_functors.h (mean = sum / n, then sqrt(sum((g - mean)^2) / n)): the clip's
// sigma, bitwise that of terngrad_sigma_cpu. Read back to the host.
double terngrad_sigma(const Ctx& ctx, DType dtype, const void* g, int64_t n);

// codes[ceil(n/4)] of g: code_i = (u_i * s < min(|g_i|, clip)) ? (g_i < 0 ? 2 : 1) : 0 in the
// arithmetic type; scale == 0: all codes 0.
void terngrad_encode(const Ctx& ctx, DType dtype, const void* g, int64_t n, double scale, double clip, uint32_t key0,
                     uint32_t key1, uint8_t* codes);

// out (n values of dtype) = scale * sum_k s_k v_k of K payloads (codes row k at codes + k *
// cstride, its scale at scales[k * sstride]); the integer path when the scales are shared.
void terngrad_decode_sum(const Ctx& ctx, DType dtype, const uint8_t* codes, int64_t cstride, const float* scales,
                         int64_t sstride, int64_t K, int64_t n, double scale, void* out);

// levels[ceil(n * width / 8)] = the biased sums sum_k v_k + K of K code rows, width-bit fields.
void terngrad_sum_levels(const Ctx& ctx, const uint8_t* codes, int64_t cstride, int64_t K, int64_t n, int width,
                         uint8_t* levels);

// out (n values of dtype) = (field_i - K) * mult of terngrad_sum_levels' fields.
void terngrad_sum_decode(const Ctx& ctx, DType dtype, const uint8_t* levels, int64_t n, int64_t K, int width,
                         double mult, void* out);

// ---- a bucket at once (multi_tensor.cuh): every tensor's result bitwise that of the per-tensor
// launcher above, in a fixed number of device algorithm calls whatever the tensor count. All of
// a launcher's items have the one dtype it is given.

// One tensor of a bucket's scale statistics: *max_abs = terngrad_max_abs of its n values, and
// *sigma = terngrad_sigma of them when `sigma` is given (nullptr: not computed, not written).
struct TerngradStatsItem {
  const void* grad;
  int64_t n;
  double* max_abs;
  double* sigma;
};

// The statistics of every item, left in device memory (the caller reads all of them back in
// one copy): at most 10 calls (max: lanes + 2 block levels; sigma: 2 x (lanes + 2 block
// levels); one finish) and one copy of the tables.
void terngrad_scale_stats_many(const Ctx& ctx, DType dtype, const TerngradStatsItem* items, int64_t count);

// One tensor of a bucket encode: terngrad_encode's arguments.
struct TerngradEncodeItem {
  const void* grad;
  int64_t n;
  double scale, clip;
  uint32_t key0, key1;
  uint8_t* codes;
};

// terngrad_encode of every item: one call and one copy of the table.
void terngrad_encode_many(const Ctx& ctx, DType dtype, const TerngradEncodeItem* items, int64_t count);

// One tensor of a bucket decode: terngrad_decode_sum's arguments (K and scale are the bucket's).
struct TerngradDecodeItem {
  const uint8_t* codes;
  int64_t cstride;
  const float* scales;
  int64_t sstride, n;
  void* out;
};

// terngrad_decode_sum of every item with the bucket's K and scale: two calls (plans, sums) and
// one copy of the tables.
void terngrad_decode_sum_many(const Ctx& ctx, DType dtype, const TerngradDecodeItem* items, int64_t count, int64_t K,
                              double scale);

}  // namespace hgc_dev
