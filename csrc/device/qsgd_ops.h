// Torch ops of QSGD's device path (qsgd_ops.cpp): CUDA tensors in _C (WITH_CUDA), CPU tensors in
// the twin (_C_twin). Same arguments, checks, messages and results as the CPU ops of
// csrc/cpu/qsgd_cpu.h.
#pragma once
#include <torch/extension.h>

#include <tuple>

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
