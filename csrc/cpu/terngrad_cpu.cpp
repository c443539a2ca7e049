// TernGrad codec, CPU.
//
// Randomness is counter-based: the uniform of element i is a function of (i, key0, key1) only
// (two rounds of a 32-bit integer hash), so threads split the work freely and the pure-torch
// reference reproduces every code bit for bit.
//
// Encode is one pass: 32 values at a time, the selection mask (u*s < min(|g|, clip)) and the
// sign mask become 32-bit masks that are interleaved into 64 bits of 2-bit codes. On x86-64
// with AVX2 (checked at run time) the fp32 pass (and fp16/bf16 through a float block) runs in
// 8-wide intrinsics; other dtypes and machines take the scalar loop.
// Decode-sum walks the output in cache-sized blocks: with one shared scale it adds the K
// payloads' codes as biased 16-bit lanes (4 per uint64, one table lookup per byte), then
// scales once; with differing scales it accumulates s_k * v_k in float (double for fp64).
#include "terngrad_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "../device/terngrad_functors.h"
#include "../payload_checks.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HGC_TG_AVX2 1
#endif

#define HGC_TG_CHECK_NOT_CUDA(x)                                                                  \
  TORCH_CHECK(!(x).is_cuda(), "horovod_gradcomp._C was built without CUDA kernels for terngrad; " \
              "got a CUDA tensor " #x " (use impl='reference' for CUDA tensors)")

namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

constexpr int64_t kGrain = 1 << 15;  // elements per task below which threads do not pay off
constexpr uint32_t kMul1 = 0x21f0aaadu, kMul2 = 0x735a2d97u;

// 32-bit integer hash (hash-prospector "lowbias32", constants below 2^31 so that the torch
// reference can multiply in int64 without overflow).
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= kMul1;
  x ^= x >> 15;
  x *= kMul2;
  x ^= x >> 15;
  return x;
}

inline uint32_t hash_index(uint32_t i, uint32_t k0, uint32_t k1) { return mix32(mix32(i + k0) ^ k1); }

template <typename acc_t>
inline acc_t uniform_of(uint32_t h) {
  return static_cast<acc_t>(static_cast<int32_t>(h >> 8)) * static_cast<acc_t>(0x1p-24);
}

template <typename scalar_t, typename acc_t>
inline uint32_t code_of(scalar_t gv, uint32_t idx, acc_t s, acc_t clip, uint32_t k0, uint32_t k1) {
  const acc_t g = static_cast<acc_t>(gv);
  acc_t a = std::abs(g);
  a = clip < a ? clip : a;  // a NaN stays NaN (never selected)
  const acc_t u = uniform_of<acc_t>(hash_index(idx, k0, k1));
  if (!(u * s < a)) return 0u;
  return g < acc_t(0) ? 2u : 1u;
}

// Elements [lo, hi), lo % 4 == 0, one at a time.
template <typename scalar_t, typename acc_t>
void encode_scalar(const scalar_t* g, int64_t lo, int64_t hi, acc_t s, acc_t clip, uint32_t k0, uint32_t k1,
                   uint8_t* codes) {
  for (int64_t b = lo / 4; b * 4 < hi; ++b) {
    uint32_t byte = 0;
    for (int t = 0; t < 4 && b * 4 + t < hi; ++t) {
      const int64_t i = b * 4 + t;
      byte |= code_of<scalar_t, acc_t>(g[i], static_cast<uint32_t>(i), s, clip, k0, k1) << (2 * t);
    }
    codes[b] = static_cast<uint8_t>(byte);
  }
}

#ifdef HGC_TG_AVX2
// Bit k of v -> bit 2k of the result.
inline uint64_t spread32(uint32_t v) {
  uint64_t x = v;
  x = (x | (x << 16)) & 0x0000FFFF0000FFFFull;
  x = (x | (x << 8)) & 0x00FF00FF00FF00FFull;
  x = (x | (x << 4)) & 0x0F0F0F0F0F0F0F0Full;
  x = (x | (x << 2)) & 0x3333333333333333ull;
  x = (x | (x << 1)) & 0x5555555555555555ull;
  return x;
}

// 8 bytes of codes of 32 values from their selection and sign masks.
inline void store_codes32(uint32_t sel, uint32_t neg, uint8_t* out) {
  const uint64_t w = spread32(sel & ~neg) | (spread32(sel & neg) << 1);
  for (int q = 0; q < 8; ++q) out[q] = static_cast<uint8_t>(w >> (8 * q));
}

__attribute__((target("avx2"))) inline __m256i mix32_avx2(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(kMul1)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(kMul2)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  return x;
}

// `groups` groups of 32 floats g[0, 32*groups), g[0] having index idx0 -> 8 code bytes each.
// Same arithmetic as code_of<float, float> (a selected value is non-zero and not NaN, so its
// sign bit is g < 0).
__attribute__((target("avx2"))) void encode_f32_avx2(const float* g, int64_t groups, uint32_t idx0, float s,
                                                     float clip, uint32_t k0, uint32_t k1, uint8_t* out) {
  const __m256 vs = _mm256_set1_ps(s), vclip = _mm256_set1_ps(clip), vunit = _mm256_set1_ps(0x1p-24f);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i vk0 = _mm256_set1_epi32(static_cast<int>(k0)), vk1 = _mm256_set1_epi32(static_cast<int>(k1));
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(idx0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int64_t q = 0; q < groups; ++q, g += 32) {
    uint32_t sel = 0, neg = 0;
    for (int v = 0; v < 4; ++v) {
      const __m256 gv = _mm256_loadu_ps(g + 8 * v);
      const __m256 a = _mm256_min_ps(vclip, _mm256_and_ps(gv, absmask));  // clip < a ? clip : a
      __m256i h = mix32_avx2(_mm256_add_epi32(idx, vk0));
      h = mix32_avx2(_mm256_xor_si256(h, vk1));
      const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), vunit);
      const __m256 m = _mm256_cmp_ps(_mm256_mul_ps(u, vs), a, _CMP_LT_OQ);
      sel |= static_cast<uint32_t>(_mm256_movemask_ps(m)) << (8 * v);
      neg |= static_cast<uint32_t>(_mm256_movemask_ps(gv)) << (8 * v);
      idx = _mm256_add_epi32(idx, eight);
    }
    store_codes32(sel, neg, out + 8 * q);
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

template <typename scalar_t>
void encode_impl(const scalar_t* g, int64_t n, double scale, double clip, uint32_t k0, uint32_t k1,
                 uint8_t* codes) {
  using acc_t = typename Acc<scalar_t>::type;
  const acc_t s = static_cast<acc_t>(scale), c = static_cast<acc_t>(clip);
  const int64_t groups = n / 32;  // full groups of 32 values (8 code bytes)
  at::parallel_for(0, groups, kGrain / 32, [&](int64_t q0, int64_t q1) {
#ifdef HGC_TG_AVX2
    if (has_avx2()) {
      if constexpr (std::is_same<scalar_t, float>::value) {
        encode_f32_avx2(g + q0 * 32, q1 - q0, static_cast<uint32_t>(q0 * 32), s, c, k0, k1, codes + q0 * 8);
        return;
      } else if constexpr (!std::is_same<scalar_t, double>::value) {
        constexpr int64_t kGroupsPerBlock = 32;
        float tmp[32 * kGroupsPerBlock];
        for (int64_t q = q0; q < q1; q += kGroupsPerBlock) {
          const int64_t cnt = std::min(kGroupsPerBlock, q1 - q);
          const scalar_t* src = g + q * 32;
          for (int64_t t = 0; t < cnt * 32; ++t) tmp[t] = static_cast<float>(src[t]);
          encode_f32_avx2(tmp, cnt, static_cast<uint32_t>(q * 32), s, c, k0, k1, codes + q * 8);
        }
        return;
      }
    }
#endif
    encode_scalar<scalar_t, acc_t>(g, q0 * 32, q1 * 32, s, c, k0, k1, codes);
  });
  encode_scalar<scalar_t, acc_t>(g, groups * 32, n, s, c, k0, k1, codes);
}

// max |g| over [lo, hi) and whether a NaN was seen.
template <typename scalar_t>
void max_abs_range(const scalar_t* g, int64_t lo, int64_t hi, double* out_max, bool* out_nan) {
  using acc_t = typename Acc<scalar_t>::type;
  int64_t i = lo;
  double best = 0.0;
  bool nan = false;
#if defined(__SSE2__)
  if constexpr (std::is_same<scalar_t, float>::value) {
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0, bad = m0;
    for (; i + 16 <= hi; i += 16) {
      const __m128 v0 = _mm_and_ps(_mm_loadu_ps(g + i), absmask), v1 = _mm_and_ps(_mm_loadu_ps(g + i + 4), absmask);
      const __m128 v2 = _mm_and_ps(_mm_loadu_ps(g + i + 8), absmask), v3 = _mm_and_ps(_mm_loadu_ps(g + i + 12), absmask);
      m0 = _mm_max_ps(m0, v0); m1 = _mm_max_ps(m1, v1); m2 = _mm_max_ps(m2, v2); m3 = _mm_max_ps(m3, v3);
      bad = _mm_or_ps(bad, _mm_or_ps(_mm_or_ps(_mm_cmpunord_ps(v0, v0), _mm_cmpunord_ps(v1, v1)),
                                     _mm_or_ps(_mm_cmpunord_ps(v2, v2), _mm_cmpunord_ps(v3, v3))));
    }
    float mm[4];
    _mm_storeu_ps(mm, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    for (float x : mm) best = std::max<double>(best, x);
    nan = _mm_movemask_ps(bad) != 0;
  }
#endif
  constexpr int kLanes = 8;
  acc_t m[kLanes] = {};
  bool bad[kLanes] = {};
  for (; i + kLanes <= hi; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const acc_t a = std::abs(static_cast<acc_t>(g[i + l]));
      m[l] = a > m[l] ? a : m[l];
      bad[l] |= a != a;
    }
  }
  for (; i < hi; ++i) {
    const acc_t a = std::abs(static_cast<acc_t>(g[i]));
    m[0] = a > m[0] ? a : m[0];
    bad[0] |= a != a;
  }
  for (int l = 0; l < kLanes; ++l) {
    best = std::max<double>(best, m[l]);
    nan |= bad[l];
  }
  *out_max = best;
  *out_nan = nan;
}

struct Luts {
  uint64_t biased[256];  // four uint16 lanes (memory order = element order): v_t + 1
  float val[256][4];     // v_t
  Luts() {
    for (int b = 0; b < 256; ++b) {
      uint16_t lanes[4];
      for (int t = 0; t < 4; ++t) {
        const int c = (b >> (2 * t)) & 3;
        const int v = (c & 1) - (c >> 1);  // 0 -> 0, 1 -> +1, 2 -> -1, 3 -> 0
        lanes[t] = static_cast<uint16_t>(v + 1);
        val[b][t] = static_cast<float>(v);
      }
      std::memcpy(&biased[b], lanes, sizeof(lanes));
    }
  }
};

const Luts& luts() {
  static const Luts table;
  return table;
}

constexpr int64_t kMaxIntK = 32767;  // biased 16-bit lanes hold sums up to 2K <= 65535

// acc[t] = sum_k v_k + K for the 4 * nb elements from `start` (a multiple of 4): the K rows'
// code bytes added as four biased uint16 lanes at once.
inline void biased_sums(const uint8_t* codes, int64_t cstride, int64_t K, int64_t start, int64_t nb, uint16_t* acc) {
  const Luts& L = luts();
  std::memset(acc, 0, nb * sizeof(uint64_t));
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t* c = codes + k * cstride + start / 4;
    for (int64_t j = 0; j < nb; ++j) {
      uint64_t x;
      std::memcpy(&x, acc + 4 * j, sizeof(x));
      x += L.biased[c[j]];
      std::memcpy(acc + 4 * j, &x, sizeof(x));
    }
  }
}

// Elements [lo, hi), lo % 4 == 0.
template <typename scalar_t>
void decode_sum_range(const uint8_t* codes, int64_t cstride, const float* scales, int64_t sstride, int64_t K,
                      bool shared, double scale, scalar_t* out, int64_t lo, int64_t hi) {
  using acc_t = typename Acc<scalar_t>::type;
  constexpr int64_t kBlock = 4096;  // a multiple of 4: blocks start on byte boundaries
  const Luts& L = luts();
  if (shared) {
    alignas(64) uint16_t acc[kBlock];
    const acc_t mult = static_cast<acc_t>(static_cast<double>(scales[0]) * scale);
    const int32_t bias = static_cast<int32_t>(K);
    for (int64_t start = lo; start < hi; start += kBlock) {
      const int64_t len = std::min(kBlock, hi - start), nb = (len + 3) / 4;
      biased_sums(codes, cstride, K, start, nb, acc);
      for (int64_t t = 0; t < len; ++t)
        out[start + t] = static_cast<scalar_t>(static_cast<acc_t>(static_cast<int32_t>(acc[t]) - bias) * mult);
    }
    return;
  }
  alignas(64) acc_t acc[kBlock];
  const acc_t mult = static_cast<acc_t>(scale);
  for (int64_t start = lo; start < hi; start += kBlock) {
    const int64_t len = std::min(kBlock, hi - start), nb = (len + 3) / 4;
    std::fill(acc, acc + 4 * nb, acc_t(0));
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t* c = codes + k * cstride + start / 4;
      const acc_t w = static_cast<acc_t>(scales[k * sstride]);
      for (int64_t j = 0; j < nb; ++j) {
        const float* v = L.val[c[j]];
        for (int t = 0; t < 4; ++t) acc[4 * j + t] += w * static_cast<acc_t>(v[t]);
      }
    }
    for (int64_t t = 0; t < len; ++t) out[start + t] = static_cast<scalar_t>(acc[t] * mult);
  }
}

// The biased sums (sum_k v_k + K) of elements [lo, hi), lo % 4 == 0 (and even), as `width`-bit
// fields: 4 (two per byte, low nibble first), 8 or 16 bits (little-endian).
void sum_levels_range(const uint8_t* codes, int64_t cstride, int64_t K, int width, uint8_t* levels, int64_t lo,
                      int64_t hi) {
  constexpr int64_t kBlock = 4096;
  alignas(64) uint16_t acc[kBlock];
  for (int64_t start = lo; start < hi; start += kBlock) {
    const int64_t len = std::min(kBlock, hi - start), nb = (len + 3) / 4;
    biased_sums(codes, cstride, K, start, nb, acc);
    if (width == 4) {
      for (int64_t t = 0; t < len; t += 2) {
        const uint8_t hi4 = t + 1 < len ? static_cast<uint8_t>(acc[t + 1] << 4) : 0;
        levels[(start + t) / 2] = static_cast<uint8_t>(acc[t]) | hi4;
      }
    } else if (width == 8) {
      for (int64_t t = 0; t < len; ++t) levels[start + t] = static_cast<uint8_t>(acc[t]);
    } else {
      std::memcpy(levels + 2 * start, acc, 2 * len);  // little-endian hosts (as the whole wire format)
    }
  }
}

// Fields of 4 or 8 bits take their value from a table of the 16 or 256 possible ones (each
// computed as below, so the bits are the same); 16-bit fields are computed one by one.
template <typename scalar_t>
void sum_decode_range(const uint8_t* levels, int64_t K, int width, double mult_d, scalar_t* out, int64_t lo,
                      int64_t hi) {
  using acc_t = typename Acc<scalar_t>::type;
  const acc_t mult = static_cast<acc_t>(mult_d);
  const int32_t bias = static_cast<int32_t>(K);
  auto value = [&](int32_t f) { return static_cast<scalar_t>(static_cast<acc_t>(f - bias) * mult); };
  if (width == 16) {
    for (int64_t i = lo; i < hi; ++i) {
      uint16_t u;
      std::memcpy(&u, levels + 2 * i, 2);
      out[i] = value(u);
    }
    return;
  }
  scalar_t table[256];
  for (int f = 0; f < (width == 4 ? 16 : 256); ++f) table[f] = value(f);
  if (width == 8) {
    for (int64_t i = lo; i < hi; ++i) out[i] = table[levels[i]];
    return;
  }
  int64_t i = lo;
  if ((i & 1) && i < hi) {  // a range may start in the high nibble
    out[i] = table[levels[i / 2] >> 4];
    ++i;
  }
  for (; i + 1 < hi; i += 2) {
    const uint8_t b = levels[i / 2];
    out[i] = table[b & 15];
    out[i + 1] = table[b >> 4];
  }
  if (i < hi) out[i] = table[levels[i / 2] & 15];
}

}  // namespace

at::Tensor terngrad_sum_levels_cpu(const at::Tensor& codes, int64_t n, int64_t width) {
  HGC_TG_CHECK_NOT_CUDA(codes);
  const int64_t K = hgc::check_terngrad_sum_levels_args(codes, n, width);
  auto levels = at::empty({(n * width + 7) / 8}, codes.options());
  if (n == 0) return levels;
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  uint8_t* lp = levels.data_ptr<uint8_t>();
  at::parallel_for(0, (n + 3) / 4, kGrain / 4, [&](int64_t b0, int64_t b1) {
    sum_levels_range(cp, codes.stride(0), K, static_cast<int>(width), lp, b0 * 4, std::min(n, b1 * 4));
  });
  return levels;
}

at::Tensor terngrad_sum_decode_cpu(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                                   at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  HGC_TG_CHECK_NOT_CUDA(levels);
  hgc::check_terngrad_sum_decode_args(levels, n, k, width);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, levels.device(), "terngrad_sum_decode");
  if (n == 0) return out;
  const uint8_t* lp = levels.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "terngrad_sum_decode_cpu", [&] {
    auto* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) {
      sum_decode_range<scalar_t>(lp, k, static_cast<int>(width), mult, o, i0, i1);
    });
  });
  return out;
}

namespace {

// The lanes of the fixed-order sum (terngrad_functors.h's LaneSum: lane p adds g[p], g[p + L],
// ... in order, from 0.0), walked row by row so that the CPU streams through g; threads split
// the lanes, never a lane. Then the block sums (BlockSum) down to one value.
template <typename scalar_t, bool kSquares>
double fixed_sum(const scalar_t* g, int64_t n, double mean, std::vector<double>& lanes, std::vector<double>& tmp) {
  using T = typename std::conditional<std::is_same<scalar_t, c10::Half>::value, hgc_dev::half_t,
            typename std::conditional<std::is_same<scalar_t, c10::BFloat16>::value, hgc_dev::bf16_t,
                                      scalar_t>::type>::type;
  static_assert(sizeof(T) == sizeof(scalar_t), "same storage");
  const T* x = reinterpret_cast<const T*>(g);
  const int64_t L = hgc_dev::terngrad::sum_lanes(n);
  lanes.assign(L, 0.0);
  double* acc = lanes.data();
  at::parallel_for(0, L, 2048, [&](int64_t p0, int64_t p1) {
    for (int64_t row = 0; row * L < n; ++row) {
      const T* r = x + row * L;
      const int64_t hi = std::min(p1, n - row * L);
      for (int64_t p = p0; p < hi; ++p) acc[p] = acc[p] + hgc_dev::terngrad::Summand<T, kSquares>::of(r[p], mean);
    }
  });
  int64_t m = L;
  while (m > 1) {
    const int64_t nb = (m + hgc_dev::terngrad::kSumBlock - 1) / hgc_dev::terngrad::kSumBlock;
    tmp.resize(nb);
    const hgc_dev::terngrad::BlockSum block{lanes.data(), m, tmp.data()};
    for (int64_t b = 0; b < nb; ++b) block(b);
    lanes.swap(tmp);
    m = nb;
  }
  return lanes[0];
}

}  // namespace

double terngrad_sigma_cpu(const at::Tensor& grad) {
  HGC_TG_CHECK_NOT_CUDA(grad);
  hgc::check_values_input(grad, at::kCPU, "grad");
  const int64_t n = grad.numel();
  if (n == 0) return 0.0;
  double var_sum = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "terngrad_sigma_cpu", [&] {
    const auto* g = grad.data_ptr<scalar_t>();
    std::vector<double> lanes, tmp;
    const double sum = fixed_sum<scalar_t, false>(g, n, 0.0, lanes, tmp);
    var_sum = fixed_sum<scalar_t, true>(g, n, sum / static_cast<double>(n), lanes, tmp);
  });
  return std::sqrt(var_sum / static_cast<double>(n));
}

double terngrad_max_abs_cpu(const at::Tensor& grad) {
  HGC_TG_CHECK_NOT_CUDA(grad);
  hgc::check_values_input(grad, at::kCPU, "grad");
  const int64_t n = grad.numel();
  if (n == 0) return 0.0;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / kGrain));
  std::vector<double> best(chunks, 0.0);
  std::vector<char> nan(chunks, 0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "terngrad_max_abs_cpu", [&] {
    const auto* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        bool bad = false;
        max_abs_range<scalar_t>(g, n * c / chunks, n * (c + 1) / chunks, &best[c], &bad);
        nan[c] = bad;
      }
    });
  });
  double m = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (nan[c]) return std::numeric_limits<double>::quiet_NaN();
    m = std::max(m, best[c]);
  }
  return m;
}

std::tuple<at::Tensor, at::Tensor> terngrad_encode_cpu(const at::Tensor& grad, double scale, double clip,
                                                       int64_t key0, int64_t key1) {
  HGC_TG_CHECK_NOT_CUDA(grad);
  hgc::check_values_input(grad, at::kCPU, "grad");
  const int64_t n = grad.numel();
  hgc::check_terngrad_encode_args(n, scale, clip, key0, key1);
  auto codes = at::empty({(n + 3) / 4}, grad.options().dtype(at::kByte));
  auto scales = at::full({1}, scale, grad.options().dtype(at::kFloat));
  if (n == 0) return {codes, scales};
  if (scale == 0.0) {
    codes.zero_();
    return {codes, scales};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "terngrad_encode_cpu", [&] {
    encode_impl<scalar_t>(grad.data_ptr<scalar_t>(), n, scale, clip, static_cast<uint32_t>(key0),
                          static_cast<uint32_t>(key1), codes.data_ptr<uint8_t>());
  });
  return {codes, scales};
}

at::Tensor terngrad_decode_sum_cpu(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                   at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  HGC_TG_CHECK_NOT_CUDA(codes);
  HGC_TG_CHECK_NOT_CUDA(scales);
  const int64_t K = hgc::check_terngrad_decode_args(codes, scales, n, dtype, at::kCPU);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, codes.device(), "terngrad_decode");
  if (n == 0) return out;
  const float* sp = scales.data_ptr<float>();
  const int64_t sstride = scales.stride(0);
  bool shared = K <= kMaxIntK;
  for (int64_t k = 1; k < K && shared; ++k) shared = sp[k * sstride] == sp[0];
  if (shared) shared = sp[0] == sp[0];  // a NaN scale takes the weighted path
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const int64_t cstride = codes.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "terngrad_decode_sum_cpu", [&] {
    auto* o = out.data_ptr<scalar_t>();
    const int64_t nbytes = (n + 3) / 4;
    at::parallel_for(0, nbytes, kGrain / 4, [&](int64_t b0, int64_t b1) {
      decode_sum_range<scalar_t>(cp, cstride, sp, sstride, K, shared, scale, o, b0 * 4, std::min(n, b1 * 4));
    });
  });
  return out;
}
