// The CUDA ops of horovod_gradcomp._C (defined in ops_cuda.cpp, built only with CUDA): the
// same signatures and checks as the CPU ops, for tensors on a CUDA device. The binding
// dispatches to them by device.
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

std::tuple<at::Tensor, at::Tensor> onebit_encode_cuda(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                      int64_t cols);
at::Tensor onebit_decode_sum_cuda(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                  at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out);

