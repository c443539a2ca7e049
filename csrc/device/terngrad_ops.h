// Torch ops of TernGrad's device path (terngrad_ops.cpp): CUDA tensors in _C (WITH_CUDA), CPU
// tensors in the twin (_C_twin). Same arguments, checks, messages and results as the CPU ops of
// csrc/cpu/terngrad_cpu.h.
#pragma once
#include <torch/extension.h>

#include <tuple>

double terngrad_max_abs_device(const at::Tensor& grad);
double terngrad_sigma_device(const at::Tensor& grad);
std::tuple<at::Tensor, at::Tensor> terngrad_encode_device(const at::Tensor& grad, double scale, double clip,
                                                          int64_t key0, int64_t key1);
at::Tensor terngrad_decode_sum_device(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                      at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out);
at::Tensor terngrad_sum_levels_device(const at::Tensor& codes, int64_t n, int64_t width);
at::Tensor terngrad_sum_decode_device(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                                      at::ScalarType dtype, const c10::optional<at::Tensor>& out);
