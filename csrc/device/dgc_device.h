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

// ---- a bucket at once (multi_tensor.cuh): a fixed number of device algorithm calls ------------

// One payload of a bucket's decode-sum: `count` indices of w bytes each at `index_bytes` (any
// alignment): w = 1, 2: the gap code (as dgc_index_read_gaps reads it); w = 4, 8: the indices
// themselves, little-endian int32 / int64 (decoded indices are their own absolute code); and
// `count` values of the tensor's dtype.
struct DgcSumPayload {
  const uint8_t* index_bytes;
  int w;
  int64_t count;
  const void* values;
};

// One tensor of a bucket's decode-sum: n values of dtype, into out.
struct DgcSumTensor {
  DType dtype;
  int64_t n;
  void* out;
};

// dgc_scatter_sum of every tensor with its K payloads (tensor t's payload r at payloads[t * K +
// r]; one K and one scale for the bucket): bitwise the same outputs. The indices of every
// payload are made (int64 scratch) and checked first; bad[t * K + r] (host, count * K values)
// gets the number of positions of that payload that are out of [0, n) or not above their
// predecessor, read back in ONE copy; when any is bad, no output is written and false is
// returned. Algorithm calls: steps, scan, indices, flag scan (none of these 4 when no payload
// holds a position), per-payload flags; then per dtype present a fill, one for_each per payload
// rank r that holds positions, the scaling. So at most 5 + 4 * (K + 2), whatever `count` is;
// one table upload.
bool dgc_scatter_sum_many(const Ctx& ctx, const DgcSumTensor* tensors, int64_t count, const DgcSumPayload* payloads,
                          int64_t K, double scale, int64_t* bad);

// One tensor of a bucket's momentum correction: dgc_accumulate's arguments (fp32 or fp64).
struct DgcAccumulateItem {
  DType dtype;
  void* u;
  void* v;
  const void* g;
  int64_t n;
};

// dgc_accumulate of every item with the bucket's momentum, nesterov and coef, bitwise the same:
// one for_each per dtype present (at most 2), one table upload.
void dgc_accumulate_many(const Ctx& ctx, const DgcAccumulateItem* items, int64_t count, double momentum,
                         bool nesterov, double coef);

// One tensor of a bucket's masking: `count` sent indices (int32, or int64 when wide) of a tensor
// of n values of esize = 2, 4 or 8 bytes; v (and u, nullptr: none) zeroed there.
struct DgcMaskItem {
  const void* idx;
  bool wide;
  int64_t count, n;
  int esize;
  void* v;
  void* u;
};

// v[idx] = 0 (and u[idx] = 0) for every item, as index_fill_(0, idx, 0) writes them: one
// for_each, one table upload. Indices out of [0, n) are skipped (the caller passes the
// selection's indices, strictly increasing in [0, n)).
void dgc_mask_many(const Ctx& ctx, const DgcMaskItem* items, int64_t count);


// One tensor of a bucket's selection: dgc_threshold's arguments (n >= 1, k >= 1, sample_count >= 0).
struct DgcSelectItem {
  DType dtype;
  const void* x;
  int64_t n, k, sample_count;
  uint64_t key;
};

// dgc_threshold of every item, bitwise its thresholds, paths and counts, into out[count]. For the
// whole bucket: the sampled keys of the sampled items and every key of the exactly selected ones
// (m == 0, k < n) in one gather and one segmented sort ((tensor, key) pairs), the per-tensor
// (count, threshold) of every item by one scan by tensor, each item's path decided on the device
// (a for_each); the estimates off by more than 2x (paths 1, 2) refined there by a segmented radix
// select over all their keys (3 calls per byte of the widest sampled key: tile histograms, their
// sums, the digit; run whenever an item is sampled, since only the device knows which need it);
// then every item's (count, t, path) read back in ONE copy, the op's only host synchronization.
// Algorithm calls: 4 without a sampled item, else 4 + 3 * (its widest key's bytes: 2, 4 or 8);
// one table upload.
void dgc_threshold_many(const Ctx& ctx, const DgcSelectItem* items, int64_t count, DgcThreshold* out);

// One tensor of a bucket's compaction: dgc_compact's arguments (count: dgc_threshold's count of
// t_key, the size of idx and vals).
struct DgcCompactItem {
  DType dtype;
  const void* x;
  int64_t n;
  uint64_t t_key;
  bool wide;
  void* idx;
  void* vals;
  int64_t count;
};

// dgc_compact of every item, bitwise: one scan of the selected flags of all items (each selected
// position's place in its item's output: ascending), one for_each writing each item's indices and
// values; one table upload, no read back (item counts are dgc_threshold_many's).
void dgc_compact_many(const Ctx& ctx, const DgcCompactItem* items, int64_t count);

// One tensor of a bucket's index code: `count` indices (int32, or int64 when wide) of a tensor of
// n values.
struct DgcIndexItem {
  const void* idx;
  bool wide;
  int64_t count, n;
};

// dgc_index_scan of every item into out[count] (items with count 0: {0, true}): one segmented
// reduction (a scan by item and a gather), one read-back of all items' results (the op's only host
// synchronization), one table upload.
void dgc_index_scan_many(const Ctx& ctx, const DgcIndexItem* items, int64_t count, DgcIndexScan* out);

// The index code of every item with w[i] bytes per index into code[i] (w = 1, 2: the gap codes
// of dgc_index_write_gaps; w = 4, 8: the indices' own bytes, as dgc_copy_bytes copies them): one
// for_each, one table upload.
void dgc_index_write_many(const Ctx& ctx, const DgcIndexItem* items, const int* w, uint8_t* const* code,
                          int64_t count);

}  // namespace hgc_dev
