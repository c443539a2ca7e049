// QSGD codec, CUDA launchers (raw pointers, sizes, a stream; no PyTorch headers). Same
// quantizer, random stream, norms (same summation order) and wire format as
// csrc/cpu/qsgd_cpu.cpp: identical norms and packed codes.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "dtype_cuda.h"

namespace hgc_cuda {

// Fixed-width coding: x (n values) in buckets of d -> norms float32[ceil(n/d)] (l2 in the
// documented 8-lane double order, or max |v|) and packed uint8[ceil(n*w/8)], w = 1 +
// bit_length(s), value i's code (q < 0) | |q| << 1 at bits [i*w, (i+1)*w) LSB first.
cudaError_t qsgd_encode_fixed(DType dtype, const void* x, int64_t n, int64_t s, int64_t d, bool max_norm,
                              uint64_t key, float* norms, uint8_t* packed, cudaStream_t stream);

// out = scale * sum_k decode(norms_k, packed_k) of K payloads (rows at norms + k*nstride,
// packed + k*pstride, each nbytes = ceil(n*w/8) long); the first payload assigns, later ones
// add, in the arithmetic type (float, double for kDouble); scaled unless K == 1 and scale == 1.
cudaError_t qsgd_decode_fixed(DType dtype, const float* norms, int64_t nstride, const uint8_t* packed,
                              int64_t pstride, int64_t K, int64_t n, int64_t s, int64_t d, double scale, void* out,
                              cudaStream_t stream);

// Elias coding, step 1: norms and the signed levels q[n] (int32) of x, same quantizer.
cudaError_t qsgd_levels(DType dtype, const void* x, int64_t n, int64_t s, int64_t d, bool max_norm, uint64_t key,
                        float* norms, int32_t* q, cudaStream_t stream);

// Elias coding, step 2: bucket_bits[B] = the Elias code length of each bucket of q.
cudaError_t qsgd_elias_bucket_bits(const int32_t* q, int64_t n, int64_t d, int64_t* bucket_bits,
                                   cudaStream_t stream);

// Elias coding, step 3: writes each bucket's code at bit offset bucket_off[b] of `stream`
// (zeroed by the caller; bucket_off from the caller's scan of bucket_bits with the groups'
// byte alignment). Buckets writing into a shared byte use atomics, so any schedule gives
// the same stream.
cudaError_t qsgd_elias_write(const int32_t* q, int64_t n, int64_t d, const int64_t* bucket_off, uint8_t* stream,
                             cudaStream_t stream_);

// Elias decode of one payload: group g's code starts at byte gstart[g] and is nbits[g] long.
// Thread per group, as the CPU decoder; *bad (device int, zeroed by the caller) is set to 1
// for a malformed stream.
cudaError_t qsgd_elias_decode(DType dtype, const float* norms, const int64_t* nbits, const int64_t* gstart,
                              const uint8_t* stream, int64_t stream_bytes, int64_t n, int64_t s, int64_t d,
                              int64_t gb, int64_t G, void* out, int* bad, cudaStream_t stream_);

}  // namespace hgc_cuda
