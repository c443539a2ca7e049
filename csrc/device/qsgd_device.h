// QSGD's device launchers (qsgd_device.cu, built by nvcc for CUDA and by g++ for the OpenMP
// twin): plain C++ over raw device pointers. Quantizer, random stream, norms and both wire
// formats are csrc/cpu/qsgd_cpu.h's: the same bytes and values. Arguments are checked by the
// caller (qsgd_ops.cpp).
#pragma once

#include <cstdint>

#include "context.h"

namespace hgc_dev {

// norms[ceil(n/bucket)] and packed[ceil(n w / 8)] (w = 1 + bit_length(s)) of x's n values.
void qsgd_encode_fixed(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t s, int64_t bucket,
                       bool max_norm, uint64_t key, float* norms, uint8_t* packed);

// out (n values of dtype) = scale * sum_k decode(norms row k, packed row k) (K >= 1 payloads;
// K == 1 with scale 1: not scaled), rows at the given strides, nbytes packed bytes per payload.
void qsgd_decode_fixed(const Ctx& ctx, DType dtype, const float* norms, int64_t nstride, const uint8_t* packed,
                       int64_t pstride, int64_t nbytes, int64_t K, int64_t n, int64_t s, int64_t bucket,
                       double scale, void* out);

// The Elias stream's output buffer, allocated by the caller once its size is known.
using ByteAlloc = uint8_t* (*)(int64_t bytes, void* state);

// norms[B] and nbits[G] (B = ceil(n/bucket) >= 1 buckets, G groups of group_buckets) and the
// stream, in memory from alloc_stream(its size in bytes, state) (the size: one small
// device-to-host copy).
void qsgd_encode_elias(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t s, int64_t bucket,
                       bool max_norm, uint64_t key, int64_t group_buckets, float* norms, int64_t* nbits,
                       ByteAlloc alloc_stream, void* state);

// Decodes one Elias payload into out (n >= 1 values of dtype); start: the G + 1 group byte
// offsets (device memory, checked on the host by hgc::qsgd_elias_group_starts). Returns false
// when a group's code is malformed (one small device-to-host copy).
bool qsgd_decode_elias(const Ctx& ctx, DType dtype, const float* norms, const int64_t* nbits, const int64_t* start,
                       const uint8_t* stream, int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                       void* out);

}  // namespace hgc_dev
