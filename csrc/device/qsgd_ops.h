// Torch ops of QSGD's device path (qsgd_ops.cpp): CUDA tensors in _C (WITH_CUDA), CPU tensors in
// the twin (_C_twin). Same arguments, checks, messages and results as the CPU ops of
// csrc/cpu/qsgd_cpu.h.
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_device(const at::Tensor& x, int64_t s, int64_t bucket,
                                                            bool max_norm, int64_t key);
at::Tensor qsgd_decode_fixed_device(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                    int64_t bucket, at::ScalarType dtype, double scale,
                                    const c10::optional<at::Tensor>& out);
std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_device(const at::Tensor& x, int64_t s,
                                                                        int64_t bucket, bool max_norm, int64_t key,
                                                                        int64_t group_buckets);
at::Tensor qsgd_decode_elias_device(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                    int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                    at::ScalarType dtype, const c10::optional<at::Tensor>& out);

// A bucket at once (see qsgd_device.h's *_many): the per-tensor ops' results, bitwise, in a
// fixed number of device algorithm calls per dtype whatever the tensor count. One s, bucket,
// norm (and group size) for the bucket; one key per tensor; every tensor on one device. Each
// tensor's buffers are views into one buffer per kind.
using QsgdFixedBucket = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>>;
QsgdFixedBucket qsgd_encode_fixed_many_device(const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket,
                                                bool max_norm, const std::vector<int64_t>& keys);
// scale * the sum of each tensor's K stacked payloads (one K for the bucket), as qsgd_decode_fixed.
std::vector<at::Tensor> qsgd_decode_fixed_many_device(const std::vector<at::Tensor>& norms,
                                                      const std::vector<at::Tensor>& packed,
                                                      const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                      const std::vector<at::ScalarType>& dtypes, double scale,
                                                      const std::vector<c10::optional<at::Tensor>>& outs);
// Elias: one read of the bucket's stream sizes; the streams are views into one buffer.
using QsgdEliasBucket = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>>;
QsgdEliasBucket qsgd_encode_elias_many_device(const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket,
                                                bool max_norm, const std::vector<int64_t>& keys,
                                                int64_t group_buckets);
// scale * the sum of each tensor's K decoded Elias payloads (norms[i][k], nbits[i][k],
// streams[i][k]; one K for the bucket) in Codec.decode_mean_list's arithmetic; qsgd_decode_elias'
// checks and messages. Two reads for the bucket: its headers, its malformed flag.
std::vector<at::Tensor> qsgd_decode_elias_many_device(const std::vector<std::vector<at::Tensor>>& norms,
                                                      const std::vector<std::vector<at::Tensor>>& nbits,
                                                      const std::vector<std::vector<at::Tensor>>& streams,
                                                      const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                      int64_t group_buckets, const std::vector<at::ScalarType>& dtypes,
                                                      double scale,
                                                      const std::vector<c10::optional<at::Tensor>>& outs);
