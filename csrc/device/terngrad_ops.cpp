// Torch ops of TernGrad's device path (see ops_common.h): the CPU ops' checks and messages,
// outputs on the input's device, the launchers of terngrad_device.cu on the current stream.
// Host round trips: max_abs and sigma read their one double back (the scale is agreed on the
// host); encode and the decodes none.
#include "terngrad_ops.h"

#include "../checks.h"
#include "../cpu/terngrad_cpu.h"
#include "../payload_checks.h"
#include "ops_common.h"
#include "registry.h"
#include "terngrad_device.h"

namespace {

void check_grad(const at::Tensor& grad) {
  hgc::check_device_type(grad, hgc_dev::kDeviceType, "grad");
  HGC_CHECK_CONTIGUOUS(grad);
  HGC_CHECK_FLOATING(grad);
}

}  // namespace

double terngrad_max_abs_device(const at::Tensor& grad) {
  check_grad(grad);
  const hgc_dev::DeviceGuard guard(grad.device());
  return hgc_dev::terngrad_max_abs(hgc_dev::current_ctx(), hgc_dev::dev_dtype(grad.scalar_type()), grad.data_ptr(),
                                   grad.numel());
}

double terngrad_sigma_device(const at::Tensor& grad) {
  check_grad(grad);
  const hgc_dev::DeviceGuard guard(grad.device());
  return hgc_dev::terngrad_sigma(hgc_dev::current_ctx(), hgc_dev::dev_dtype(grad.scalar_type()), grad.data_ptr(),
                                 grad.numel());
}

std::tuple<at::Tensor, at::Tensor> terngrad_encode_device(const at::Tensor& grad, double scale, double clip,
                                                          int64_t key0, int64_t key1) {
  check_grad(grad);
  const int64_t n = grad.numel();
  hgc::check_terngrad_encode_args(n, scale, clip, key0, key1);
  const hgc_dev::DeviceGuard guard(grad.device());
  auto codes = at::empty({(n + 3) / 4}, grad.options().dtype(at::kByte));
  auto scales = at::full({1}, scale, grad.options().dtype(at::kFloat));
  hgc_dev::terngrad_encode(hgc_dev::current_ctx(), hgc_dev::dev_dtype(grad.scalar_type()), grad.data_ptr(), n, scale,
                           clip, static_cast<uint32_t>(key0), static_cast<uint32_t>(key1), codes.data_ptr<uint8_t>());
  return {codes, scales};
}

at::Tensor terngrad_decode_sum_device(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                      at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  const int64_t K = hgc::check_terngrad_decode_args(codes, scales, n, dtype, hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(codes.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, codes.device(), "terngrad_decode");
  if (n == 0) return out;
  hgc_dev::terngrad_decode_sum(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), codes.data_ptr<uint8_t>(),
                               codes.stride(0), scales.data_ptr<float>(), scales.stride(0), K, n, scale,
                               out.data_ptr());
  return out;
}

at::Tensor terngrad_sum_levels_device(const at::Tensor& codes, int64_t n, int64_t width) {
  hgc::check_device_type(codes, hgc_dev::kDeviceType, "codes");
  const int64_t K = hgc::check_terngrad_sum_levels_args(codes, n, width);
  const hgc_dev::DeviceGuard guard(codes.device());
  auto levels = at::empty({(n * width + 7) / 8}, codes.options());
  if (n == 0) return levels;
  hgc_dev::terngrad_sum_levels(hgc_dev::current_ctx(), codes.data_ptr<uint8_t>(), codes.stride(0), K, n,
                               static_cast<int>(width), levels.data_ptr<uint8_t>());
  return levels;
}

at::Tensor terngrad_sum_decode_device(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                                      at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  hgc::check_device_type(levels, hgc_dev::kDeviceType, "levels");
  hgc::check_terngrad_sum_decode_args(levels, n, k, width);
  const hgc_dev::DeviceGuard guard(levels.device());
  const hgc_dev::DType dt = hgc_dev::dev_dtype(dtype);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, levels.device(), "terngrad_sum_decode");
  if (n == 0) return out;
  hgc_dev::terngrad_sum_decode(hgc_dev::current_ctx(), dt, levels.data_ptr<uint8_t>(), n, k, static_cast<int>(width),
                               mult, out.data_ptr());
  return out;
}

#if defined(HGC_TWIN)
namespace hgc_dev {
namespace {
void register_terngrad_ops(pybind11::module& m) {
  m.def("terngrad_max_abs", &terngrad_max_abs_device, HGC_DEV_RELEASE_GIL, "max |grad| (NaN if any)",
        pybind11::arg("grad"));
  m.def("terngrad_sigma", &terngrad_sigma_device, HGC_DEV_RELEASE_GIL,
        "population standard deviation of grad in double, fixed summation order (the clip's sigma)",
        pybind11::arg("grad"));
  m.def("terngrad_encode", &terngrad_encode_device, HGC_DEV_RELEASE_GIL,
        "TernGrad stochastic ternarize + pack -> (codes, scale)", pybind11::arg("grad"), pybind11::arg("scale"),
        pybind11::arg("clip"), pybind11::arg("key0"), pybind11::arg("key1"));
  m.def("terngrad_decode_sum", &terngrad_decode_sum_device, HGC_DEV_RELEASE_GIL,
        "scale * sum of K decoded TernGrad payloads", pybind11::arg("codes"), pybind11::arg("scales"),
        pybind11::arg("n"), pybind11::arg("dtype"), pybind11::arg("scale"), pybind11::arg("out") = pybind11::none());
  m.def("terngrad_sum_levels", &terngrad_sum_levels_device, HGC_DEV_RELEASE_GIL,
        "biased exact sums of K TernGrad payloads as width-bit fields (two-phase owner)", pybind11::arg("codes"),
        pybind11::arg("n"), pybind11::arg("width"));
  m.def("terngrad_sum_decode", &terngrad_sum_decode_device, HGC_DEV_RELEASE_GIL,
        "(field - K) * mult of terngrad_sum_levels' fields", pybind11::arg("levels"), pybind11::arg("n"),
        pybind11::arg("k"), pybind11::arg("width"), pybind11::arg("mult"), pybind11::arg("dtype"),
        pybind11::arg("out") = pybind11::none());
}
const Registrar registrar("terngrad", &register_terngrad_ops);
}  // namespace
}  // namespace hgc_dev
#endif
