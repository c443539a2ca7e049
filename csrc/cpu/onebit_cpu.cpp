// 1-bit codec with fused error feedback, CPU.
//
// Encode is two passes over v = g + r (onebit_scales runs the first alone, read-only; an encode
// given those scales runs the second alone: the exchange measures before its preamble, packs after):
//   1. per-column sums of the non-negative and negative entries and the count of
//      non-negative ones, in the one order of csrc/device/onebit_functors.h (fixed row
//      blocks, combined in double in block order) that the device kernels follow too: the
//      scales are the same for any thread count and on either device;
//   2. pack the sign bits (8 values -> 1 byte) and, in the same pass, overwrite r with
//      v - decoded (the error-feedback update).
// Decode-sum walks the output in blocks small enough to stay in cache, adding each of the
// K payloads' reconstruction into the block before writing it once.
// Rows mode (by_rows: a+ and a- per row of the contiguous [rows, n / rows] view) sums each row as
// a one-column tensor (lane_stats), parallel over rows; its pack and decode walk the same flat
// order, a byte at once where its 8 values share a row. No copies in either mode.
#include "onebit_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "../device/onebit_functors.h"
#include "../payload_checks.h"
#include "simd.h"

namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> using acc_of = typename Acc<T>::type;

using hgc_dev::onebit::finish_column;
using hgc_dev::onebit::kLanes;
using hgc_dev::onebit::kRowBlock;

constexpr int64_t kGrain = 1 << 15;    // elements per task below which threads do not pay off
constexpr int64_t kColTile = 1024;     // columns per task of the block sums (three float rows stay in L1)

// Block sums of columns [j0, j1) over rows [r0, r1) (row `row` at g + row * ld) into
// p/m/cnt[j0, j1): each column summed in row order from 0 (onebit_functors.h's block sums).
template <typename scalar_t, bool kResidual>
void block_sums(const scalar_t* g, const scalar_t* r, int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t ld,
                acc_of<scalar_t>* p, acc_of<scalar_t>* m, acc_of<scalar_t>* cnt) {
  using acc_t = acc_of<scalar_t>;
  std::fill(p + j0, p + j1, acc_t(0));
  std::fill(m + j0, m + j1, acc_t(0));
  std::fill(cnt + j0, cnt + j1, acc_t(0));
#if defined(__SSE2__)
  if constexpr (std::is_same<scalar_t, float>::value) {
    for (int64_t row = r0; row < r1; row += 4) {
      hgc::sse_sums_rows<kResidual>(g + row * ld + j0, kResidual ? r + row * ld + j0 : nullptr, ld,
                                    static_cast<int>(std::min<int64_t>(4, r1 - row)), j1 - j0, p + j0, m + j0,
                                    cnt + j0);
    }
    return;
  }
#endif
  for (int64_t row = r0; row < r1; ++row) {
    const scalar_t* __restrict__ gr = g + row * ld;
    const scalar_t* __restrict__ rr = kResidual ? r + row * ld : nullptr;
    acc_t* __restrict__ pp = p;
    acc_t* __restrict__ mm = m;
    acc_t* __restrict__ cc = cnt;
    for (int64_t j = j0; j < j1; ++j) {
      acc_t v = static_cast<acc_t>(gr[j]);
      if (kResidual) v += static_cast<acc_t>(rr[j]);
      const bool nonneg = v >= acc_t(0);
      pp[j] += nonneg ? v : acc_t(0);
      mm[j] += nonneg ? acc_t(0) : v;
      cc[j] += nonneg ? acc_t(1) : acc_t(0);
    }
  }
}

// The statistics of a one-column tensor of n contiguous values (onebit_functors.h's order: its
// [ceil(n / kLanes), kLanes] view summed per lane in row blocks, the blocks added in double in block
// order, then the lanes in lane order) into *a_pos, *a_neg. Rows mode computes each row so.
template <typename scalar_t, bool kResidual>
void lane_stats(const scalar_t* g, const scalar_t* r, int64_t n, float* a_pos, float* a_neg) {
  using acc_t = acc_of<scalar_t>;
  // The [ceil(n / kLanes), kLanes] view: per block, kLanes column sums (p, m, cnt rows).
  const int64_t full = n / kLanes, tail = n % kLanes;
  const int64_t blocks = (full + (tail > 0) + kRowBlock - 1) / kRowBlock;
  std::vector<acc_t> part(3 * kLanes * blocks);
  at::parallel_for(0, blocks, std::max<int64_t>(1, kGrain / (kRowBlock * kLanes)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      acc_t* p = part.data() + 3 * kLanes * b;
      acc_t* m = p + kLanes;
      acc_t* cnt = m + kLanes;
      const int64_t r0 = b * kRowBlock, r1 = std::min(full, r0 + kRowBlock);
#if defined(__SSE2__)
      if constexpr (std::is_same<scalar_t, float>::value) {
        hgc::sse_sums_16<kResidual>(g + r0 * kLanes, kResidual ? r + r0 * kLanes : nullptr, r1 - r0, p, m, cnt);
      } else
#endif
      {
        block_sums<scalar_t, kResidual>(g, r, r0, r1, 0, kLanes, kLanes, p, m, cnt);
      }
      if (tail > 0 && b == blocks - 1) {  // the partial last row: lanes [0, tail)
        for (int64_t l = 0; l < tail; ++l) {
          acc_t v = static_cast<acc_t>(g[full * kLanes + l]);
          if (kResidual) v += static_cast<acc_t>(r[full * kLanes + l]);
          const bool nonneg = v >= acc_t(0);
          p[l] += nonneg ? v : acc_t(0);
          m[l] += nonneg ? acc_t(0) : v;
          cnt[l] += nonneg ? acc_t(1) : acc_t(0);
        }
      }
    }
  });
  double lp[kLanes] = {}, lm[kLanes] = {}, lc[kLanes] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const acc_t* q = part.data() + 3 * kLanes * b;
    for (int64_t l = 0; l < kLanes; ++l) {
      lp[l] += static_cast<double>(q[l]);
      lm[l] += static_cast<double>(q[kLanes + l]);
      lc[l] += static_cast<double>(q[2 * kLanes + l]);
    }
  }
  double p = 0.0, m = 0.0, cnt = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) { p += lp[l]; m += lm[l]; cnt += lc[l]; }
  finish_column(p, m, cnt, static_cast<double>(n), a_pos, a_neg);
}

// Pass 1: per-column mean of the non-negative and of the negative entries of v = g (+ r), in
// the one order of onebit_functors.h (row blocks of kRowBlock rows summed per column, the
// blocks added in double in block order; a one-column tensor as kLanes lanes), whatever the
// thread count. Row `row` of the matrix starts at g + row * ld (ld == cols: contiguous;
// ld > cols: a column window of a wider matrix, which needs cols >= 2): same sums for any ld.
template <typename scalar_t, bool kResidual>
void column_stats(const scalar_t* g, const scalar_t* r, int64_t rows, int64_t cols, int64_t ld, float* a_pos,
                  float* a_neg) {
  using acc_t = acc_of<scalar_t>;
  const int64_t n = rows * cols;
  if (cols == 1) {  // contiguous only (the caller never passes a one-column window)
    lane_stats<scalar_t, kResidual>(g, r, n, a_pos, a_neg);
    return;
  }
  // Several columns: a task per (row block, column tile); the inner loop runs along a row, so it
  // is contiguous and vectorizes.
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock, tiles = (cols + kColTile - 1) / kColTile;
  std::vector<acc_t> sp(blocks * cols), sn(blocks * cols), sc(blocks * cols);
  const int64_t task_work = std::min(rows, kRowBlock) * std::min(cols, kColTile);
  at::parallel_for(0, blocks * tiles, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, task_work)),
                   [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, j0 = (t % tiles) * kColTile, j1 = std::min(cols, j0 + kColTile);
      const int64_t r0 = b * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      block_sums<scalar_t, kResidual>(g, r, r0, r1, j0, j1, ld, sp.data() + b * cols, sn.data() + b * cols,
                                      sc.data() + b * cols);
    }
  });
  at::parallel_for(0, cols, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, blocks)), [&](int64_t c0, int64_t c1) {
    for (int64_t j0 = c0; j0 < c1; j0 += kColTile) {
      const int64_t len = std::min(kColTile, c1 - j0);
      double p[kColTile] = {}, m[kColTile] = {}, cnt[kColTile] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const acc_t* bp = sp.data() + b * cols + j0;
        const acc_t* bm = sn.data() + b * cols + j0;
        const acc_t* bc = sc.data() + b * cols + j0;
        for (int64_t u = 0; u < len; ++u) {
          p[u] += static_cast<double>(bp[u]);
          m[u] += static_cast<double>(bm[u]);
          cnt[u] += static_cast<double>(bc[u]);
        }
      }
      for (int64_t u = 0; u < len; ++u)
        finish_column(p[u], m[u], cnt[u], static_cast<double>(rows), a_pos + j0 + u, a_neg + j0 + u);
    }
  });
}

// Pass 1 of rows mode: a+ and a- of every row of the contiguous rows x cols matrix v = g (+ r),
// each row summed as lane_stats sums a one-column tensor of its cols values (bitwise the scales of
// encoding the row alone), a task per group of rows.
template <typename scalar_t, bool kResidual>
void row_stats(const scalar_t* g, const scalar_t* r, int64_t rows, int64_t cols, float* a_pos, float* a_neg) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cols)), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      lane_stats<scalar_t, kResidual>(g + row * cols, kResidual ? r + row * cols : nullptr, cols, a_pos + row,
                                      a_neg + row);
    }
  });
}

// One byte of sign bits of the 8 values v = gs (+ rs); with a residual, rs[k] <- v - (v >= 0 ?
// pos[k] : neg[k]), rounded to scalar_t.
template <typename scalar_t, bool kResidual>
inline uint8_t pack8(const scalar_t* gs, scalar_t* rs, const float* pos, const float* neg) {
  using acc_t = acc_of<scalar_t>;
#if defined(__SSE2__)
  if constexpr (std::is_same<scalar_t, float>::value) return hgc::sse_pack8<kResidual>(gs, rs, pos, neg);
#endif
  acc_t v[8];
  for (int k = 0; k < 8; ++k) {
    v[k] = static_cast<acc_t>(gs[k]);
    if (kResidual) v[k] += static_cast<acc_t>(rs[k]);
  }
  if (kResidual) {
    for (int k = 0; k < 8; ++k) rs[k] = static_cast<scalar_t>(v[k] - static_cast<acc_t>(v[k] >= acc_t(0) ? pos[k] : neg[k]));
  }
  return hgc::sign_byte(v);
}

// Bit k of a byte for the one value v = g[src] (+ r[src]), with pack8's residual update.
template <typename scalar_t, bool kResidual>
inline uint8_t pack1(const scalar_t* g, scalar_t* r, int64_t src, float pos, float neg, int k) {
  using acc_t = acc_of<scalar_t>;
  acc_t v = static_cast<acc_t>(g[src]);
  if (kResidual) v += static_cast<acc_t>(r[src]);
  const bool nonneg = v >= acc_t(0);
  if (kResidual) r[src] = static_cast<scalar_t>(v - static_cast<acc_t>(nonneg ? pos : neg));
  return static_cast<uint8_t>(static_cast<uint8_t>(nonneg) << k);
}

// Pass 2 over bytes [b0, b1) of the bit stream of the rows x cols matrix (element i at row
// i / cols, column i % cols, read from g[row * ld + column]): pack the sign bits and, with a
// residual, store v - decoded at the same place of r.
template <typename scalar_t, bool kResidual>
void pack_range(const scalar_t* g, scalar_t* r, int64_t n, int64_t cols, int64_t ld, const float* a_pos,
                const float* a_neg, uint8_t* bits, int64_t b0, int64_t b1) {
  int64_t i = b0 * 8;
  const int64_t row_skip = ld - cols;  // from one row's end to the next row's start
  if (cols == 1 || cols % 8 == 0) {
    // The 8 values of a byte share one row: their columns are j..j+7 (or the one column),
    // contiguous at src..src+7.
    float ones_p[8], ones_n[8];
    std::fill(ones_p, ones_p + 8, a_pos[0]);
    std::fill(ones_n, ones_n + 8, a_neg[0]);
    const int64_t full_end = std::min(b1, n / 8);
    int64_t j = cols == 1 ? 0 : i % cols;
    int64_t src = cols == 1 ? i : (i / cols) * ld + j;
    for (int64_t b = b0; b < full_end; ++b, i += 8) {
      const float* P = cols == 1 ? ones_p : a_pos + j;
      const float* N = cols == 1 ? ones_n : a_neg + j;
      bits[b] = pack8<scalar_t, kResidual>(g + src, kResidual ? r + src : nullptr, P, N);
      src += 8;
      if (cols != 1) {
        j += 8;
        if (j == cols) { j = 0; src += row_skip; }
      }
    }
    b0 = full_end;
  }
  // Any column count (and the last, partial byte): element by element with a wrapping column.
  int64_t j = cols ? i % cols : 0;
  int64_t src = cols ? (i / cols) * ld + j : 0;
  for (int64_t b = b0; b < b1; ++b) {
    uint8_t byte = 0;
    for (int k = 0; k < 8 && i < n; ++k, ++i) {
      byte |= pack1<scalar_t, kResidual>(g, r, src, a_pos[j], a_neg[j], k);
      ++src;
      if (++j == cols) { j = 0; src += row_skip; }
    }
    bits[b] = byte;
  }
}

// The current row of a walk over a contiguous rows x cols matrix in element order (rows mode):
// its a+ and a- repeated 8 times, for the 8 values of a byte that lie in it.
struct RowCursor {
  const float* a_pos;
  const float* a_neg;
  int64_t cols, row, end;  // end: the flat index one past the row
  float pos[8], neg[8];
  RowCursor(const float* ap, const float* an, int64_t cols, int64_t i)
      : a_pos(ap), a_neg(an), cols(cols), row(i / cols), end((i / cols + 1) * cols) { fill(); }
  void fill() {
    std::fill(pos, pos + 8, a_pos[row]);
    std::fill(neg, neg + 8, a_neg[row]);
  }
  // Moves to the row of element i (i <= end; i < n).
  void reach(int64_t i) {
    if (i == end) { ++row; end += cols; fill(); }
  }
};

// Pass 2 of rows mode over bytes [b0, b1) of the contiguous rows x cols matrix (element i in row
// i / cols, which gives its a+ and a-): pack_range's bits and residual update; a byte whose 8
// values lie in one row is packed at once.
template <typename scalar_t, bool kResidual>
void pack_rows_range(const scalar_t* g, scalar_t* r, int64_t n, int64_t cols, const float* a_pos,
                     const float* a_neg, uint8_t* bits, int64_t b0, int64_t b1) {
  int64_t i = b0 * 8;
  RowCursor at(a_pos, a_neg, cols, i);
  for (int64_t b = b0; b < b1; ++b) {
    at.reach(i);
    if (i + 8 <= at.end) {
      bits[b] = pack8<scalar_t, kResidual>(g + i, kResidual ? r + i : nullptr, at.pos, at.neg);
      i += 8;
      continue;
    }
    uint8_t byte = 0;
    for (int k = 0; k < 8 && i < n; ++k, ++i) {
      at.reach(i);
      byte |= pack1<scalar_t, kResidual>(g, r, i, at.pos[0], at.neg[0], k);
    }
    bits[b] = byte;
  }
}

// Encode the n-value rows x cols matrix whose row `row` starts at g + row * ld (and r + row * ld).
// stats: pass 1 into `scales` (else `scales` holds the matrix's scales already); pack: pass 2.
// by_rows: a+ and a- per row (rows mode, contiguous: ld == cols), else per column.
template <typename scalar_t, bool kResidual>
void encode_impl(const scalar_t* g, scalar_t* r, int64_t n, int64_t cols, int64_t ld, uint8_t* bits, float* scales,
                 bool stats, bool pack, bool by_rows) {
  if (n == 0) return;
  const int64_t rows = n / cols;
  float* a_pos = scales;
  float* a_neg = scales + (by_rows ? rows : cols);
  if (stats && by_rows) row_stats<scalar_t, kResidual>(g, r, rows, cols, a_pos, a_neg);
  if (stats && !by_rows) column_stats<scalar_t, kResidual>(g, r, rows, cols, ld, a_pos, a_neg);
  if (!pack) return;
  at::parallel_for(0, (n + 7) / 8, kGrain / 8, [&](int64_t b0, int64_t b1) {
    if (by_rows) {
      pack_rows_range<scalar_t, kResidual>(g, r, n, cols, a_pos, a_neg, bits, b0, b1);
    } else {
      pack_range<scalar_t, kResidual>(g, r, n, cols, ld, a_pos, a_neg, bits, b0, b1);
    }
  });
}

// acc[t] += bit(start + t) ? a+[col] : a-[col] for t < len, one payload.
inline void add_payload(const uint8_t* bk, const float* ap, const float* an, int64_t cols, int64_t start,
                        int64_t len, float* acc) {
  int64_t t = 0;
  if (cols == 1 || cols % 8 == 0) {
    float ones_p[8], ones_n[8];
    std::fill(ones_p, ones_p + 8, ap[0]);
    std::fill(ones_n, ones_n + 8, an[0]);
    int64_t j = cols == 1 ? 0 : start % cols;
    for (; t + 8 <= len; t += 8) {
      const uint8_t byte = bk[(start + t) >> 3];
      if (cols == 1) {
        hgc::add_select8(byte, ones_p, ones_n, acc + t);
      } else {
        hgc::add_select8(byte, ap + j, an + j, acc + t);
        j += 8;
        if (j == cols) j = 0;
      }
    }
  }
  int64_t j = cols ? (start + t) % cols : 0;
  for (; t < len; ++t) {
    const int64_t i = start + t;
    acc[t] += ((bk[i >> 3] >> (i & 7)) & 1) ? ap[j] : an[j];
    if (++j == cols) j = 0;
  }
}

// add_payload of rows mode: acc[t] += bit(start + t) ? a+[row] : a-[row] (start % 8 == 0; element
// i of the contiguous matrix of `cols` columns in row i / cols).
inline void add_payload_rows(const uint8_t* bk, const float* ap, const float* an, int64_t cols, int64_t start,
                             int64_t len, float* acc) {
  RowCursor at(ap, an, cols, start);
  for (int64_t t = 0; t < len;) {
    const int64_t i = start + t;
    at.reach(i);
    if ((i & 7) == 0 && t + 8 <= len && i + 8 <= at.end) {
      hgc::add_select8(bk[i >> 3], at.pos, at.neg, acc + t);
      t += 8;
    } else {
      acc[t++] += ((bk[i >> 3] >> (i & 7)) & 1) ? at.pos[0] : at.neg[0];
    }
  }
}

// out[i] = scale * sum_k (bit_k(i) ? a+_k[grp(i)] : a-_k[grp(i)]) for i in [lo, hi), lo % 8 == 0,
// element i (row i / cols, column i % cols) written at out[row * ld + column] (ld == cols:
// contiguous); grp(i): the column, or with kRows (rows mode: `groups` == rows, ld == cols) the row.
// Sums in float (in double for double outputs), a cache-sized block at a time.
template <typename scalar_t, bool kRows>
void decode_sum_range(const uint8_t* bits, int64_t bits_stride, const float* scales, int64_t scales_stride,
                      int64_t K, int64_t cols, int64_t ld, int64_t groups, double scale, scalar_t* out, int64_t lo,
                      int64_t hi) {
  constexpr int64_t kBlock = 4096;  // a multiple of 8: blocks start on byte boundaries
  const int64_t row_skip = ld - cols;
  if (std::is_same<scalar_t, double>::value) {
    int64_t j = lo % cols, row = lo / cols, dst = row * ld + j;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t grp = kRows ? row : j;
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float* ap = scales + k * scales_stride;
        acc += ((bits[k * bits_stride + (i >> 3)] >> (i & 7)) & 1) ? ap[grp] : ap[groups + grp];
      }
      out[dst++] = static_cast<scalar_t>(acc * scale);
      if (++j == cols) { j = 0; ++row; dst += row_skip; }
    }
    return;
  }
  float acc[kBlock];
  const float s = static_cast<float>(scale);
  for (int64_t start = lo; start < hi; start += kBlock) {
    const int64_t len = std::min(kBlock, hi - start);
    std::fill(acc, acc + len, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float* ap = scales + k * scales_stride;
      if (kRows) {
        add_payload_rows(bits + k * bits_stride, ap, ap + groups, cols, start, len, acc);
      } else {
        add_payload(bits + k * bits_stride, ap, ap + cols, cols, start, len, acc);
      }
    }
    if (row_skip == 0) {
      for (int64_t t = 0; t < len; ++t) out[start + t] = static_cast<scalar_t>(acc[t] * s);
    } else {  // row by row: each run of the block that stays in one row is contiguous in out
      int64_t j = start % cols, dst = (start / cols) * ld + j;
      for (int64_t t = 0; t < len;) {
        const int64_t run = std::min(cols - j, len - t);
        scalar_t* __restrict__ o = out + dst;
        for (int64_t u = 0; u < run; ++u) o[u] = static_cast<scalar_t>(acc[t + u] * s);
        t += run;
        j += run;
        dst += run;
        if (j == cols) { j = 0; dst += row_skip; }
      }
    }
  }
}

// The columns of the matrix of n values in `groups` scale pairs: `groups` itself, or by_rows (rows
// mode: one pair per row) n / groups (0 for an empty matrix).
int64_t matrix_cols(int64_t n, int64_t groups, bool by_rows) {
  return by_rows ? (groups > 0 ? n / groups : 0) : groups;
}

// The encode of the n-value matrix of `groups` columns starting at element `offset` of `src`
// (and of the residual), rows `ld` elements apart: onebit_encode_cpu (offset 0, ld = cols) and
// its column windows; by_rows: of the contiguous matrix of `groups` rows, a+ and a- per row (ld
// and offset unused). With `given` scales (this matrix's onebit_scales, checked here) only pass 2
// runs, with them: the same bits and residual, and the payload's scales are `given` itself.
// `pack` false: pass 1 only (bits empty): onebit_scales. The other arguments are checked by the callers.
std::tuple<at::Tensor, at::Tensor> encode_matrix(const at::Tensor& src, const c10::optional<at::Tensor>& residual,
                                                 int64_t n, int64_t groups, int64_t ld, int64_t offset,
                                                 const c10::optional<at::Tensor>& given = c10::nullopt,
                                                 bool pack = true, bool by_rows = false) {
  const bool has_res = residual.has_value() && residual->defined();
  const bool has_given = given.has_value() && given->defined();
  if (has_given) hgc::check_onebit_given_scales(*given, src, groups);
  const int64_t cols = matrix_cols(n, groups, by_rows);
  if (by_rows) ld = cols;
  auto bits = at::empty({pack ? (n + 7) / 8 : 0}, src.options().dtype(at::kByte));
  auto scales = has_given ? *given : at::zeros({2 * groups}, src.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "onebit_encode_cpu", [&] {
    const auto* g = src.data_ptr<scalar_t>() + offset;
    if (has_res) {
      encode_impl<scalar_t, true>(g, residual->data_ptr<scalar_t>() + offset, n, cols, ld, bits.data_ptr<uint8_t>(),
                                  scales.data_ptr<float>(), !has_given, pack, by_rows);
    } else {
      encode_impl<scalar_t, false>(g, nullptr, n, cols, ld, bits.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                                   !has_given, pack, by_rows);
    }
  });
  return {bits, scales};
}

// scale * the sum of the K stacked payloads of an n-value matrix of `groups` columns, written from
// element `offset` of `out` with rows `ld` elements apart: onebit_decode_sum_cpu (offset 0,
// ld = cols) and the column-window decode; by_rows: of the contiguous matrix of `groups` rows
// (ld unused). The arguments are checked by the callers.
void decode_sum_matrix(const at::Tensor& bits, const at::Tensor& scales, int64_t K, int64_t n, int64_t groups,
                       int64_t ld, double scale, const at::Tensor& out, int64_t offset, bool by_rows = false) {
  const int64_t cols = matrix_cols(n, groups, by_rows);
  if (by_rows) ld = cols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "onebit_decode_sum_cpu", [&] {
    auto* o = out.data_ptr<scalar_t>() + offset;
    const uint8_t* b = bits.data_ptr<uint8_t>();
    const float* sc = scales.data_ptr<float>();
    const int64_t bs = bits.stride(0), ss = scales.stride(0);
    at::parallel_for(0, (n + 7) / 8, kGrain / 8, [&](int64_t b0, int64_t b1) {
      const int64_t lo = b0 * 8, hi = std::min(n, b1 * 8);
      // One payload as it is: with constants the compiler drops the loop over payloads and the
      // product by 1 (exact), measurably faster (same values).
      const bool one = K == 1 && scale == 1.0;
      if (by_rows) {
        if (one) decode_sum_range<scalar_t, true>(b, bs, sc, ss, 1, cols, ld, groups, 1.0, o, lo, hi);
        else decode_sum_range<scalar_t, true>(b, bs, sc, ss, K, cols, ld, groups, scale, o, lo, hi);
      } else {
        if (one) decode_sum_range<scalar_t, false>(b, bs, sc, ss, 1, cols, ld, groups, 1.0, o, lo, hi);
        else decode_sum_range<scalar_t, false>(b, bs, sc, ss, K, cols, ld, groups, scale, o, lo, hi);
      }
    });
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> onebit_encode_cpu(const at::Tensor& grad,
                                                     const c10::optional<at::Tensor>& residual,
                                                     int64_t cols, const c10::optional<at::Tensor>& scales,
                                                     bool by_rows) {
  hgc::check_onebit_encode_args(grad, residual, cols, at::kCPU, by_rows);
  return encode_matrix(grad, residual, grad.numel(), cols, cols, 0, scales, true, by_rows);
}

at::Tensor onebit_scales_cpu(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                             bool by_rows) {
  hgc::check_onebit_encode_args(grad, residual, cols, at::kCPU, by_rows);
  return std::get<1>(encode_matrix(grad, residual, grad.numel(), cols, cols, 0, c10::nullopt, false, by_rows));
}

at::Tensor onebit_decode_sum_cpu(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                 at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt,
                                 bool by_rows) {
  hgc::check_onebit_payload_devices(bits, scales);
  const int64_t K = hgc::check_onebit_decode_args(bits, scales, n, cols, dtype, at::kCPU, by_rows);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, bits.device(), "onebit_decode");
  decode_sum_matrix(bits, scales, K, n, cols, cols, scale, out, 0, by_rows);
  return out;
}

at::Tensor onebit_decode_cpu(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, const c10::optional<at::Tensor>& out, bool by_rows) {
  hgc::check_onebit_flat_payload(bits, scales, "onebit_decode");
  return onebit_decode_sum_cpu(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out, by_rows);
}

std::tuple<at::Tensor, at::Tensor> onebit_encode_columns_cpu(const at::Tensor& full,
                                                             const c10::optional<at::Tensor>& residual,
                                                             int64_t full_cols, int64_t col0, int64_t col1,
                                                             const c10::optional<at::Tensor>& scales) {
  const int64_t n = hgc::check_onebit_encode_columns_args(full, residual, full_cols, col0, col1, at::kCPU);
  return encode_matrix(full, residual, n, col1 - col0, full_cols, col0, scales);
}

void onebit_decode_columns_cpu(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                               int64_t full_cols, int64_t col0, int64_t col1) {
  const int64_t n = hgc::check_onebit_decode_columns_args(bits, scales, out, full_cols, col0, col1, at::kCPU);
  decode_sum_matrix(bits.unsqueeze(0), scales.unsqueeze(0), 1, n, col1 - col0, full_cols, 1.0, out, col0);
}
