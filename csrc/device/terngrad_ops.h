// Torch ops of TernGrad's device path (terngrad_ops.cpp): CUDA tensors in _C (WITH_CUDA), CPU
// tensors in the twin (_C_twin). Same arguments, checks, messages and results as the CPU ops of
// csrc/cpu/terngrad_cpu.h.
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

double terngrad_max_abs_device(const at::Tensor& grad);
double terngrad_sigma_device(const at::Tensor& grad);
std::tuple<at::Tensor, at::Tensor> terngrad_encode_device(const at::Tensor& grad, double scale, double clip,
                                                          int64_t key0, int64_t key1);
at::Tensor terngrad_decode_sum_device(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                      at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out);
at::Tensor terngrad_sum_levels_device(const at::Tensor& codes, int64_t n, int64_t width);
at::Tensor terngrad_sum_decode_device(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                                      at::ScalarType dtype, const c10::optional<at::Tensor>& out);

// A bucket at once (terngrad_device.h's *_many): the per-tensor ops' results, bitwise, in a
// fixed number of device algorithm calls per dtype whatever the tensor count. Every tensor on
// one device, lists of one entry per tensor.

// float64 [2, count] on the gradients' device: row 0 terngrad_max_abs of every gradient, row 1
// its terngrad_sigma when with_sigma (else 0). What a bucket's local scales need, in one tensor
// (one read back for the bucket); no host round trip here.
at::Tensor terngrad_scale_stats_many_device(const std::vector<at::Tensor>& grads, bool with_sigma);
// terngrad_encode of every gradient with its scale, clip and keys; each tensor's codes and scale
// are views into one buffer of codes and one of scales.
using TerngradPayloads = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>>;
TerngradPayloads terngrad_encode_many_device(const std::vector<at::Tensor>& grads, const std::vector<double>& scales,
                                             const std::vector<double>& clips, const std::vector<int64_t>& key0s,
                                             const std::vector<int64_t>& key1s);
// terngrad_decode_sum of every tensor's K stacked payloads (one K for the bucket).
std::vector<at::Tensor> terngrad_decode_sum_many_device(const std::vector<at::Tensor>& codes,
                                                        const std::vector<at::Tensor>& scales,
                                                        const std::vector<int64_t>& n,
                                                        const std::vector<at::ScalarType>& dtypes, double scale,
                                                        const std::vector<c10::optional<at::Tensor>>& outs);
