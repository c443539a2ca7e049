// QSGD codec, CPU kernels (see horovod_gradcomp/codecs/qsgd.py for the quantizer, the
// random stream and both wire formats; the reference there is the bit-exact oracle).
#pragma once
#include <torch/extension.h>
#include <tuple>
#include <vector>

// x: contiguous float tensor of n values, cut into buckets of `bucket` values (last one
// shorter); s levels; max_norm: scale by max|v| instead of ||v||_2; key: the 64-bit key
// of this call's random stream (two's complement in an int64).
// Returns (norms float32[num_buckets], packed uint8[ceil(n*w/8)]), w = 1 + bit_length(s).
std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_cpu(const at::Tensor& x, int64_t s, int64_t bucket,
                                                         bool max_norm, int64_t key);

// scale * sum_k decode(norms[k], packed[k]) as a flat tensor of n values of `dtype`
// (norms: float32 [K, num_buckets], packed: uint8 [K, ceil(n*w/8)], rows may be strided).
// Written into `out` (contiguous, n values of dtype) when given.
at::Tensor qsgd_decode_fixed_cpu(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                 int64_t bucket, at::ScalarType dtype, double scale,
                                 const c10::optional<at::Tensor>& out);

// Same quantization, Elias coding. Returns (norms float32[num_buckets],
// nbits int64[num_groups], stream uint8[sum_g ceil(nbits[g]/8)]); a group is
// `group_buckets` consecutive buckets and starts on a byte boundary of the stream.
std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_cpu(const at::Tensor& x, int64_t s,
                                                                     int64_t bucket, bool max_norm, int64_t key,
                                                                     int64_t group_buckets);

// Decode of one Elias payload (validates the stream: a malformed one raises).
at::Tensor qsgd_decode_elias_cpu(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                 int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                 at::ScalarType dtype, const c10::optional<at::Tensor>& out);

// ---- the bucket ops (qsgd_many_cpu.cpp) ------------------------------------------------------
// The ops above applied to a bucket's tensors one after the other: the same results as the
// device's bucket ops (csrc/device/qsgd_ops.h). Each checks that every per-tensor list has one
// entry per tensor; s, bucket, max_norm and group_buckets are the bucket's.

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_fixed_many_cpu(
    const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket, bool max_norm, const std::vector<int64_t>& keys);

std::vector<at::Tensor> qsgd_decode_fixed_many_cpu(const std::vector<at::Tensor>& norms,
                                                   const std::vector<at::Tensor>& packed,
                                                   const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                   const std::vector<at::ScalarType>& dtypes, double scale,
                                                   const std::vector<c10::optional<at::Tensor>>& outs);

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_elias_many_cpu(
    const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket, bool max_norm, const std::vector<int64_t>& keys,
    int64_t group_buckets);

// Tensor i's K payloads (norms[i][k], nbits[i][k], streams[i][k]; every tensor the same K >= 1)
// decoded, summed in order into a zero accumulator of float32 (float64 for fp64), times scale,
// cast to dtypes[i]: the arithmetic of Codec.decode_mean_list.
std::vector<at::Tensor> qsgd_decode_elias_many_cpu(const std::vector<std::vector<at::Tensor>>& norms,
                                                   const std::vector<std::vector<at::Tensor>>& nbits,
                                                   const std::vector<std::vector<at::Tensor>>& streams,
                                                   const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                   int64_t group_buckets, const std::vector<at::ScalarType>& dtypes,
                                                   double scale, const std::vector<c10::optional<at::Tensor>>& outs);
