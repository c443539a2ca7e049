// Torch ops of the DGC device path (dgc_ops.cpp): CUDA tensors in _C (WITH_CUDA), CPU tensors in
// the twin (_C_twin). Same arguments, checks, messages and results as the CPU ops of
// csrc/cpu/dgc_cpu.h, dgc_index_cpu.h and dgc_memory_cpu.h.
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select_device(const at::Tensor& x, int64_t k,
                                                                      int64_t sample_count, int64_t key);
at::Tensor dgc_scatter_sum_device(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values,
                                  int64_t n, at::ScalarType dtype, double scale,
                                  const c10::optional<at::Tensor>& out);
at::Tensor dgc_index_encode_device(const at::Tensor& idx, int64_t n);
at::Tensor dgc_index_decode_device(const at::Tensor& code, int64_t count, int64_t n);
void dgc_accumulate_device(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                           double coef);
