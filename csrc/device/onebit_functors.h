// The 1-bit codec's summation order and its device functors (HGC_HOST_DEVICE, plain C++: built
// by nvcc for CUDA, by g++ for the OpenMP twin; the order constants and finish_column are also
// what the CPU kernel, csrc/cpu/onebit_cpu.cpp, follows).
//
// The one summation order of the column statistics (sums of the non-negative and the negative
// values of v = g (+ r) and the non-negative count), whatever the backend and thread count:
//   * a matrix of `cols` >= 2 columns is cut into blocks of kRowBlock rows; column j of block b
//     is summed in row order in the arithmetic type (float; double for fp64), and the block
//     sums of column j are added in double in block order, starting from 0.0;
//   * a one-column tensor of n values is viewed as the [ceil(n / kLanes), kLanes] matrix of its
//     values in order (the last row partial): lane l's total is the column sum above, and the
//     kLanes totals are added in double in lane order;
//   * rows mode (a+ and a- per row of a contiguous rows x cols matrix): each row is summed as a
//     one-column tensor of its cols values. The one-column functors below take such segments: a
//     one-column tensor is one segment of n values, rows mode `rows` segments of `cols`.
// Counts are sums of 1s: exact in float (kRowBlock < 2^24) and in double.
#pragma once

#include <cstdint>

#include "../host_device.h"
#include "half_bits.h"

namespace hgc_dev {
namespace onebit {

constexpr int64_t kRowBlock = 128;  // rows per block of the column sums
constexpr int64_t kLanes = 16;      // columns of a one-column tensor's view

// a+ and a- of a column from its double totals: the means of the non-negative and of the
// negative values among `count` (0 for an empty side).
HGC_HOST_DEVICE inline void finish_column(double p, double m, double cnt, double count, float* a_pos,
                                          float* a_neg) {
  const double neg = count - cnt;
  *a_pos = cnt > 0 ? static_cast<float>(p / cnt) : 0.f;
  *a_neg = neg > 0 ? static_cast<float>(m / neg) : 0.f;
}

// Pass 1, one index per (segment s, row block b, column j), i = s * cells + b * cols + j (cells:
// blocks * cols): the block's sums of column j of segment s into sp/sn/sc[i]. A segment is the
// matrix of n values from element s * seg_len (one segment but in rows mode). Its element (row, j)
// is read at row * ld + j and exists while row * cols + j < n (the partial last row of a
// one-column view).
template <typename T, bool kRes> struct BlockSums {
  using acc = typename Elem<T>::acc;
  const T* g;
  const T* r;
  int64_t rows, cols, ld, n, cells, seg_len;
  acc* sp;
  acc* sn;
  acc* sc;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t base = (i / cells) * seg_len, cell = i % cells;
    const int64_t j = cell % cols, b = cell / cols;
    const int64_t r0 = b * kRowBlock;
    const int64_t r1 = r0 + kRowBlock < rows ? r0 + kRowBlock : rows;
    acc p = acc(0), m = acc(0), c = acc(0);
    for (int64_t row = r0; row < r1 && row * cols + j < n; ++row) {
      const int64_t e = base + row * ld + j;
      acc v = Elem<T>::load(g[e]);
      if (kRes) v += Elem<T>::load(r[e]);
      const bool nonneg = v >= acc(0);  // false for NaN
      p += nonneg ? v : acc(0);
      m += nonneg ? acc(0) : v;
      c += nonneg ? acc(1) : acc(0);
    }
    sp[i] = p;
    sn[i] = m;
    sc[i] = c;
  }
};

// Pass 2 of a matrix, one index per column j: its block sums added in block order, then a+_j and
// a-_j written to scales[j] and scales[cols + j].
template <typename A> struct FinishColumns {
  const A* sp;
  const A* sn;
  const A* sc;
  int64_t blocks, cols, rows;
  float* scales;
  HGC_HOST_DEVICE void operator()(int64_t j) const {
    double p = 0.0, m = 0.0, c = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
      p += static_cast<double>(sp[b * cols + j]);
      m += static_cast<double>(sn[b * cols + j]);
      c += static_cast<double>(sc[b * cols + j]);
    }
    finish_column(p, m, c, static_cast<double>(rows), scales + j, scales + cols + j);
  }
};

// Pass 2 of one-column segments, one index per (segment s, lane l), i = s * kLanes + l: the lane's
// block sums (the segment's `blocks` blocks of BlockSums) added in block order into
// totals[3 * i .. 3 * i + 2] (positive, negative, count).
template <typename A> struct LaneTotals {
  const A* sp;
  const A* sn;
  const A* sc;
  int64_t blocks;
  double* totals;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t first = (i / kLanes) * blocks * kLanes + i % kLanes;
    double p = 0.0, m = 0.0, c = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
      p += static_cast<double>(sp[first + b * kLanes]);
      m += static_cast<double>(sn[first + b * kLanes]);
      c += static_cast<double>(sc[first + b * kLanes]);
    }
    totals[3 * i] = p;
    totals[3 * i + 1] = m;
    totals[3 * i + 2] = c;
  }
};

// Pass 3 of one-column segments of n values, one index per segment s: its lanes' totals in lane
// order -> scales[s] (a+) and scales[segs + s] (a-).
struct FinishLanes {
  const double* totals;
  int64_t n, segs;
  float* scales;
  HGC_HOST_DEVICE void operator()(int64_t s) const {
    const double* t = totals + 3 * kLanes * s;
    double p = 0.0, m = 0.0, c = 0.0;
    for (int64_t l = 0; l < kLanes; ++l) {
      p += t[3 * l];
      m += t[3 * l + 1];
      c += t[3 * l + 2];
    }
    finish_column(p, m, c, static_cast<double>(n), scales + s, scales + segs + s);
  }
};

// Pack, one index per byte b of the bit stream of the n-value matrix of `cols` columns (element
// i at row i / cols, column i % cols, read at row * ld + column): bit k of the byte is
// v(8b + k) >= 0; with a residual, r <- v - (bit ? a+ : a-) of the element's group (its column;
// by_rows: its row), rounded to T; a+ of group q at scales[q], a- at scales[groups + q]. The
// index writes its byte and its (up to) 8 residual values only.
template <typename T, bool kRes> struct Pack {
  using acc = typename Elem<T>::acc;
  const T* g;
  T* r;
  int64_t n, cols, ld, groups;
  bool by_rows;
  const float* scales;
  uint8_t* bits;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    int64_t i = b * 8;
    const int64_t end = i + 8 < n ? i + 8 : n;
    int64_t j = i % cols, row = i / cols;
    int64_t src = row * ld + j;
    unsigned byte = 0;
    for (int k = 0; i < end; ++i, ++k) {
      acc v = Elem<T>::load(g[src]);
      if (kRes) v += Elem<T>::load(r[src]);
      const bool nonneg = v >= acc(0);
      byte |= static_cast<unsigned>(nonneg) << k;
      const int64_t q = by_rows ? row : j;
      if (kRes) r[src] = Elem<T>::store(v - static_cast<acc>(nonneg ? scales[q] : scales[groups + q]));
      ++src;
      if (++j == cols) { j = 0; ++row; src += ld - cols; }
    }
    bits[b] = static_cast<uint8_t>(byte);
  }
};

// Decode-sum, one index per byte b: the (up to) 8 values of the byte, each the sum over the K
// payloads in payload order of (bit ? a+ : a-) of its group (Pack's), in the arithmetic type from
// 0, times `scale` (float(scale) below fp64), rounded to T and written at row * ld + column.
template <typename T> struct DecodeSum {
  using acc = typename Elem<T>::acc;
  const uint8_t* bits;
  int64_t bits_stride;
  const float* scales;
  int64_t scales_stride, K, n, cols, ld, groups;
  bool by_rows;
  acc scale;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    int64_t i = b * 8;
    const int64_t end = i + 8 < n ? i + 8 : n;
    int64_t j = i % cols, row = i / cols;
    int64_t dst = row * ld + j;
    for (int k = 0; i < end; ++i, ++k) {
      const int64_t g = by_rows ? row : j;
      acc sum = acc(0);
      for (int64_t q = 0; q < K; ++q) {
        const float* ap = scales + q * scales_stride;
        const bool bit = (bits[q * bits_stride + b] >> k) & 1u;
        sum += static_cast<acc>(bit ? ap[g] : ap[groups + g]);
      }
      out[dst] = Elem<T>::store(sum * scale);
      ++dst;
      if (++j == cols) { j = 0; ++row; dst += ld - cols; }
    }
  }
};

}  // namespace onebit
}  // namespace hgc_dev
