// DGC's device launchers (csrc/device/dgc_device.cu): plain C++ (raw pointers, sizes, DType, the
// launch context), for the torch ops of dgc_ops.cpp. Same selection rule, sampling stream, index
// code and accumulation order as the CPU kernels (csrc/cpu/dgc_*.cpp), so the same thresholds,
// paths, payloads and sums, bit for bit. Errors (CUDA, allocation) are thrown as exceptions.
#pragma once

#include <cstdint>

#include "context.h"

namespace hgc_dev {

// The selection of about k of the n values of x (n >= 1, k >= 1), as the CPU's dgc_select:
// with m > 0 samples, t0 = max(1, the ceil(k*m/n)-th largest of the m sampled keys) and
// c0 = #{key >= t0}; t = t0 when k/2 <= c0 <= 2k (path 0); the exact k-th largest key when
// c0 > 2k (path 1) or c0 < k/2, m == 0, k >= n (path 2: 1 when at most k keys are nonzero).
// Host round trips: one on path 0 (the count and t in one integer reduction), two on paths 1
// and 2 (c0, then the exact count and t); algorithm calls: 4 on paths 0 and 2, 7 on path 1.
struct DgcThreshold {
  uint64_t key;   // t as a key (|x|'s bits)
  double value;   // t as a double
  int64_t path;   // 0, 1 or 2
  int64_t count;  // #{i : key_i >= t}
};
DgcThreshold dgc_threshold(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t k, int64_t sample_count,
                           uint64_t key);

// Ascending indices (int32, or int64 when wide) and the values (x's bits) of {i : key_i >= t_key};
// `count` of them (dgc_threshold's count). One copy_if.
void dgc_compact(const Ctx& ctx, DType dtype, const void* x, int64_t n, uint64_t t_key, bool wide, void* idx,
                 void* vals, int64_t count);

// Validity of K payloads' indices (host arrays of K device pointers and counts): bad[r] (host,
// K values) = the number of positions of payload r that are out of [0, n) or not above their
// predecessor. One table upload, two algorithm calls, one read-back of the K flags.
void dgc_check_indices(const Ctx& ctx, const void* const* idx, bool wide, const int64_t* counts, int64_t K, int64_t n,
                       int64_t* bad);

// out (n values of dtype) = scale * sum_r scatter(idx[r], vals[r]), accumulated in float (double
// for fp64), payloads in order, rounded once: the CPU's numbers. The indices must have passed
// dgc_check_indices. Algorithm calls: a fill, one for_each per nonempty payload, the scaling.
void dgc_scatter_sum(const Ctx& ctx, DType dtype, const void* const* idx, bool wide, const void* const* vals,
                     const int64_t* counts, int64_t K, int64_t n, double scale, void* out);

// The largest gap code idx_j - idx_{j-1} - 1 (idx_{-1} = -1) of count >= 1 indices, and whether
// they are strictly increasing in [0, n) (one integer reduction, read back).
struct DgcIndexScan {
  int64_t top;
  bool ok;
};
DgcIndexScan dgc_index_scan(const Ctx& ctx, const void* idx, bool wide, int64_t count, int64_t n);

// The gap codes of count indices as w = 1 or 2 little-endian bytes each, into code[w * count].
void dgc_index_write_gaps(const Ctx& ctx, const void* idx, bool wide, int64_t count, int w, uint8_t* code);

// Copies `bytes` bytes within device memory (the absolute index code; any alignment).
void dgc_copy_bytes(const Ctx& ctx, const void* src, int64_t bytes, void* dst);

// Decodes count >= 1 gap codes of w = 1 or 2 bytes into indices (int32, clamped to n, or int64
// when wide); returns whether they are strictly increasing in [0, n).
bool dgc_index_read_gaps(const Ctx& ctx, const uint8_t* code, int w, int64_t count, int64_t n, bool wide, void* idx);

// Whether count indices (int32, or int64 when wide) are strictly increasing in [0, n).
bool dgc_indices_ok(const Ctx& ctx, const void* idx, bool wide, int64_t count, int64_t n);

// DGC's momentum correction in place (fp32/fp64), hgc::dgc_accumulate_step on every index:
// h = g * coef (coef != 1), u = u * m + h, v = v + u (nesterov: v = (v + h) + u * m).
void dgc_accumulate(const Ctx& ctx, DType dtype, void* u, void* v, const void* g, int64_t n, double momentum,
                    bool nesterov, double coef);

}  // namespace hgc_dev
