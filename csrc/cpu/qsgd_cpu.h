// QSGD codec, CPU kernels (see horovod_gradcomp/codecs/qsgd.py for the quantizer, the
// random stream and both wire formats; the reference there is the bit-exact oracle).
#pragma once
#include <torch/extension.h>
#include <tuple>

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
