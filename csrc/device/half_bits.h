// fp16 and bf16 as raw 16-bit words, with conversions to and from float that round to
// nearest even (as PyTorch's CPU conversions do, NaN included), written once in integer
// arithmetic so that the CUDA build and the OpenMP twin convert identically.
#pragma once

#include <cstdint>
#include <cstring>

#include "../host_device.h"

namespace hgc_dev {

struct half_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };

HGC_HOST_DEVICE inline uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
HGC_HOST_DEVICE inline float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// Round half to even at bit `shift` of q's discarded part `rem`.
HGC_HOST_DEVICE inline uint32_t round_even(uint32_t q, uint32_t rem, uint32_t halfway) {
  return (rem > halfway || (rem == halfway && (q & 1u))) ? q + 1u : q;
}

HGC_HOST_DEVICE inline uint16_t half_from_float(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return static_cast<uint16_t>(sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to 65520 or more: inf
  if (ax < 0x38800000u) {                                              // below 2^-14: subnormal or zero
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);          // below 2^-25: zero
    const uint32_t e = ax >> 23, mant = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24: units of 2^-24
    const uint32_t q = round_even(mant >> shift, mant & ((1u << shift) - 1u), 1u << (shift - 1u));
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry may reach inf.
  const uint32_t q = round_even((ax - 0x38000000u) >> 13, ax & 0x1FFFu, 0x1000u);
  return static_cast<uint16_t>(sign | q);
}

HGC_HOST_DEVICE inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m << 13));
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_float(sign);
  uint32_t exp = 113u;  // subnormal: normalize the mantissa
  while (!(m & 0x400u)) { m <<= 1; --exp; }
  return bits_float(sign | (exp << 23) | ((m & 0x3FFu) << 13));
}

HGC_HOST_DEVICE inline uint16_t bf16_from_float(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;  // NaN, as PyTorch stores it
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

HGC_HOST_DEVICE inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Element access in the arithmetic type of each dtype (float for fp16/bf16/fp32, double for
// fp64), the type every kernel computes in (as the CPU kernels do).
template <typename T> struct Elem;
template <> struct Elem<half_t> {
  using acc = float;
  static HGC_HOST_DEVICE float load(half_t x) { return half_to_float(x.bits); }
  static HGC_HOST_DEVICE half_t store(float x) { return half_t{half_from_float(x)}; }
};
template <> struct Elem<bf16_t> {
  using acc = float;
  static HGC_HOST_DEVICE float load(bf16_t x) { return bf16_to_float(x.bits); }
  static HGC_HOST_DEVICE bf16_t store(float x) { return bf16_t{bf16_from_float(x)}; }
};
template <> struct Elem<float> {
  using acc = float;
  static HGC_HOST_DEVICE float load(float x) { return x; }
  static HGC_HOST_DEVICE float store(float x) { return x; }
};
template <> struct Elem<double> {
  using acc = double;
  static HGC_HOST_DEVICE double load(double x) { return x; }
  static HGC_HOST_DEVICE double store(double x) { return x; }
};

}  // namespace hgc_dev
