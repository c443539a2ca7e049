// QSGD codec, CPU.
//
// Encode (fixed width): buckets of d values; each bucket's norm (l2 in a fixed 8-lane
// float64 summation order, or max|v|) is computed and the bucket quantized while it is
// still in L1. Work is split into chunks of whole buckets that also start on byte
// boundaries of the packed stream (multiples of lcm(d, 8) values), or, for buckets larger
// than kFuseMax values, norms come first and chunks of 8k values follow.
// Encode (Elias): buckets are grouped (group_buckets per group, each group byte-aligned in
// the stream); every group is coded into its own worst-case region in parallel, the bit
// lengths give the offsets, the regions are then copied together.
// Decode: fixed width in parallel chunks (SSE2 for 4- and 8-bit codes into float, else a
// per-bucket lookup table for w <= 8), Elias in parallel over groups. With K payloads the
// first assigns and the later ones add (a + v, a's NaN kept where both are NaN).
// Hash of pair j: splitmix64(key + (j + 1) * golden); the max norm, quantization and code
// packing of float input use SSE2 (the x86-64 baseline) with the same float operations.
// The random stream (counter-based splitmix64) and the float operations are exactly those
// of the pure-torch reference, so both produce identical integers and values.
#include "qsgd_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#define HGC_QSGD_SSE2 1
#else
#define HGC_QSGD_SSE2 0
#endif

#include "../checks.h"
#include "../elias_bit_reader.h"
#include "../payload_checks.h"
#include "../splitmix64.h"

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the bit streams are written as little-endian words");

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

using hgc::kGolden;
using hgc::mix64;
constexpr int64_t kBlock = 2048;          // values quantized / decoded at once
constexpr int64_t kFuseMax = 1 << 16;     // largest bucket whose norm is fused with its quantization
constexpr int64_t kGrainValues = 1 << 15; // values per task below which threads do not pay off

// The raw 32-bit random words of global indices i0 + k, k < len, written to dst[k] (4 bytes
// each): value 2j takes the low half of hash(pair j), value 2j+1 the high half.
inline void uniform_words(uint64_t key, int64_t i0, int64_t len, void* dst) {
  if (len <= 0) return;
  uint8_t* o = static_cast<uint8_t*>(dst);
  int64_t k = 0;
  uint64_t z = key + static_cast<uint64_t>((i0 >> 1) + 1) * kGolden;
  if (i0 & 1) {
    const uint32_t hi = static_cast<uint32_t>(mix64(z) >> 32);
    std::memcpy(o, &hi, 4);
    z += kGolden;
    k = 1;
  }
  for (; k + 1 < len; k += 2) {
    const uint64_t h = mix64(z);
    z += kGolden;
    std::memcpy(o + 4 * k, &h, 8);
  }
  if (k < len) {
    const uint32_t lo = static_cast<uint32_t>(mix64(z));
    std::memcpy(o + 4 * k, &lo, 4);
  }
}

// u[k] for global indices i0 + k: value 2j takes bits 8..31 of hash(pair j), value 2j+1
// bits 40..63, as a multiple of 2^-24 in [0, 1): the word w of uniform_words() becomes
// float(w >> 8) * 2^-24 (exact: w >> 8 < 2^24).
inline void uniforms(uint64_t key, int64_t i0, int64_t len, float* u) {
  if (len <= 0) return;
  uniform_words(key, i0, len, u);
  int64_t k = 0;
#if HGC_QSGD_SSE2
  const __m128 step = _mm_set1_ps(0x1p-24f);
  for (; k + 4 <= len; k += 4) {
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + k));
    _mm_storeu_ps(u + k, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(w, 8)), step));
  }
#endif
  for (; k < len; ++k) {
    uint32_t w;
    std::memcpy(&w, u + k, 4);
    u[k] = static_cast<float>(static_cast<int32_t>(w >> 8)) * 0x1p-24f;
  }
}

// Bucket norm, rounded to float32. l2: squares in float64, lane k%8 summed in order,
// lanes combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). max: max |v| (NaN sticks).
template <typename T>
float bucket_norm(const T* x, int64_t len, bool max_norm) {
  using acc_t = typename Acc<T>::type;
  if (max_norm) {
    // Running max without NaN (a NaN never replaces m) plus a NaN flag; all |v| >= +0, so
    // the max does not depend on the order. A bucket with a NaN takes the sticky scalar
    // loop, which returns its first NaN.
    acc_t m = 0;
    bool nan = false;
    int64_t k = 0;
#if HGC_QSGD_SSE2
    if constexpr (std::is_same<T, float>::value) {
      const __m128 absm = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
      __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0, un = m0;
      for (; k + 16 <= len; k += 16) {
        const __m128 a0 = _mm_and_ps(_mm_loadu_ps(x + k), absm);
        const __m128 a1 = _mm_and_ps(_mm_loadu_ps(x + k + 4), absm);
        const __m128 a2 = _mm_and_ps(_mm_loadu_ps(x + k + 8), absm);
        const __m128 a3 = _mm_and_ps(_mm_loadu_ps(x + k + 12), absm);
        m0 = _mm_max_ps(a0, m0);  // a0 > m0 ? a0 : m0
        m1 = _mm_max_ps(a1, m1);
        m2 = _mm_max_ps(a2, m2);
        m3 = _mm_max_ps(a3, m3);
        un = _mm_or_ps(un, _mm_or_ps(_mm_cmpunord_ps(a0, a1), _mm_cmpunord_ps(a2, a3)));
      }
      m0 = _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3));
      alignas(16) float lanes[4];
      _mm_store_ps(lanes, m0);
      for (int t = 0; t < 4; ++t) m = lanes[t] > m ? lanes[t] : m;
      nan = _mm_movemask_ps(un) != 0;
    }
#endif
    for (; k < len; ++k) {
      const acc_t a = std::abs(static_cast<acc_t>(x[k]));
      m = a > m ? a : m;
      nan |= a != a;
    }
    if (nan) {
      m = 0;
      for (k = 0; k < len; ++k) {
        const acc_t a = std::abs(static_cast<acc_t>(x[k]));
        m = (a > m || a != a) ? a : m;
        if (m != m) break;
      }
    }
    return static_cast<float>(m);
  }
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    for (int j = 0; j < 8; ++j) {
      const double a = static_cast<double>(static_cast<acc_t>(x[k + j]));
      l[j] += a * a;
    }
  }
  for (int j = 0; k + j < len; ++j) {
    const double a = static_cast<double>(static_cast<acc_t>(x[k + j]));
    l[j] += a * a;
  }
  const double total = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  return static_cast<float>(std::sqrt(total));
}

// Signed levels q[k] in [-s, s] of x[0..len) (global index i0 of x[0]) with bucket norm nrm.
template <typename T>
void quantize(const T* x, int64_t len, int64_t i0, float nrm, int64_t s, uint64_t key, float* u, int32_t* q) {
  using acc_t = typename Acc<T>::type;
  uniforms(key, i0, len, u);
  const acc_t S = static_cast<acc_t>(s);
  const acc_t inv = S / static_cast<acc_t>(nrm);
  const acc_t top = static_cast<acc_t>(s - 1);
  for (int64_t k = 0; k < len; ++k) {
    const acc_t v = static_cast<acc_t>(x[k]);
    acc_t r = std::abs(v) * inv;
    r = r >= acc_t(0) ? r : acc_t(0);  // NaN (0 * inf, NaN input) -> 0
    r = r <= S ? r : S;
    acc_t fl = static_cast<acc_t>(static_cast<int32_t>(r));
    fl = fl <= top ? fl : top;
    const acc_t p = r - fl;
    const int32_t lvl = static_cast<int32_t>(fl) + (static_cast<acc_t>(u[k]) < p ? 1 : 0);
    q[k] = v < acc_t(0) ? -lvl : lvl;
  }
}

// Codes c[k] = (q < 0) | |q| << 1 of the levels quantize() gives for x[0..len) (global
// index i0 of x[0]), same float operations; SSE2 for float input.
template <typename T>
void quantize_codes(const T* x, int64_t len, int64_t i0, float nrm, int64_t s, uint64_t key, float* u, int32_t* c) {
  int64_t k = 0;
#if HGC_QSGD_SSE2
  if constexpr (std::is_same<T, float>::value) {
    uniform_words(key, i0, len, u);
    const float S = static_cast<float>(s);
    const float inv = S / nrm;
    const float top = static_cast<float>(s - 1);
    const __m128 vinv = _mm_set1_ps(inv), vS = _mm_set1_ps(S), vtop = _mm_set1_ps(top), zero = _mm_setzero_ps();
    const __m128 two24 = _mm_set1_ps(0x1p24f);
    const __m128 absm = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
    const __m128i zi = _mm_setzero_si128();
    for (; k + 4 <= len; k += 4) {
      const __m128 v = _mm_loadu_ps(x + k);
      // nrm is a bucket norm (+0 <= nrm or NaN), so r is +0 or more, or NaN: r > 0 ? r : 0
      // equals the scalar r >= 0 ? r : 0 (NaN -> +0).
      __m128 r = _mm_max_ps(_mm_mul_ps(_mm_and_ps(v, absm), vinv), zero);
      r = _mm_min_ps(r, vS);  // r < S ? r : S
      const __m128 fl = _mm_min_ps(_mm_cvtepi32_ps(_mm_cvttps_epi32(r)), vtop);
      const __m128 p = _mm_sub_ps(r, fl);
      // u < p  <=>  (w >> 8) < p * 2^24, both sides scaled exactly by 2^24
      const __m128 w24 = _mm_cvtepi32_ps(_mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u + k)), 8));
      const __m128i lvl = _mm_sub_epi32(_mm_cvttps_epi32(fl), _mm_castps_si128(_mm_cmplt_ps(w24, _mm_mul_ps(p, two24))));
      // sign where v < 0 and lvl > 0; v's sign bit is also set for -0 and some NaNs, whose level is 0
      const __m128i code = _mm_and_si128(_mm_or_si128(_mm_slli_epi32(lvl, 1), _mm_srli_epi32(_mm_castps_si128(v), 31)),
                                         _mm_cmpgt_epi32(lvl, zi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(c + k), code);
    }
    if (k == len) return;
    // the tail below draws its own uniforms again from index i0 + k
  }
#endif
  quantize(x + k, len - k, i0 + k, nrm, s, key, u + k, c + k);
  for (int64_t t = k; t < len; ++t) {
    const int32_t v = c[t];
    c[t] = static_cast<int32_t>((v < 0 ? 1u : 0u) | (static_cast<uint32_t>(v < 0 ? -v : v) << 1));
  }
}

// LSB-first bit writer; put() takes up to 32 bits.
struct BitWriter {
  uint8_t* base;
  uint8_t* p;
  uint64_t acc = 0;
  int n = 0;
  explicit BitWriter(uint8_t* dst) : base(dst), p(dst) {}
  inline void put(uint64_t v, int len) {
    acc |= v << n;
    n += len;
    if (n >= 32) {
      const uint32_t lo = static_cast<uint32_t>(acc);
      std::memcpy(p, &lo, 4);
      p += 4;
      acc >>= 32;
      n -= 32;
    }
  }
  inline void put_gamma(uint64_t x) {  // x >= 1, x < 2^32
    const int N = 63 - __builtin_clzll(x);
    put(uint64_t(1) << N, N + 1);
    if (N) put(x ^ (uint64_t(1) << N), N);
  }
  int64_t bits() const { return static_cast<int64_t>(p - base) * 8 + n; }
  // Writes out the pending whole bytes; afterwards n < 8 (n == 0 where n was a multiple of 8).
  inline void spill() {
    while (n >= 8) {
      *p++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      n -= 8;
    }
  }
  void flush() {
    while (n > 0) {
      *p++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      n -= 8;
    }
    n = 0;
  }
};

int64_t num_buckets(int64_t n, int64_t d) { return (n + d - 1) / d; }

template <typename T>
void encode_fixed_impl(const T* x, int64_t n, int64_t d, int64_t s, bool max_norm, uint64_t key, float* norms,
                       uint8_t* packed) {
  const int w = hgc::qsgd_code_width(s);
  const bool fused = d <= kFuseMax;
  if (!fused) {
    at::parallel_for(0, num_buckets(n, d), 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) norms[b] = bucket_norm(x + b * d, std::min(d, n - b * d), max_norm);
    });
  }
  const int64_t unit = fused ? d / std::gcd(d, int64_t(8)) * 8 : 8 * kBlock;
  const int64_t units = (n + unit - 1) / unit;
  at::parallel_for(0, units, std::max<int64_t>(1, kGrainValues / unit), [&](int64_t u0, int64_t u1) {
    std::vector<float> u(kBlock);
    std::vector<int32_t> q(kBlock);
    const int64_t i0 = u0 * unit, i1 = std::min(n, u1 * unit);
    BitWriter bw(packed + i0 * w / 8);
    for (int64_t i = i0; i < i1;) {
      const int64_t b = i / d, bend = std::min((b + 1) * d, n);
      if (fused) norms[b] = bucket_norm(x + i, bend - i, max_norm);  // i is the bucket's start
      const int64_t end = std::min(bend, i1);
      for (int64_t j = i; j < end; j += kBlock) {
        const int64_t len = std::min(kBlock, end - j);
        quantize_codes(x + j, len, j, norms[b], s, key, u.data(), q.data());
        const int32_t* c = q.data();
        int64_t k = 0;
        if ((w == 4 || w == 8) && (bw.n & 7) == 0) {
          bw.spill();  // byte-aligned from here: write whole bytes
          uint8_t* dst = bw.p;
          if (w == 4) {
#if HGC_QSGD_SSE2
            const __m128i lowbyte = _mm_set1_epi16(0x00FF);
            for (; k + 32 <= len; k += 32) {
              const __m128i* cv = reinterpret_cast<const __m128i*>(c + k);
              __m128i a = _mm_packus_epi16(_mm_packs_epi32(_mm_loadu_si128(cv), _mm_loadu_si128(cv + 1)),
                                           _mm_packs_epi32(_mm_loadu_si128(cv + 2), _mm_loadu_si128(cv + 3)));
              __m128i b2 = _mm_packus_epi16(_mm_packs_epi32(_mm_loadu_si128(cv + 4), _mm_loadu_si128(cv + 5)),
                                            _mm_packs_epi32(_mm_loadu_si128(cv + 6), _mm_loadu_si128(cv + 7)));
              a = _mm_and_si128(_mm_or_si128(a, _mm_srli_epi16(a, 4)), lowbyte);
              b2 = _mm_and_si128(_mm_or_si128(b2, _mm_srli_epi16(b2, 4)), lowbyte);
              _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(a, b2));
              dst += 16;
            }
#endif
            for (; k + 2 <= len; k += 2) *dst++ = static_cast<uint8_t>(c[k] | (c[k + 1] << 4));
          } else {
#if HGC_QSGD_SSE2
            for (; k + 16 <= len; k += 16) {
              const __m128i* cv = reinterpret_cast<const __m128i*>(c + k);
              _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                               _mm_packus_epi16(_mm_packs_epi32(_mm_loadu_si128(cv), _mm_loadu_si128(cv + 1)),
                                                _mm_packs_epi32(_mm_loadu_si128(cv + 2), _mm_loadu_si128(cv + 3))));
              dst += 16;
            }
#endif
            for (; k < len; ++k) *dst++ = static_cast<uint8_t>(c[k]);
          }
          bw.p = dst;
        } else if (w == 4) {
          for (; k + 8 <= len; k += 8) {
            uint32_t word = 0;
            for (int t = 0; t < 8; ++t) word |= static_cast<uint32_t>(c[k + t]) << (4 * t);
            bw.put(word, 32);
          }
        }
        for (; k < len; ++k) bw.put(static_cast<uint32_t>(c[k]), w);
      }
      i = end;
    }
    bw.flush();
  });
}

#if HGC_QSGD_SSE2
// a[0..4) = (or +=) value of the four codes in c: float(c >> 1) * bscale, negated where c & 1.
template <bool First>
inline void emit4(float* a, __m128i c, __m128 bs) {
  const __m128 v = _mm_xor_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(c, 1)), bs),
                              _mm_castsi128_ps(_mm_slli_epi32(c, 31)));
  if (First) {
    _mm_storeu_ps(a, v);
  } else {
    // a + v with a as the first operand, as the scalar a[j] += v compiles (addss a, v): where
    // both are NaN the result is a's NaN. Written in asm so the compiler cannot swap them.
    __m128 s = _mm_loadu_ps(a);
    __asm__("addps %1, %0" : "+x"(s) : "x"(v));
    _mm_storeu_ps(a, s);
  }
}

// 16 codes, one a byte, to a[0..16).
template <bool First>
inline void emit16(float* a, __m128i e, __m128 bs) {
  const __m128i z = _mm_setzero_si128();
  const __m128i w0 = _mm_unpacklo_epi8(e, z), w1 = _mm_unpackhi_epi8(e, z);
  emit4<First>(a, _mm_unpacklo_epi16(w0, z), bs);
  emit4<First>(a + 4, _mm_unpackhi_epi16(w0, z), bs);
  emit4<First>(a + 8, _mm_unpacklo_epi16(w1, z), bs);
  emit4<First>(a + 12, _mm_unpackhi_epi16(w1, z), bs);
}
#endif

// a + v with a as the first operand (addss / addsd a, v): where both are NaN the result is
// a's NaN, whatever the compiler would choose for a commutative +.
template <typename T>
inline T add_first(T a, T v) {
#if HGC_QSGD_SSE2
  if constexpr (std::is_same<T, float>::value)
    __asm__("addss %1, %0" : "+x"(a) : "x"(v));
  else
    __asm__("addsd %1, %0" : "+x"(a) : "x"(v));
  return a;
#else
  return a + v;
#endif
}

// Decodes values i .. i + len of one payload (codes of w bits in pk) into a (First: a = v,
// else a += v), value(c) = float(c >> 1) * bscale, negated where c & 1.
template <bool First, typename acc_t>
void decode_run(const uint8_t* pk, int64_t nbytes, int w, int64_t i, int64_t len, acc_t bscale, acc_t* lut, acc_t* a) {
  const uint64_t mask = (uint64_t(1) << w) - 1;
  auto value = [&](uint64_t c) -> acc_t {
    const acc_t v = static_cast<acc_t>(c >> 1) * bscale;
    return (c & 1) ? -v : v;
  };
  auto emit = [&](int64_t j, acc_t v) {
    if (First) a[j] = v; else a[j] = add_first(a[j], v);
  };
  int64_t j = 0;
#if HGC_QSGD_SSE2
  if constexpr (std::is_same<acc_t, float>::value) {
    if (w == 4 || w == 8) {
      const __m128 bs = _mm_set1_ps(bscale);
      if (w == 4) {
        if ((i & 1) && len > 0) { emit(0, value(pk[i >> 1] >> 4)); j = 1; }
        const __m128i lo4 = _mm_set1_epi8(0x0F);
        for (; j + 32 <= len; j += 32) {
          const __m128i by = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pk + ((i + j) >> 1)));
          const __m128i lo = _mm_and_si128(by, lo4), hi = _mm_and_si128(_mm_srli_epi16(by, 4), lo4);
          emit16<First>(a + j, _mm_unpacklo_epi8(lo, hi), bs);
          emit16<First>(a + j + 16, _mm_unpackhi_epi8(lo, hi), bs);
        }
        for (; j + 2 <= len; j += 2) {
          const uint8_t byte = pk[(i + j) >> 1];
          emit(j, value(byte & 15));
          emit(j + 1, value(byte >> 4));
        }
        if (j < len) emit(j, value(pk[(i + j) >> 1] & 15));
      } else {
        for (; j + 16 <= len; j += 16)
          emit16<First>(a + j, _mm_loadu_si128(reinterpret_cast<const __m128i*>(pk + i + j)), bs);
        for (; j < len; ++j) emit(j, value(pk[i + j]));
      }
      return;
    }
  }
#endif
  if (w <= 8) {
    for (uint64_t c = 0; c <= mask; ++c) lut[c] = value(c);
    if (w == 4) {
      if ((i & 1) && len > 0) { emit(0, lut[pk[i >> 1] >> 4]); j = 1; }
      for (; j + 2 <= len; j += 2) {
        const uint8_t byte = pk[(i + j) >> 1];
        emit(j, lut[byte & 15]);
        emit(j + 1, lut[byte >> 4]);
      }
      if (j < len) emit(j, lut[pk[(i + j) >> 1] & 15]);
    } else if (w == 8) {
      for (; j < len; ++j) emit(j, lut[pk[i + j]]);
    } else {
      for (; j < len; ++j) {
        const int64_t bit = (i + j) * w;
        const int64_t byte = bit >> 3;
        uint32_t word = pk[byte];
        if (byte + 1 < nbytes) word |= static_cast<uint32_t>(pk[byte + 1]) << 8;
        emit(j, lut[(word >> (bit & 7)) & mask]);
      }
    }
  } else {
    for (; j < len; ++j) {
      const int64_t bit = (i + j) * w;
      const int64_t byte = bit >> 3;
      uint64_t word = 0;
      if (byte + 8 <= nbytes) {
        std::memcpy(&word, pk + byte, 8);
      } else {
        for (int64_t t = byte; t < nbytes; ++t) word |= static_cast<uint64_t>(pk[t]) << (8 * (t - byte));
      }
      emit(j, value((word >> (bit & 7)) & mask));
    }
  }
}

template <typename T>
void decode_fixed_impl(const float* norms, int64_t norm_stride, const uint8_t* packed, int64_t packed_stride,
                       int64_t nbytes, int64_t K, int64_t n, int64_t d, int64_t s, double scale, T* out) {
  using acc_t = typename Acc<T>::type;
  const int w = hgc::qsgd_code_width(s);
  const bool plain = K == 1 && scale == 1.0;
  const acc_t sc = static_cast<acc_t>(scale);
  const int64_t units = (n + kBlock - 1) / kBlock;
  at::parallel_for(0, units, std::max<int64_t>(1, kGrainValues / kBlock), [&](int64_t u0, int64_t u1) {
    constexpr bool direct = std::is_same<T, acc_t>::value;  // accumulate in the output itself
    std::vector<acc_t> acc(direct ? 0 : kBlock);
    std::vector<acc_t> lut(w <= 8 ? (size_t(1) << w) : 0);
    for (int64_t i = u0 * kBlock, i1 = std::min(n, u1 * kBlock); i < i1;) {
      const int64_t b = i / d;
      const int64_t len = std::min({kBlock, (b + 1) * d - i, i1 - i});
      acc_t* a = direct ? reinterpret_cast<acc_t*>(out + i) : acc.data();
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t* pk = packed + k * packed_stride;
        const acc_t bscale = static_cast<acc_t>(norms[k * norm_stride + b]) / static_cast<acc_t>(s);
        if (k == 0) decode_run<true>(pk, nbytes, w, i, len, bscale, lut.data(), a);
        else decode_run<false>(pk, nbytes, w, i, len, bscale, lut.data(), a);
      }
      T* o = out + i;
      if (direct) {
        if (!plain) for (int64_t j = 0; j < len; ++j) a[j] = a[j] * sc;
      } else if (plain) {
        for (int64_t j = 0; j < len; ++j) o[j] = static_cast<T>(a[j]);
      } else {
        for (int64_t j = 0; j < len; ++j) o[j] = static_cast<T>(a[j] * sc);
      }
      i += len;
    }
  });
}

// Upper bound of one bucket's Elias code in bits: header gamma(nnz+1), gaps (<= 1.51 len
// in total, by concavity), sign + gamma(level) per value.
int64_t elias_bucket_bound(int64_t len, int64_t s) {
  const int64_t lg_s = 63 - __builtin_clzll(static_cast<uint64_t>(s));
  const int64_t lg_len = 63 - __builtin_clzll(static_cast<uint64_t>(len + 1));
  return 2 * len + len * (2 * lg_s + 2) + 2 * lg_len + 1;
}

template <typename T>
void encode_elias_impl(const T* x, int64_t n, int64_t d, int64_t s, bool max_norm, uint64_t key, int64_t gb,
                       int64_t G, float* norms, int64_t* nbits, const std::vector<int64_t>& region, uint8_t* tmp) {
  const int64_t B = num_buckets(n, d);
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> u(kBlock);
    std::vector<int32_t> q(static_cast<size_t>(std::min(d, n)));
    for (int64_t g = g0; g < g1; ++g) {
      BitWriter bw(tmp + region[g]);
      for (int64_t b = g * gb, be = std::min(B, (g + 1) * gb); b < be; ++b) {
        const int64_t i0 = b * d, len = std::min(d, n - i0);
        const float nrm = bucket_norm(x + i0, len, max_norm);
        norms[b] = nrm;
        int64_t nnz = 0;
        for (int64_t j = 0; j < len; j += kBlock) {
          const int64_t l = std::min(kBlock, len - j);
          quantize(x + i0 + j, l, i0 + j, nrm, s, key, u.data(), q.data() + j);
          for (int64_t t = 0; t < l; ++t) nnz += q[j + t] != 0;
        }
        bw.put_gamma(static_cast<uint64_t>(nnz) + 1);
        int64_t prev = -1;
        for (int64_t j = 0; j < len; ++j) {
          const int32_t v = q[j];
          if (v == 0) continue;
          bw.put_gamma(static_cast<uint64_t>(j - prev));  // gap + 1
          bw.put(v < 0 ? 1 : 0, 1);
          bw.put_gamma(static_cast<uint64_t>(v < 0 ? -v : v));
          prev = j;
        }
      }
      nbits[g] = bw.bits();
      bw.flush();
    }
  });
}

template <typename T>
void decode_elias_impl(const float* norms, const int64_t* nbits, const uint8_t* stream, const std::vector<int64_t>& start,
                       int64_t n, int64_t d, int64_t s, int64_t gb, int64_t G, T* out, std::atomic<int>* bad) {
  using acc_t = typename Acc<T>::type;
  const int64_t B = num_buckets(n, d);
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      hgc::EliasBitReader br{stream + start[g], start[g + 1] - start[g]};
      const int64_t limit = nbits[g];
      for (int64_t b = g * gb, be = std::min(B, (g + 1) * gb); b < be; ++b) {
        const int64_t i0 = b * d, len = std::min(d, n - i0);
        const acc_t bscale = static_cast<acc_t>(norms[b]) / static_cast<acc_t>(s);
        const T zero = static_cast<T>(acc_t(0) * bscale);
        T* o = out + i0;
        for (int64_t j = 0; j < len; ++j) o[j] = zero;
        const uint64_t h = br.gamma();
        if (h == 0 || h - 1 > static_cast<uint64_t>(len) || br.pos > limit) { bad->store(1); return; }
        int64_t pos = -1;
        for (uint64_t t = 0; t + 1 < h; ++t) {
          const uint64_t gap = br.gamma();
          if (gap == 0 || br.pos >= limit) { bad->store(1); return; }
          pos += static_cast<int64_t>(gap);
          const uint32_t neg = br.bit();
          const uint64_t lvl = br.gamma();
          if (pos >= len || lvl == 0 || lvl > static_cast<uint64_t>(s) || br.pos > limit) { bad->store(1); return; }
          const acc_t v = static_cast<acc_t>(lvl) * bscale;
          o[pos] = static_cast<T>(neg ? -v : v);
        }
      }
      if (br.pos != limit) { bad->store(1); return; }
    }
  });
}

at::Tensor make_out(const c10::optional<at::Tensor>& out_opt, int64_t n, at::ScalarType dtype, const char* who) {
  return hgc_decode_output(out_opt, n, dtype, at::kCPU, who);
}

void check_input(const at::Tensor& x, const char* who) {
  TORCH_CHECK(!x.is_cuda(), who, ": the native QSGD kernels are CPU-only; use impl='reference' for CUDA tensors");
  hgc::check_values_input(x, at::kCPU, "x");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_cpu(const at::Tensor& x, int64_t s, int64_t bucket,
                                                         bool max_norm, int64_t key) {
  check_input(x, "qsgd_encode_fixed");
  const int64_t n = x.numel();
  hgc::check_qsgd_params(s, bucket, n);
  const int w = hgc::qsgd_code_width(s);
  auto norms = at::empty({num_buckets(n, bucket)}, x.options().dtype(at::kFloat));
  auto packed = at::empty({(n * w + 7) / 8}, x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "qsgd_encode_fixed_cpu", [&] {
    encode_fixed_impl<scalar_t>(x.data_ptr<scalar_t>(), n, bucket, s, max_norm, static_cast<uint64_t>(key),
                                norms.data_ptr<float>(), packed.data_ptr<uint8_t>());
  });
  return {norms, packed};
}

at::Tensor qsgd_decode_fixed_cpu(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                 int64_t bucket, at::ScalarType dtype, double scale,
                                 const c10::optional<at::Tensor>& out_opt) {
  TORCH_CHECK(!norms.is_cuda() && !packed.is_cuda(),
              "qsgd_decode: the native QSGD kernels are CPU-only; use impl='reference' for CUDA payloads");
  // One payload as flat buffers, or K stacked as [K, length].
  const hgc::QsgdFixedPayloads p = hgc::check_qsgd_fixed_decode_args(norms, packed, n, s, bucket, dtype, at::kCPU);
  at::Tensor out = make_out(out_opt, n, dtype, "qsgd_decode");
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "qsgd_decode_fixed_cpu", [&] {
    decode_fixed_impl<scalar_t>(p.norms.data_ptr<float>(), p.norms.stride(0), p.packed.data_ptr<uint8_t>(),
                                p.packed.stride(0), p.nbytes, p.K, n, bucket, s, scale, out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_cpu(const at::Tensor& x, int64_t s,
                                                                     int64_t bucket, bool max_norm, int64_t key,
                                                                     int64_t group_buckets) {
  check_input(x, "qsgd_encode_elias");
  const int64_t n = x.numel();
  hgc::check_qsgd_elias_encode_args(s, bucket, n, group_buckets);
  const int64_t B = num_buckets(n, bucket);
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  std::vector<int64_t> region(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    int64_t bits = 0;
    for (int64_t b = g * group_buckets, be = std::min(B, (g + 1) * group_buckets); b < be; ++b)
      bits += elias_bucket_bound(std::min(bucket, n - b * bucket), s);
    region[g + 1] = region[g] + (bits + 64 + 63) / 64 * 8;  // + a word of slack, 8-byte aligned
  }
  auto norms = at::empty({B}, x.options().dtype(at::kFloat));
  auto nbits = at::zeros({G}, x.options().dtype(at::kLong));
  auto tmp = at::empty({region[G]}, x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "qsgd_encode_elias_cpu", [&] {
    encode_elias_impl<scalar_t>(x.data_ptr<scalar_t>(), n, bucket, s, max_norm, static_cast<uint64_t>(key),
                                group_buckets, G, norms.data_ptr<float>(), nbits.data_ptr<int64_t>(), region,
                                tmp.data_ptr<uint8_t>());
  });
  const int64_t* nb = nbits.data_ptr<int64_t>();
  std::vector<int64_t> start(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) start[g + 1] = start[g] + (nb[g] + 7) / 8;
  auto stream = at::empty({start[G]}, x.options().dtype(at::kByte));
  uint8_t* dst = stream.data_ptr<uint8_t>();
  const uint8_t* src = tmp.data_ptr<uint8_t>();
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) std::memcpy(dst + start[g], src + region[g], start[g + 1] - start[g]);
  });
  return {norms, nbits, stream};
}

at::Tensor qsgd_decode_elias_cpu(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                 int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                 at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  TORCH_CHECK(!norms.is_cuda() && !nbits.is_cuda() && !stream.is_cuda(),
              "qsgd_decode: the native QSGD kernels are CPU-only; use impl='reference' for CUDA payloads");
  const int64_t G =
      hgc::check_qsgd_elias_decode_args(norms, nbits, stream, n, s, bucket, group_buckets, dtype, at::kCPU);
  auto nb_c = nbits.contiguous();
  auto norms_c = norms.contiguous();
  auto stream_c = stream.contiguous();
  const int64_t* nb = nb_c.data_ptr<int64_t>();
  const std::vector<int64_t> start = hgc::qsgd_elias_group_starts(nb, G, stream.numel());
  at::Tensor out = make_out(out_opt, n, dtype, "qsgd_decode");
  if (n == 0) return out;
  std::atomic<int> bad{0};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "qsgd_decode_elias_cpu", [&] {
    decode_elias_impl<scalar_t>(norms_c.data_ptr<float>(), nb, stream_c.data_ptr<uint8_t>(), start, n, bucket, s,
                                group_buckets, G, out.data_ptr<scalar_t>(), &bad);
  });
  TORCH_CHECK(!bad.load(), hgc::kQsgdEliasMalformed);
  return out;
}
