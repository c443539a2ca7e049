// Torch ops of the onebit device path (onebit_ops.cpp): the CPU ops' signatures (csrc/cpu/onebit_cpu.h),
// with their argument checks and messages (csrc/checks.h, csrc/payload_checks.h), for tensors on
// hgc_dev::kDeviceType (CUDA in _C, the CPU in the twin _C_twin). onebit_ops.cpp registers them (device/registry.h): in _C as the `hgc` ops'
// CUDA kernels, in the twin under `hgc_twin`.
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

// `scales` (every encode): the scales onebit_scales gave for the same input: the pack alone, the
// same payload and residual (the payload's scales are `scales` itself).
std::tuple<at::Tensor, at::Tensor> onebit_encode_device(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                        int64_t cols,
                                                        const c10::optional<at::Tensor>& scales = c10::nullopt,
                                                        bool by_rows = false);
// The encode's scales alone (its first pass, read-only).
at::Tensor onebit_scales_device(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                                bool by_rows = false);
at::Tensor onebit_decode_sum_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                    at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out,
                                    bool by_rows = false);
at::Tensor onebit_decode_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                at::ScalarType dtype, const c10::optional<at::Tensor>& out, bool by_rows = false);
std::tuple<at::Tensor, at::Tensor> onebit_encode_columns_device(const at::Tensor& full,
                                                                const c10::optional<at::Tensor>& residual,
                                                                int64_t full_cols, int64_t col0, int64_t col1,
                                                                const c10::optional<at::Tensor>& scales = c10::nullopt);
void onebit_decode_columns_device(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                                  int64_t full_cols, int64_t col0, int64_t col1);

// A bucket at once (see onebit_device.h's *_many): the per-tensor ops' results, bitwise, in a
// fixed number of device algorithm calls per dtype whatever the tensor count. Every tensor on
// one device; residuals for all tensors or for none. Each tensor's bits and scales are views
// into one buffer of bits and one of scales. by_rows: each tensor's mode (rows mode: cols[i] counts
// its rows, see onebit_device.h), or None (columns mode for all).
using OnebitPayloads = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>>;
OnebitPayloads onebit_encode_many_device(const std::vector<at::Tensor>& grads,
                                         const c10::optional<std::vector<at::Tensor>>& residuals,
                                         const std::vector<int64_t>& cols,
                                         const c10::optional<std::vector<at::Tensor>>& scales = c10::nullopt,
                                         const c10::optional<std::vector<bool>>& by_rows = c10::nullopt);
// onebit_scales of every tensor: at most 4 device calls per dtype (no pack).
std::vector<at::Tensor> onebit_scales_many_device(const std::vector<at::Tensor>& grads,
                                                  const c10::optional<std::vector<at::Tensor>>& residuals,
                                                  const std::vector<int64_t>& cols,
                                                  const c10::optional<std::vector<bool>>& by_rows = c10::nullopt);
// scale * the sum of each tensor's K stacked payloads (one K for the bucket), as onebit_decode_sum.
std::vector<at::Tensor> onebit_decode_sum_many_device(const std::vector<at::Tensor>& bits,
                                                      const std::vector<at::Tensor>& scales,
                                                      const std::vector<int64_t>& n, const std::vector<int64_t>& cols,
                                                      const std::vector<at::ScalarType>& dtypes, double scale,
                                                      const std::vector<c10::optional<at::Tensor>>& outs,
                                                      const c10::optional<std::vector<bool>>& by_rows = c10::nullopt);
// Column windows of many tensors (see onebit_encode_columns / onebit_decode_columns): each
// window's payload as onebit_encode_columns gives it; decodes written into the windows of `outs`.
OnebitPayloads onebit_encode_columns_many_device(const std::vector<at::Tensor>& fulls,
                                                 const c10::optional<std::vector<at::Tensor>>& residuals,
                                                 const std::vector<int64_t>& full_cols,
                                                 const std::vector<int64_t>& col0, const std::vector<int64_t>& col1,
                                                 const c10::optional<std::vector<at::Tensor>>& scales = c10::nullopt);
void onebit_decode_columns_many_device(const std::vector<at::Tensor>& bits, const std::vector<at::Tensor>& scales,
                                       const std::vector<at::Tensor>& outs, const std::vector<int64_t>& full_cols,
                                       const std::vector<int64_t>& col0, const std::vector<int64_t>& col1);
