// TernGrad's functors, shared by the device source (terngrad_device.cu: CUDA and the OpenMP
// twin) and, for the fixed-order sums of the clip's sigma, by the CPU kernel
// (csrc/cpu/terngrad_cpu.cpp). Plain C++ over raw pointers: no Thrust, no PyTorch.
//
// Each functor owns the output words of its index (a code byte, a field, an element, a lane,
// a block): no two indices write one word. The wire format and arithmetic are those of
// csrc/cpu/terngrad_cpu.cpp, computed in Elem<T>::acc (float; double for fp64).
#pragma once

#include <cmath>
#include <cstdint>

#include "../host_device.h"
#include "half_bits.h"

namespace hgc_dev {
namespace terngrad {

// ---- the random stream (horovod_gradcomp/codecs/terngrad.py) ----------------------------------

HGC_HOST_DEVICE inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

HGC_HOST_DEVICE inline uint32_t hash_index(uint32_t i, uint32_t k0, uint32_t k1) { return mix32(mix32(i + k0) ^ k1); }

// ---- fixed-order sums in double (the clip's sigma) ---------------------------------------------
//
// sum(v[0, n)) is defined as: L = min(n, kSumLanes) lanes, lane p = ((0.0 + v[p]) + v[p + L]) +
// ... in index order; then the lanes are summed in blocks of kSumBlock (each block 0.0 + its
// values in order), and the block sums again, until one value is left. The order depends on n
// only (not on threads or backend); horovod_gradcomp/codecs/terngrad.py's reference follows it.
constexpr int64_t kSumLanes = 65536;
constexpr int64_t kSumBlock = 256;

HGC_HOST_DEVICE inline int64_t sum_lanes(int64_t n) { return n < kSumLanes ? n : kSumLanes; }

// The summand of element i: the value in double (kSquares: its squared deviation from mean).
template <typename T, bool kSquares> struct Summand {
  HGC_HOST_DEVICE static double of(T x, double mean) {
    double v = static_cast<double>(Elem<T>::load(x));
    if (kSquares) {
      v = v - mean;
      v = v * v;
    }
    return v;
  }
};

// Lane p of the sum of the summands of x[0, n); kSquares: mean = *total / n (the first pass's
// sum, read on the device: no host round trip between the passes).
template <typename T, bool kSquares> struct LaneSum {
  const T* x;
  int64_t n, lanes;
  const double* total;  // kSquares only
  double* out;          // [lanes]
  HGC_HOST_DEVICE void operator()(int64_t p) const {
    const double mean = kSquares ? *total / static_cast<double>(n) : 0.0;
    double acc = 0.0;
    for (int64_t i = p; i < n; i += lanes) acc = acc + Summand<T, kSquares>::of(x[i], mean);
    out[p] = acc;
  }
};

// out[b] = 0.0 + in[b * kSumBlock] + ... (in index order, up to in[m - 1]).
struct BlockSum {
  const double* in;
  int64_t m;
  double* out;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    const int64_t lo = b * kSumBlock, hi = lo + kSumBlock < m ? lo + kSumBlock : m;
    double acc = 0.0;
    for (int64_t j = lo; j < hi; ++j) acc = acc + in[j];
    out[b] = acc;
  }
};

// ---- max |g| -----------------------------------------------------------------------------------

template <typename T> struct AbsOf {
  const T* g;
  HGC_HOST_DEVICE double operator()(int64_t i) const {
    return fabs(static_cast<double>(Elem<T>::load(g[i])));  // +0 for -0; NaN stays NaN
  }
};

// max, any NaN wins (exact whatever the order: the result is the largest value or a NaN).
struct MaxNan {
  HGC_HOST_DEVICE double operator()(double a, double b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
};

// Lane p of max |x[i]| over x[0, n) (i = p, p + lanes, ...; any NaN wins): with BlockMax the
// bucket op's max |g|, exact whatever the order (so equal to terngrad_max_abs' reduce).
template <typename T> struct LaneMax {
  const T* x;
  int64_t n, lanes;
  double* out;  // [lanes]
  HGC_HOST_DEVICE void operator()(int64_t p) const {
    double acc = 0.0;
    for (int64_t i = p; i < n; i += lanes) acc = MaxNan()(acc, AbsOf<T>{x}(i));
    out[p] = acc;
  }
};

// out[b] = the MaxNan of in[b * kSumBlock] ... (up to in[m - 1]): BlockSum's shape, for max.
struct BlockMax {
  const double* in;
  int64_t m;
  double* out;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    const int64_t lo = b * kSumBlock, hi = lo + kSumBlock < m ? lo + kSumBlock : m;
    double acc = 0.0;
    for (int64_t j = lo; j < hi; ++j) acc = MaxNan()(acc, in[j]);
    out[b] = acc;
  }
};

// One tensor's scale statistics from its finished reductions (one index): *max_out = *max_abs
// (0 without one: n == 0); when sigma_out is given, *sigma_out = sqrt(*squares / n) as
// terngrad_sigma computes it (0 without squares: n == 0).
struct ScaleStats {
  const double* max_abs;
  const double* squares;
  int64_t n;
  double* max_out;
  double* sigma_out;
  HGC_HOST_DEVICE void operator()(int64_t) const {
    *max_out = max_abs ? *max_abs : 0.0;
    if (sigma_out) *sigma_out = squares ? sqrt(*squares / static_cast<double>(n)) : 0.0;
  }
};

// ---- encode ------------------------------------------------------------------------------------

// Code byte b: elements 4b..4b+3 (those below n) at bits 2t, code (u * s < min(|g|, clip)) ?
// (g < 0 ? 2 : 1) : 0; zero: all codes 0 (s == 0).
template <typename T> struct EncodeByte {
  using A = typename Elem<T>::acc;
  const T* g;
  int64_t n;
  A s, clip;
  uint32_t k0, k1;
  bool zero;
  uint8_t* codes;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    uint32_t byte = 0;
    for (int t = 0; t < 4 && !zero; ++t) {
      const int64_t i = 4 * b + t;
      if (i >= n) break;
      const A v = Elem<T>::load(g[i]);
      A a = v < A(0) ? -v : v;
      a = clip < a ? clip : a;  // a NaN stays NaN (never selected)
      const uint32_t h = hash_index(static_cast<uint32_t>(i), k0, k1);
      const A u = static_cast<A>(static_cast<int32_t>(h >> 8)) * static_cast<A>(0x1p-24);
      if (u * s < a) byte |= (v < A(0) ? 2u : 1u) << (2 * t);
    }
    codes[b] = static_cast<uint8_t>(byte);
  }
};

// ---- decode ------------------------------------------------------------------------------------

// The integer path's limit: biased sums 0..2K in 16 bits (the CPU kernel's lanes).
constexpr int64_t kMaxIntK = 32767;

HGC_HOST_DEVICE inline int32_t ternary_value(uint32_t code) {  // 0 -> 0, 1 -> +1, 2 -> -1, 3 -> 0
  return static_cast<int32_t>(code & 1u) - static_cast<int32_t>(code >> 1);
}

// *shared = 1 when the K scales take the integer path (as the CPU kernel decides: K <= kMaxIntK,
// all equal to the first, which is not NaN). One index.
struct DecodePlan {
  const float* scales;
  int64_t sstride, K;
  int* shared;
  HGC_HOST_DEVICE void operator()(int64_t) const {
    const float s0 = scales[0];
    bool ok = K <= kMaxIntK && s0 == s0;
    for (int64_t k = 1; k < K && ok; ++k) ok = scales[k * sstride] == s0;
    *shared = ok ? 1 : 0;
  }
};

// Elements 4b..4b+3 of scale * sum_k s_k v_k: integer sums times (s_0 * scale) on the shared
// path, else the weighted sum in the arithmetic type, k in order (the CPU kernel's arithmetic).
template <typename T> struct DecodeSum {
  using A = typename Elem<T>::acc;
  const uint8_t* codes;
  int64_t cstride;
  const float* scales;
  int64_t sstride, K, n;
  double scale;
  const int* shared;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    A r[4];
    if (*shared) {
      int32_t sum[4] = {0, 0, 0, 0};
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t c = codes[k * cstride + b];
        for (int t = 0; t < 4; ++t) sum[t] += ternary_value((c >> (2 * t)) & 3u);
      }
      const A mult = static_cast<A>(static_cast<double>(scales[0]) * scale);
      for (int t = 0; t < 4; ++t) r[t] = static_cast<A>(sum[t]) * mult;
    } else {
      A acc[4] = {A(0), A(0), A(0), A(0)};
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t c = codes[k * cstride + b];
        const A w = static_cast<A>(scales[k * sstride]);
        for (int t = 0; t < 4; ++t) {
          const A wv = w * static_cast<A>(static_cast<float>(ternary_value((c >> (2 * t)) & 3u)));
          acc[t] = acc[t] + wv;
        }
      }
      const A mult = static_cast<A>(scale);
      for (int t = 0; t < 4; ++t) r[t] = acc[t] * mult;
    }
    for (int t = 0; t < 4 && 4 * b + t < n; ++t) out[4 * b + t] = Elem<T>::store(r[t]);
  }
};

// ---- the two-phase owner's exact sums (horovod_gradcomp/codecs/ternary_sum.py) ---------------

// Code byte b of the K rows -> the biased sums sum_k v_k + K of elements 4b..4b+3 as `width`-bit
// fields: 4 (two per byte, low nibble first; level bytes 2b, 2b+1), 8 (bytes 4b..4b+3) or 16
// (little-endian, bytes 8b..8b+7); only fields of elements below n (a lone last nibble's high
// half is 0).
struct SumLevels {
  const uint8_t* codes;
  int64_t cstride, K, n;
  int width;
  uint8_t* levels;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    int32_t f[4] = {0, 0, 0, 0};
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t c = codes[k * cstride + b];
      for (int t = 0; t < 4; ++t) f[t] += ternary_value((c >> (2 * t)) & 3u);
    }
    const int64_t i0 = 4 * b;
    for (int t = 0; t < 4; ++t) f[t] += static_cast<int32_t>(K);
    if (width == 4) {
      for (int h = 0; h < 2 && i0 + 2 * h < n; ++h) {
        const uint32_t hi4 = i0 + 2 * h + 1 < n ? static_cast<uint32_t>(f[2 * h + 1]) << 4 : 0u;
        levels[2 * b + h] = static_cast<uint8_t>(static_cast<uint32_t>(f[2 * h]) | hi4);
      }
    } else if (width == 8) {
      for (int t = 0; t < 4 && i0 + t < n; ++t) levels[i0 + t] = static_cast<uint8_t>(f[t]);
    } else {
      for (int t = 0; t < 4 && i0 + t < n; ++t) {
        levels[2 * (i0 + t)] = static_cast<uint8_t>(f[t] & 0xFF);
        levels[2 * (i0 + t) + 1] = static_cast<uint8_t>((f[t] >> 8) & 0xFF);
      }
    }
  }
};

// out[i] = (field_i - K) * mult in the arithmetic type (mult rounded once to it).
template <typename T> struct SumDecode {
  using A = typename Elem<T>::acc;
  const uint8_t* levels;
  int64_t K;
  int width;
  double mult;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    uint32_t f;
    if (width == 4) {
      f = (levels[i / 2] >> (4 * (i & 1))) & 15u;
    } else if (width == 8) {
      f = levels[i];
    } else {
      f = static_cast<uint32_t>(levels[2 * i]) | (static_cast<uint32_t>(levels[2 * i + 1]) << 8);
    }
    const A m = static_cast<A>(mult);
    out[i] = Elem<T>::store(static_cast<A>(static_cast<int32_t>(f) - static_cast<int32_t>(K)) * m);
  }
};

}  // namespace terngrad
}  // namespace hgc_dev
