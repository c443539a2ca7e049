// DGC codec, CUDA launchers (raw pointers, sizes, a stream; no PyTorch headers). Same
// selection rule, sampling stream, index coding and accumulation order as csrc/cpu/dgc_*.cpp:
// the same threshold, hence the same indices and values, and the same decoded sums.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "dtype_cuda.h"

namespace hgc_cuda {

// The selection threshold of x (n > 0 values, k >= 1), as the CPU's dgc_select computes it:
// with sample_count m > 0 the sampled key t0 (the ceil(k*m/n)-th largest of m sampled |x|
// keys), kept when k/2 <= #{key >= t0} <= 2k, else the exact k-th largest key (at least 1);
// m == 0 or k >= n: exact. Results (host): *t_key (the key: |x|'s bits), *t_value (the
// threshold as a double), *path (0 sampled, 1 refined, 2 exact), *count (#{key >= t}).
// Synchronizes the stream (the sizes are needed on the host).
cudaError_t dgc_threshold(DType dtype, const void* x, int64_t n, int64_t k, int64_t sample_count, uint64_t key,
                          uint64_t* t_key, double* t_value, int64_t* path, int64_t* count, cudaStream_t stream);

// Ascending indices (int32, or int64 when wide) and values of {i : key(x_i) >= t_key}; `count`
// is their number (from dgc_threshold).
cudaError_t dgc_compact(DType dtype, const void* x, int64_t n, uint64_t t_key, bool wide, void* idx, void* vals,
                        int64_t count, cudaStream_t stream);

// Validity of K received payloads' indices (host arrays of K device pointers, counts[r] entries
// each): bad[r] (K device ints, zeroed by the caller) is set when payload r's indices are not
// strictly increasing in [0, n). Launches only (the caller reads the flags back once).
cudaError_t dgc_check_indices(const void* const* idx, bool wide, const int64_t* counts, int64_t K, int64_t n, int* bad,
                              cudaStream_t stream);

// out = scale * sum_r scatter(idx[r], vals[r]) (host arrays of K device pointers, counts[r]
// entries each), accumulated in float (double for kDouble), payloads in order, into `acc`
// (n values of the arithmetic type; may be `out` itself for fp32/fp64). Indices outside
// [0, n) are skipped (never written). With `bad` non-null (K device ints, zeroed by the
// caller) it first runs dgc_check_indices into it; null: the caller checked them already.
cudaError_t dgc_scatter_sum(DType dtype, const void* const* idx, bool wide, const void* const* vals,
                            const int64_t* counts, int64_t K, int64_t n, double scale, void* out, void* acc, int* bad,
                            cudaStream_t stream);

// DGC momentum correction in place (fp32/fp64): h = g*coef (coef != 1), u = u*m + h,
// v = v + u (nesterov: v = (v + h) + m*u), each operation rounded separately.
cudaError_t dgc_accumulate(DType dtype, void* u, void* v, const void* g, int64_t n, double momentum, bool nesterov,
                           double coef, cudaStream_t stream);

// Index code: *top (host) = the largest gap code idx_j - idx_{j-1} - 1 and *ok = strictly
// increasing in [0, n). Synchronizes the stream.
cudaError_t dgc_index_scan(const void* idx, bool wide, int64_t count, int64_t n, int64_t* top, bool* ok,
                           cudaStream_t stream);
// Writes the gap codes (w = 1 or 2 bytes, little-endian) of idx into code[w*count].
cudaError_t dgc_index_write_gaps(const void* idx, bool wide, int64_t count, int w, uint8_t* code,
                                 cudaStream_t stream);
// Inverse for w = 1 or 2: idx = inclusive prefix sums of (gap + 1), minus 1 (int32 results are
// clamped to n, so that a bad code shows as out of range); validity as dgc_index_scan.
// Synchronizes the stream.
cudaError_t dgc_index_read_gaps(const uint8_t* code, int w, int64_t count, int64_t n, bool wide, void* idx, bool* ok,
                                cudaStream_t stream);

}  // namespace hgc_cuda
