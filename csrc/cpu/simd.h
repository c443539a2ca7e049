// Small SIMD helpers for the CPU kernels: 8 values <-> 8 sign bits.
// x86-64 always has SSE2; other architectures take the scalar loops.
#pragma once
#include <algorithm>
#include <cstdint>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hgc {

// Byte whose bit k is set where v[k] >= 0 (NaN gives 0).
inline uint8_t sign_byte(const float* v) {
#if defined(__SSE2__)
  const __m128 z = _mm_setzero_ps();
  const int lo = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(v), z));
  const int hi = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(v + 4), z));
  return static_cast<uint8_t>(lo | (hi << 4));
#else
  uint8_t b = 0;
  for (int k = 0; k < 8; ++k) b |= static_cast<uint8_t>(v[k] >= 0.f) << k;
  return b;
#endif
}

inline uint8_t sign_byte(const double* v) {
#if defined(__SSE2__)
  const __m128d z = _mm_setzero_pd();
  int b = 0;
  for (int q = 0; q < 4; ++q) b |= _mm_movemask_pd(_mm_cmpge_pd(_mm_loadu_pd(v + 2 * q), z)) << (2 * q);
  return static_cast<uint8_t>(b);
#else
  uint8_t b = 0;
  for (int k = 0; k < 8; ++k) b |= static_cast<uint8_t>(v[k] >= 0.0) << k;
  return b;
#endif
}

// out[k] += bit k of `byte` ? pos[k] : neg[k], for k < 8.
inline void add_select8(uint8_t byte, const float* pos, const float* neg, float* out) {
#if defined(__SSE2__)
  const __m128i b = _mm_set1_epi32(byte);
  const __m128i sel_lo = _mm_setr_epi32(1, 2, 4, 8), sel_hi = _mm_setr_epi32(16, 32, 64, 128);
  const __m128 m_lo = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, sel_lo), sel_lo));
  const __m128 m_hi = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, sel_hi), sel_hi));
  const __m128 lo = _mm_or_ps(_mm_and_ps(m_lo, _mm_loadu_ps(pos)), _mm_andnot_ps(m_lo, _mm_loadu_ps(neg)));
  const __m128 hi = _mm_or_ps(_mm_and_ps(m_hi, _mm_loadu_ps(pos + 4)), _mm_andnot_ps(m_hi, _mm_loadu_ps(neg + 4)));
  _mm_storeu_ps(out, _mm_add_ps(_mm_loadu_ps(out), lo));
  _mm_storeu_ps(out + 4, _mm_add_ps(_mm_loadu_ps(out + 4), hi));
#else
  for (int k = 0; k < 8; ++k) out[k] += ((byte >> k) & 1) ? pos[k] : neg[k];
#endif
}

}  // namespace hgc

#if defined(__SSE2__)
namespace hgc {

// fp32 fast paths of the 1-bit encoder (the scalar templates in onebit_cpu.cpp serve the
// other dtypes and non-x86 builds). kRes: add the residual r to g first.

// Column sums of the nrows x 16 contiguous matrix v = g (+ r), each column in row order from 0,
// into p/m/cnt[16] (non-negative sum, negative sum, non-negative count): the lanes of a
// one-column tensor's block (onebit_functors.h), all twelve accumulators in registers.
template <bool kRes>
inline void sse_sums_16(const float* g, const float* r, int64_t nrows, float* p, float* m, float* cnt) {
  const __m128 z = _mm_setzero_ps(), one = _mm_set1_ps(1.f);
  __m128 sp[4] = {z, z, z, z}, sm[4] = {z, z, z, z}, sc[4] = {z, z, z, z};
  for (int64_t row = 0; row < nrows; ++row, g += 16) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      __m128 v = _mm_loadu_ps(g + 4 * q);
      if (kRes) v = _mm_add_ps(v, _mm_loadu_ps(r + 16 * row + 4 * q));
      const __m128 k = _mm_cmpge_ps(v, z);
      sp[q] = _mm_add_ps(sp[q], _mm_and_ps(k, v));
      sm[q] = _mm_add_ps(sm[q], _mm_andnot_ps(k, v));
      sc[q] = _mm_add_ps(sc[q], _mm_and_ps(k, one));
    }
  }
  for (int q = 0; q < 4; ++q) {
    _mm_storeu_ps(p + 4 * q, sp[q]);
    _mm_storeu_ps(m + 4 * q, sm[q]);
    _mm_storeu_ps(cnt + 4 * q, sc[q]);
  }
}

// Column-wise accumulation of one row of `cols` values into p/m/cnt[cols].
template <bool kRes>
inline void sse_sums_row(const float* g, const float* r, int64_t cols, float* p, float* m, float* cnt) {
  const __m128 z = _mm_setzero_ps(), one = _mm_set1_ps(1.f);
  int64_t j = 0;
  for (; j + 4 <= cols; j += 4) {
    __m128 v = _mm_loadu_ps(g + j);
    if (kRes) v = _mm_add_ps(v, _mm_loadu_ps(r + j));
    const __m128 k = _mm_cmpge_ps(v, z);
    _mm_storeu_ps(p + j, _mm_add_ps(_mm_loadu_ps(p + j), _mm_and_ps(k, v)));
    _mm_storeu_ps(m + j, _mm_add_ps(_mm_loadu_ps(m + j), _mm_andnot_ps(k, v)));
    _mm_storeu_ps(cnt + j, _mm_add_ps(_mm_loadu_ps(cnt + j), _mm_and_ps(k, one)));
  }
  for (; j < cols; ++j) {
    const float v = kRes ? g[j] + r[j] : g[j];
    if (v >= 0.f) { p[j] += v; cnt[j] += 1.f; } else { m[j] += v; }
  }
}

// Like sse_sums_row for `nrows` (<= 4) rows `stride` apart: the rows are summed in registers
// so the accumulators are loaded and stored once per 4 rows.
template <bool kRes>
inline void sse_sums_rows(const float* g, const float* r, int64_t stride, int nrows, int64_t cols, float* p,
                          float* m, float* cnt) {
  if (nrows < 4) {
    for (int q = 0; q < nrows; ++q) sse_sums_row<kRes>(g + q * stride, kRes ? r + q * stride : nullptr, cols, p, m, cnt);
    return;
  }
  const __m128 z = _mm_setzero_ps(), one = _mm_set1_ps(1.f);
  int64_t j = 0;
  for (; j + 4 <= cols; j += 4) {
    __m128 sp = _mm_loadu_ps(p + j), sm = _mm_loadu_ps(m + j), sc = _mm_loadu_ps(cnt + j);
    for (int q = 0; q < 4; ++q) {
      __m128 v = _mm_loadu_ps(g + q * stride + j);
      if (kRes) v = _mm_add_ps(v, _mm_loadu_ps(r + q * stride + j));
      const __m128 k = _mm_cmpge_ps(v, z);
      sp = _mm_add_ps(sp, _mm_and_ps(k, v));
      sm = _mm_add_ps(sm, _mm_andnot_ps(k, v));
      sc = _mm_add_ps(sc, _mm_and_ps(k, one));
    }
    _mm_storeu_ps(p + j, sp);
    _mm_storeu_ps(m + j, sm);
    _mm_storeu_ps(cnt + j, sc);
  }
  if (j < cols) {
    for (int q = 0; q < 4; ++q)
      sse_sums_row<kRes>(g + q * stride + j, kRes ? r + q * stride + j : nullptr, cols - j, p + j, m + j, cnt + j);
  }
}

// One byte of bits for the 8 values at g (+ r); with kRes, r <- v - (v >= 0 ? pos : neg).
template <bool kRes>
inline uint8_t sse_pack8(const float* g, float* r, const float* pos, const float* neg) {
  const __m128 z = _mm_setzero_ps();
  __m128 v0 = _mm_loadu_ps(g), v1 = _mm_loadu_ps(g + 4);
  if (kRes) { v0 = _mm_add_ps(v0, _mm_loadu_ps(r)); v1 = _mm_add_ps(v1, _mm_loadu_ps(r + 4)); }
  const __m128 k0 = _mm_cmpge_ps(v0, z), k1 = _mm_cmpge_ps(v1, z);
  if (kRes) {
    const __m128 q0 = _mm_or_ps(_mm_and_ps(k0, _mm_loadu_ps(pos)), _mm_andnot_ps(k0, _mm_loadu_ps(neg)));
    const __m128 q1 = _mm_or_ps(_mm_and_ps(k1, _mm_loadu_ps(pos + 4)), _mm_andnot_ps(k1, _mm_loadu_ps(neg + 4)));
    _mm_storeu_ps(r, _mm_sub_ps(v0, q0));
    _mm_storeu_ps(r + 4, _mm_sub_ps(v1, q1));
  }
  return static_cast<uint8_t>(_mm_movemask_ps(k0) | (_mm_movemask_ps(k1) << 4));
}

}  // namespace hgc
#endif
