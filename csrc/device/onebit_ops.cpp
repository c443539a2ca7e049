// Torch ops of the onebit device path (see ops_common.h and onebit_ops.h): the CPU ops' checks
// (csrc/checks.h, csrc/payload_checks.h) against kDeviceType, outputs on the input's device,
// the launchers of onebit_device.cu on the current stream. No host round trip.
#include "onebit_ops.h"

#include "../checks.h"
#include "../payload_checks.h"
#include "onebit_device.h"
#include "ops_common.h"
#include "registry.h"

namespace {

// Element `offset` of t's storage (a column window's first value).
void* at_element(const at::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * static_cast<int64_t>(t.element_size());
}

// The encode of the n-value matrix of `cols` columns from element `offset` of `src` (and of the
// residual), rows `ld` elements apart (arguments checked by the callers).
std::tuple<at::Tensor, at::Tensor> encode_matrix(const at::Tensor& src, const c10::optional<at::Tensor>& residual,
                                                 int64_t n, int64_t cols, int64_t ld, int64_t offset) {
  const hgc_dev::DeviceGuard guard(src.device());
  const bool has_res = residual.has_value() && residual->defined();
  auto bits = at::empty({(n + 7) / 8}, src.options().dtype(at::kByte));
  const auto sopt = src.options().dtype(at::kFloat);
  auto scales = n == 0 ? at::zeros({2 * cols}, sopt) : at::empty({2 * cols}, sopt);
  hgc_dev::onebit_encode(hgc_dev::current_ctx(), hgc_dev::dev_dtype(src.scalar_type()), at_element(src, offset),
                         has_res ? at_element(*residual, offset) : nullptr, n, cols, ld, bits.data_ptr<uint8_t>(),
                         scales.data_ptr<float>());
  return {bits, scales};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> onebit_encode_device(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                        int64_t cols) {
  hgc::check_onebit_encode_args(grad, residual, cols, hgc_dev::kDeviceType);
  return encode_matrix(grad, residual, grad.numel(), cols, cols, 0);
}

at::Tensor onebit_decode_sum_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                    at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  TORCH_CHECK(bits.device() == scales.device(), "onebit_decode: bits and scales are on different devices");
  const int64_t K = hgc::check_onebit_decode_args(bits, scales, n, cols, dtype, hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(bits.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, bits.device(), "onebit_decode");
  hgc_dev::onebit_decode_sum(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), bits.data_ptr<uint8_t>(),
                             bits.stride(0), scales.data_ptr<float>(), scales.stride(0), K, n, cols, cols, scale,
                             out.data_ptr());
  return out;
}

at::Tensor onebit_decode_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                at::ScalarType dtype, const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, "onebit_decode: expected flat bits and scales");
  return onebit_decode_sum_device(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out);
}

std::tuple<at::Tensor, at::Tensor> onebit_encode_columns_device(const at::Tensor& full,
                                                                const c10::optional<at::Tensor>& residual,
                                                                int64_t full_cols, int64_t col0, int64_t col1) {
  hgc::check_onebit_encode_args(full, residual, full_cols, hgc_dev::kDeviceType);
  hgc::check_column_window(full.numel(), full_cols, col0, col1, "onebit_encode_columns");
  const int64_t rows = full.numel() / full_cols, cols = col1 - col0;
  return encode_matrix(full, residual, rows * cols, cols, full_cols, col0);
}

void onebit_decode_columns_device(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                                  int64_t full_cols, int64_t col0, int64_t col1) {
  constexpr const char* op = "onebit_decode_columns";
  HGC_CHECK_CONTIGUOUS(out);
  TORCH_CHECK(out.device().type() == hgc_dev::kDeviceType, op, ": out must be a ",
              c10::DeviceTypeName(hgc_dev::kDeviceType), " tensor, got ", out.device());
  hgc::check_column_window(out.numel(), full_cols, col0, col1, op);
  const int64_t rows = out.numel() / full_cols, cols = col1 - col0, n = rows * cols;
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, op, ": expected flat bits and scales");
  const auto stacked_bits = bits.unsqueeze(0), stacked_scales = scales.unsqueeze(0);
  hgc::check_onebit_decode_args(stacked_bits, stacked_scales, n, cols, out.scalar_type(), hgc_dev::kDeviceType);
  TORCH_CHECK(bits.device() == out.device(), op, ": out is on ", out.device(), ", the payload on ", bits.device());
  const hgc_dev::DeviceGuard guard(out.device());
  hgc_dev::onebit_decode_sum(hgc_dev::current_ctx(), hgc_dev::dev_dtype(out.scalar_type()),
                             stacked_bits.data_ptr<uint8_t>(), 0, stacked_scales.data_ptr<float>(), 0, 1, n, cols,
                             full_cols, 1.0, at_element(out, col0));
}

#if defined(HGC_TWIN)
namespace hgc_dev {
namespace {
void register_onebit_ops(pybind11::module& m) {
  namespace py = pybind11;
  m.def("onebit_encode", &onebit_encode_device, HGC_DEV_RELEASE_GIL,
        "1-bit encode with fused error feedback -> (bits, scales)", py::arg("grad"), py::arg("residual"),
        py::arg("cols"));
  m.def("onebit_decode", &onebit_decode_device, HGC_DEV_RELEASE_GIL, "1-bit decode of one payload", py::arg("bits"),
        py::arg("scales"), py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("out") = py::none());
  m.def("onebit_decode_sum", &onebit_decode_sum_device, HGC_DEV_RELEASE_GIL,
        "scale * sum of K decoded 1-bit payloads", py::arg("bits"), py::arg("scales"), py::arg("n"), py::arg("cols"),
        py::arg("dtype"), py::arg("scale"), py::arg("out") = py::none());
  m.def("onebit_encode_columns", &onebit_encode_columns_device, HGC_DEV_RELEASE_GIL,
        "1-bit encode of the column window [col0, col1) of a [n / full_cols, full_cols] tensor, residual in place",
        py::arg("full"), py::arg("residual"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"));
  m.def("onebit_decode_columns", &onebit_decode_columns_device, HGC_DEV_RELEASE_GIL,
        "decode one 1-bit payload into the column window [col0, col1) of out", py::arg("bits"), py::arg("scales"),
        py::arg("out"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"));
}
const Registrar registrar("onebit", &register_onebit_ops);
}  // namespace
}  // namespace hgc_dev
#endif
