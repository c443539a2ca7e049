// Argument checks shared by the CPU ops (csrc/cpu) and the device ops (csrc/device/*_ops.cpp, for
// CUDA and the OpenMP twin): one home, so that an op checks the same things, in the same words,
// on either device. Device-specific checks take the device type (at::kCPU, at::kCUDA).
// The checks of a received payload, before a decoder reads it, are in payload_checks.h.
#pragma once
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#define HGC_CHECK_CPU(x) TORCH_CHECK(!(x).is_cuda(), #x " must be a CPU tensor")
#define HGC_CHECK_CUDA(x) TORCH_CHECK((x).is_cuda(), #x " must be a CUDA tensor")
#define HGC_CHECK_CONTIGUOUS(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define HGC_CHECK_FLOATING(x)                                                                        \
  TORCH_CHECK((x).scalar_type() == at::kFloat || (x).scalar_type() == at::kDouble ||                \
                  (x).scalar_type() == at::kHalf || (x).scalar_type() == at::kBFloat16,              \
              #x " must be fp16, bf16, fp32 or fp64, got ", (x).scalar_type())

// The output of a decode: `out` when given (checked: on `device`, contiguous, n values of
// `dtype`), else a new tensor on `device`. `op` names the caller in errors.
inline at::Tensor hgc_decode_output(const c10::optional<at::Tensor>& out, int64_t n, at::ScalarType dtype,
                                    const at::Device& device, const char* op) {
  if (out.has_value() && out->defined()) {
    TORCH_CHECK(out->device() == device, op, ": out is on ", out->device(), ", the payload on ", device);
    TORCH_CHECK(out->is_contiguous(), op, ": out must be contiguous");
    TORCH_CHECK(out->scalar_type() == dtype && out->numel() == n, op, ": out must hold ", n, " values of ", dtype,
                ", got ", out->numel(), " of ", out->scalar_type());
    return *out;
  }
  return at::empty({n}, at::TensorOptions().dtype(dtype).device(device));
}

namespace hgc {

// `t` lives on a device of type `device_type`: "<name> must be a CPU tensor" (or CUDA), the
// words of HGC_CHECK_CPU / HGC_CHECK_CUDA.
inline void check_device_type(const at::Tensor& t, at::DeviceType device_type, const char* name) {
  TORCH_CHECK(t.device().type() == device_type, name, " must be a ", c10::DeviceTypeName(device_type), " tensor");
}

// An encoder's input `name`: on a device of `device_type`, contiguous, fp16/bf16/fp32/fp64 (the
// words of HGC_CHECK_CPU, HGC_CHECK_CONTIGUOUS and HGC_CHECK_FLOATING).
inline void check_values_input(const at::Tensor& t, at::DeviceType device_type, const char* name) {
  check_device_type(t, device_type, name);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  const at::ScalarType st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16, name,
              " must be fp16, bf16, fp32 or fp64, got ", st);
}

// ---- the bucket ops' lists ------------------------------------------------------------------

// A bucket op's (`<op>_many`) lists hold one entry per tensor: `count` (the first list's length)
// and every length of `sizes` are equal. `names` names the lists in the message.
inline void check_one_entry_per_tensor(const char* op, const char* names, std::size_t count,
                                       std::initializer_list<std::size_t> sizes) {
  bool equal = true;
  std::string got = std::to_string(count);
  for (const std::size_t size : sizes) {
    equal = equal && size == count;
    got += ", " + std::to_string(size);
  }
  TORCH_CHECK(equal, op, ": ", names, " must have one entry per tensor (got ", got, ")");
}

// Tensor i of a bucket decode holds k payloads, as many as tensor 0 (K; -1 while i is 0): a
// bucket's tensors come from the same K ranks. Returns k.
inline int64_t check_same_payload_count(const char* op, std::size_t i, int64_t k, int64_t K) {
  TORCH_CHECK(K < 0 || k == K, op, ": tensor ", i, " has ", k, " payloads, tensor 0 has ", K,
              " (a bucket's tensors come from the same K ranks)");
  return k;
}

// ---- encode and state ops -------------------------------------------------------------------

// onebit_encode: grad (contiguous, floating) of n = rows * cols values on `device_type`, and the
// optional residual (same device, dtype and size).
// by_rows (rows mode): `cols` counts the rows of the [cols, n / cols] view instead.
inline void check_onebit_encode_args(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                                     at::DeviceType device_type, bool by_rows = false) {
  check_device_type(grad, device_type, "grad");
  HGC_CHECK_CONTIGUOUS(grad);
  HGC_CHECK_FLOATING(grad);
  const int64_t n = grad.numel();
  TORCH_CHECK(cols >= 0 && (n == 0 || (cols > 0 && n % cols == 0)),
              "onebit_encode: ", n, " values do not split into ", by_rows ? "" : "columns of ", cols,
              by_rows ? " rows" : "");
  if (residual.has_value() && residual->defined()) {
    check_device_type(*residual, device_type, "*residual");
    HGC_CHECK_CONTIGUOUS(*residual);
    TORCH_CHECK(residual->device() == grad.device(), "onebit_encode: residual is on ", residual->device(),
                ", gradient on ", grad.device());
    TORCH_CHECK(residual->scalar_type() == grad.scalar_type(), "onebit_encode: residual dtype ",
                residual->scalar_type(), " differs from gradient dtype ", grad.scalar_type());
    TORCH_CHECK(residual->numel() == n, "onebit_encode: residual has ", residual->numel(), " values, gradient ", n);
  }
}

// Tensor i's mode in a bucket op's optional per-tensor `by_rows` list (None: columns mode for all).
inline bool by_rows_at(const c10::optional<std::vector<bool>>& by_rows, std::size_t i) {
  return by_rows.has_value() && (*by_rows)[i];
}

// Scales given to a pack-only encode (onebit_scales' result for this matrix): float32, contiguous,
// 2 * cols values, on the gradient's device.
inline void check_onebit_given_scales(const at::Tensor& scales, const at::Tensor& grad, int64_t cols) {
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == 2 * cols,
              "onebit_encode: the given scales must be a contiguous float32 tensor of 2 * ", cols, " values, got ",
              scales.numel(), " ", scales.scalar_type(), " values (contiguous=", scales.is_contiguous(), ")");
  TORCH_CHECK(scales.device() == grad.device(), "onebit_encode: the given scales are on ", scales.device(),
              ", the gradient on ", grad.device());
}

// A column window [col0, col1) of n values viewed as [n / full_cols, full_cols]: at least two
// columns wide (a one-column matrix has its own contiguous path) and inside the matrix.
inline void check_column_window(int64_t n, int64_t full_cols, int64_t col0, int64_t col1, const char* op) {
  TORCH_CHECK(full_cols > 0 && n % full_cols == 0, op, ": ", n, " values do not split into columns of ", full_cols);
  TORCH_CHECK(0 <= col0 && col0 + 2 <= col1 && col1 <= full_cols, op, ": the column window [", col0, ", ", col1,
              ") must hold at least 2 of the ", full_cols, " columns");
}

// onebit_encode_columns: the window [col0, col1) of `full` (full_cols columns; the encode's
// checks on it and its residual). Returns the window's value count, rows * (col1 - col0).
inline int64_t check_onebit_encode_columns_args(const at::Tensor& full, const c10::optional<at::Tensor>& residual,
                                                int64_t full_cols, int64_t col0, int64_t col1,
                                                at::DeviceType device_type) {
  check_onebit_encode_args(full, residual, full_cols, device_type);
  check_column_window(full.numel(), full_cols, col0, col1, "onebit_encode_columns");
  return full.numel() / full_cols * (col1 - col0);
}

// terngrad_encode: n < 2^32 values, scale >= 0, clip >= 0 (inf: none), two 32-bit keys.
inline void check_terngrad_encode_args(int64_t n, double scale, double clip, int64_t key0, int64_t key1) {
  TORCH_CHECK(n <= (int64_t(1) << 32), "terngrad_encode: at most 2^32 values per tensor, got ", n);
  TORCH_CHECK(!(scale < 0), "terngrad_encode: the scale must be >= 0, got ", scale);
  TORCH_CHECK(!(clip < 0) && !std::isnan(clip), "terngrad_encode: clip must be >= 0 (inf: none), got ", clip);
  TORCH_CHECK(key0 >= 0 && key0 <= 0xFFFFFFFFll && key1 >= 0 && key1 <= 0xFFFFFFFFll,
              "terngrad_encode: keys must be 32-bit unsigned values");
}

// QSGD's parameters: levels s in [1, 2^24 - 1], bucket in [1, 2^31), n >= 0.
constexpr int64_t kQsgdMaxLevels = (int64_t(1) << 24) - 1;
inline void check_qsgd_params(int64_t s, int64_t bucket, int64_t n) {
  TORCH_CHECK(s >= 1 && s <= kQsgdMaxLevels, "qsgd: levels must be in [1, 2^24 - 1], got ", s);
  TORCH_CHECK(bucket >= 1 && bucket < (int64_t(1) << 31), "qsgd: bucket must be in [1, 2^31), got ", bucket);
  TORCH_CHECK(n >= 0, "qsgd: negative size");
}

// qsgd_encode_elias: check_qsgd_params and group_buckets >= 1.
inline void check_qsgd_elias_encode_args(int64_t s, int64_t bucket, int64_t n, int64_t group_buckets) {
  check_qsgd_params(s, bucket, n);
  TORCH_CHECK(group_buckets >= 1, "qsgd_encode_elias: group_buckets must be >= 1");
}

// QSGD's fixed code width for s >= 1 levels: a sign bit + bit_length(s).
inline int qsgd_code_width(int64_t s) { return 1 + (64 - __builtin_clzll(static_cast<uint64_t>(s))); }

// DGC: indices are int32 below 2^31 values, else int64.
inline at::ScalarType dgc_index_type(int64_t n) { return n >= (int64_t(1) << 31) ? at::kLong : at::kInt; }

inline void check_dgc_select_args(int64_t k, int64_t sample_count) {
  TORCH_CHECK(k >= 0 && sample_count >= 0, "dgc_select: k and sample_count must be >= 0");
}

// dgc_index_encode: 1-D indices of dgc_index_type(n) on `device_type`; returns that type.
inline at::ScalarType check_dgc_index_encode_args(const at::Tensor& idx, int64_t n, at::DeviceType device_type) {
  check_device_type(idx, device_type, "idx");
  TORCH_CHECK(n >= 0, "dgc_index_encode: negative size");
  const at::ScalarType ity = dgc_index_type(n);
  TORCH_CHECK(idx.dim() == 1 && idx.scalar_type() == ity, "dgc_index_encode: indices must be 1-D ", ity, " for ", n,
              " values, got ", idx.dim(), "-D ", idx.scalar_type());
  return ity;
}

// dgc_accumulate_: u, v, g contiguous on one device of `device_type`, one floating dtype
// (fp32 / fp64), one shape; momentum in [0, 1).
inline void check_dgc_accumulate_args(const at::Tensor& u, const at::Tensor& v, const at::Tensor& g, double momentum,
                                      at::DeviceType device_type) {
  for (const at::Tensor* t : {&u, &v, &g}) {
    check_device_type(*t, device_type, "*t");
    HGC_CHECK_CONTIGUOUS(*t);
    TORCH_CHECK(t->device() == g.device(), "dgc_accumulate: u, v and g must be on one device");
  }
  TORCH_CHECK(g.scalar_type() == at::kFloat || g.scalar_type() == at::kDouble,
              "dgc_accumulate: gradients must be fp32 or fp64, got ", g.scalar_type());
  TORCH_CHECK(u.scalar_type() == g.scalar_type() && v.scalar_type() == g.scalar_type(),
              "dgc_accumulate: u, v and g must have one dtype, got ", u.scalar_type(), ", ", v.scalar_type(), ", ",
              g.scalar_type());
  TORCH_CHECK(u.sizes() == g.sizes() && v.sizes() == g.sizes(), "dgc_accumulate: u ", u.sizes(), ", v ", v.sizes(),
              " and g ", g.sizes(), " must have one shape");
  TORCH_CHECK(momentum >= 0.0 && momentum < 1.0, "dgc_accumulate: momentum must be in [0, 1), got ", momentum);
}

}  // namespace hgc
