// Checks a CPU decoder runs on a received payload before it reads a byte of it.
//
// A payload arrives from another rank: its buffers' dtypes, dims, strides and lengths, its
// header fields and its indices are data, not promises. Every decoder validates them with
// these O(1) helpers (plus, where the format needs it, one cheap pass over a header or the
// indices) and raises a c10::Error (RuntimeError in Python) naming the decoder
// and the problem. Sizes are bounded first so that no later size computation can overflow.
#pragma once
#include <torch/extension.h>

#include <cstdint>

namespace hgc {

// The largest value count (n) and column count a decoder accepts: 2^56 keeps n * 26 bits,
// n + bucket and 2 * cols inside int64 (no tensor on any machine comes close).
constexpr int64_t kMaxDecodeValues = int64_t(1) << 56;

// 0 <= n <= 2^56.
inline void check_decode_count(int64_t n, const char* op, const char* what = "the tensor size") {
  TORCH_CHECK(n >= 0 && n <= kMaxDecodeValues, op, ": ", what, " must be in [0, 2^56], got ", n);
}

// The output dtype of a decoder: fp16, bf16, fp32 or fp64.
inline void check_decode_dtype(at::ScalarType dtype, const char* op) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
                    op, ": the output dtype must be fp16, bf16, fp32 or fp64, got ", dtype);
}

// A buffer read by a CPU decoder: on the CPU and of `dtype`.
inline void check_cpu_buffer(const at::Tensor& t, at::ScalarType dtype, const char* op, const char* what) {
  TORCH_CHECK(t.defined(), op, ": ", what, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", what, " must be a CPU tensor, got one on ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, op, ": ", what, " must be ", dtype, ", got ", t.scalar_type());
}

// K payloads' buffer stacked as [K, len]: a CPU 2-D tensor of `dtype` whose rows are
// contiguous (stride 1 along a row of more than one element) and whose row stride is not
// negative (rows may be strided views into one receive buffer, even overlap).
inline void check_stacked_buffer(const at::Tensor& t, at::ScalarType dtype, const char* op, const char* what) {
  check_cpu_buffer(t, dtype, op, what);
  TORCH_CHECK(t.dim() == 2, op, ": ", what, " must be stacked as [K, length], got ", t.dim(), "-D");
  TORCH_CHECK((t.size(1) <= 1 || t.stride(1) == 1) && t.stride(0) >= 0, op, ": the rows of ", what,
                    " must be contiguous, got strides ", t.strides());
}

// K >= 1 payloads (K of the first stacked buffer) and the same K in the second.
inline int64_t check_same_k(const at::Tensor& a, const at::Tensor& b, const char* op, const char* a_name,
                            const char* b_name) {
  TORCH_CHECK(a.size(0) == b.size(0), op, ": ", a_name, " stacks ", a.size(0), " payloads, ", b_name, " ",
                    b.size(0));
  TORCH_CHECK(a.size(0) >= 1, op, ": needs at least one payload");
  return a.size(0);
}

}  // namespace hgc
