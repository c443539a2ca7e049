// 1-bit codec, CPU kernels (see horovod_gradcomp/codecs/onebit.py for the wire format).
#pragma once
#include <torch/extension.h>
#include <tuple>
#include <vector>

// grad: contiguous float tensor of n values viewed as [n / cols, cols]. When residual is
// given (same dtype, contiguous, n values) it is added first and overwritten with the new
// quantization error. Returns (bits uint8[ceil(n/8)], scales float32[2*cols]). With `scales`
// (onebit_scales_cpu of the same grad and residual) only the second pass runs: the same bits
// and residual, and the returned scales are `scales` itself.
// by_rows (rows mode; every op below that takes it): `cols` counts the ROWS of the [cols, n / cols]
// view, each with its a+ and a- (scales: a+ of every row, then a-; row r's are bitwise those of
// encoding row r alone as a one-column tensor); bits in the same flat order.
std::tuple<at::Tensor, at::Tensor> onebit_encode_cpu(const at::Tensor& grad,
                                                     const c10::optional<at::Tensor>& residual,
                                                     int64_t cols,
                                                     const c10::optional<at::Tensor>& scales = c10::nullopt,
                                                     bool by_rows = false);

// The encode's first pass alone, read-only: the scales float32[2*cols] that onebit_encode_cpu
// would put in the payload (a NaN or Inf in a column of v = g + r makes that column's a+ or a-
// non-finite). Neither grad nor residual is written.
at::Tensor onebit_scales_cpu(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                             bool by_rows = false);

// scale * sum_k decode(bits[k], scales[k]) as a flat tensor of n values of `dtype`.
// bits: uint8 [K, >= ceil(n/8)] (rows may be strided), scales: float32 [K, 2*cols].
// Written into `out` (contiguous, n values of dtype) when given, else into a new tensor.
at::Tensor onebit_decode_sum_cpu(const at::Tensor& bits, const at::Tensor& scales, int64_t n,
                                 int64_t cols, at::ScalarType dtype, double scale,
                                 const c10::optional<at::Tensor>& out, bool by_rows = false);

// One flat payload (bits uint8[>= ceil(n/8)], scales float32[2*cols]): onebit_decode_sum_cpu of
// it alone at scale 1.
at::Tensor onebit_decode_cpu(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, const c10::optional<at::Tensor>& out, bool by_rows = false);

// Column window [col0, col1) of the contiguous tensor `full` viewed as [n / full_cols, full_cols]
// (2 <= col1 - col0): encodes that [rows, col1 - col0] matrix exactly as onebit_encode_cpu
// encodes a contiguous copy of it (same bits, scales and residual), reading and updating
// `full` and the full-size `residual` in place at the window's places.
// `scales`: as in onebit_encode_cpu, the window's scales (the whole matrix's onebit_scales_cpu
// restricted to the window's columns: a+ of [col0, col1), then a-).
std::tuple<at::Tensor, at::Tensor> onebit_encode_columns_cpu(const at::Tensor& full,
                                                             const c10::optional<at::Tensor>& residual,
                                                             int64_t full_cols, int64_t col0, int64_t col1,
                                                             const c10::optional<at::Tensor>& scales = c10::nullopt);

// Decodes one payload of a [rows, col1 - col0] matrix (flat bits and scales) into the column
// window [col0, col1) of `out` (contiguous, viewed as [n / full_cols, full_cols]); the other
// columns are left as they are.
void onebit_decode_columns_cpu(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                               int64_t full_cols, int64_t col0, int64_t col1);

// ---- the bucket ops (onebit_many_cpu.cpp) ----------------------------------------------------
// The ops above applied to a bucket's tensors one after the other: the same results as the
// device's bucket ops (csrc/device/onebit_ops.h). Each checks that every per-tensor list has one
// entry per tensor; `by_rows` (None: columns mode for all) and `given` scales (None: none) are
// optional lists.

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> onebit_encode_many_cpu(
    const std::vector<at::Tensor>& grads, const c10::optional<std::vector<at::Tensor>>& residuals,
    const std::vector<int64_t>& cols, const c10::optional<std::vector<at::Tensor>>& given,
    const c10::optional<std::vector<bool>>& by_rows);

std::vector<at::Tensor> onebit_scales_many_cpu(const std::vector<at::Tensor>& grads,
                                               const c10::optional<std::vector<at::Tensor>>& residuals,
                                               const std::vector<int64_t>& cols,
                                               const c10::optional<std::vector<bool>>& by_rows);

std::vector<at::Tensor> onebit_decode_sum_many_cpu(const std::vector<at::Tensor>& bits,
                                                   const std::vector<at::Tensor>& scales, const std::vector<int64_t>& n,
                                                   const std::vector<int64_t>& cols,
                                                   const std::vector<at::ScalarType>& dtypes, double scale,
                                                   const std::vector<c10::optional<at::Tensor>>& outs,
                                                   const c10::optional<std::vector<bool>>& by_rows);

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> onebit_encode_columns_many_cpu(
    const std::vector<at::Tensor>& fulls, const c10::optional<std::vector<at::Tensor>>& residuals,
    const std::vector<int64_t>& full_cols, const std::vector<int64_t>& col0, const std::vector<int64_t>& col1,
    const c10::optional<std::vector<at::Tensor>>& given);

void onebit_decode_columns_many_cpu(const std::vector<at::Tensor>& bits, const std::vector<at::Tensor>& scales,
                                    const std::vector<at::Tensor>& outs, const std::vector<int64_t>& full_cols,
                                    const std::vector<int64_t>& col0, const std::vector<int64_t>& col1);
