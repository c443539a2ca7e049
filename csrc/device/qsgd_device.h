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

// ---- a bucket of tensors at once (multi_tensor.cuh) ---------------------------------------------
//
// The *_many launchers compute, for every item, bitwise what the single-tensor launcher above
// computes for it, with the bucket's s, bucket size d, norm and group size shared by all items;
// items may mix dtypes. The number of device algorithm calls depends on the dtypes present,
// never on the item count; items with n == 0 cost nothing (their outputs are the caller's).

// One tensor of a bucket encode: its values and key, and where its payload goes (norms:
// ceil(n/d) floats; packed: the fixed coding's ceil(n w / 8) bytes, unused by Elias; nbits: the
// Elias coding's G = ceil(ceil(n/d) / group_buckets) group bit counts, unused by fixed).
struct QsgdEncodeItem {
  DType dtype;
  const void* x;
  int64_t n;
  uint64_t key;
  float* norms;
  uint8_t* packed;
  int64_t* nbits;
};

// qsgd_encode_fixed of every item: 2 calls per dtype present (norms, codes), one table copy.
void qsgd_encode_fixed_many(const Ctx& ctx, const QsgdEncodeItem* items, int64_t count, int64_t s, int64_t bucket,
                            bool max_norm);

// One tensor of a bucket's fixed-width decode-sum: the arguments of qsgd_decode_fixed (K and
// scale are the bucket's).
struct QsgdFixedDecodeItem {
  DType dtype;
  const float* norms;
  int64_t nstride;
  const uint8_t* packed;
  int64_t pstride, nbytes, n;
  void* out;
};

// qsgd_decode_fixed of every item with the bucket's K and scale: 1 call per dtype present.
void qsgd_decode_fixed_many(const Ctx& ctx, const QsgdFixedDecodeItem* items, int64_t count, int64_t K, int64_t s,
                            int64_t bucket, double scale);

// qsgd_encode_elias of every item (n >= 1 each): norms and nbits, and every item's stream in ONE
// buffer from alloc_stream(the bucket's total bytes, state), item i's stream at bytes
// [stream_at[i], stream_at[i + 1]) (stream_at: count + 1 host values). Calls: 2 per dtype present
// (norms, levels) + 6 (bucket bits, their scan by group, group totals, the scan of group bytes,
// write, compose shared bytes), whatever the count; one device-to-host copy (the group offsets).
void qsgd_encode_elias_many(const Ctx& ctx, const QsgdEncodeItem* items, int64_t count, int64_t s, int64_t bucket,
                            bool max_norm, int64_t group_buckets, ByteAlloc alloc_stream, void* state,
                            int64_t* stream_at);

// One of a tensor's K Elias payloads, as qsgd_decode_elias takes it, its header (the G group bit
// counts, nbits) unchecked: the launcher checks it on the device (see qsgd_decode_elias_sum_many).
struct QsgdEliasPayload {
  const float* norms;
  const int64_t* nbits;
  const uint8_t* stream;
  int64_t stream_bytes;
};

// One tensor of a bucket's Elias decode-sum: its K payloads (host array) and output (n values).
struct QsgdEliasDecodeItem {
  DType dtype;
  int64_t n;
  const QsgdEliasPayload* payloads;
  void* out;
};

// out = T(A(scale) * (((0 + A(decode(p_0))) + A(decode(p_1))) + ...)) of every item's K payloads
// (A = Elem<T>::acc; decode = qsgd_decode_elias's values, in T): the arithmetic of
// Codec.decode_mean_list over the per-tensor decode, in its order. Every payload's group starts
// come from its header on the device (a scan of the groups' byte counts by payload); a payload
// whose header qsgd_elias_group_starts refuses (a count out of [0, stream bits], or bytes that do
// not add up to its stream's) is not read. Returns false when a header is refused or a group of
// any payload is malformed (the caller finds which on the host). Items with n == 0 are skipped
// (their headers are empty: the caller checks their stream sizes). Calls: 2 (header bytes, their
// scan) + 3 per dtype present (zeros, groups, sum) + 1 (any refused), whatever the count; one
// device-to-host copy (the flag), the bucket op's only host synchronization. Scratch: K n values
// of T per item, 3 int64 per group and payload.
bool qsgd_decode_elias_sum_many(const Ctx& ctx, const QsgdEliasDecodeItem* items, int64_t count, int64_t K,
                                int64_t s, int64_t bucket, int64_t group_buckets, double scale);

}  // namespace hgc_dev
