// Torch ops of the onebit device path (onebit_ops.cpp): the CPU ops' signatures, checks and
// messages, for tensors on hgc_dev::kDeviceType (CUDA in _C, the CPU in the twin _C_twin).
// csrc/binding.cpp dispatches CUDA tensors to them; the twin registers them under _C's names.
#pragma once
#include <torch/extension.h>

#include <tuple>

std::tuple<at::Tensor, at::Tensor> onebit_encode_device(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                        int64_t cols);
at::Tensor onebit_decode_sum_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                    at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out);
at::Tensor onebit_decode_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                at::ScalarType dtype, const c10::optional<at::Tensor>& out);
std::tuple<at::Tensor, at::Tensor> onebit_encode_columns_device(const at::Tensor& full,
                                                                const c10::optional<at::Tensor>& residual,
                                                                int64_t full_cols, int64_t col0, int64_t col1);
void onebit_decode_columns_device(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                                  int64_t full_cols, int64_t col0, int64_t col1);
