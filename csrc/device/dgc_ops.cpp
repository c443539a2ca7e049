// Torch ops of the DGC device path (see ops_common.h): the CPU ops' checks and messages, outputs
// on the input's device, the launchers of dgc_device.cu on the current stream. Host round trips:
// the selection reads back its scalars (dgc_device.h), a decode-sum its K validity flags at once,
// the index code its validity (and largest gap).
#include "dgc_ops.h"

#include <limits>

#include "../checks.h"
#include "../payload_checks.h"
#include "dgc_device.h"
#include "ops_common.h"
#include "registry.h"

using hgc_dev::kDeviceType;

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select_device(const at::Tensor& x, int64_t k,
                                                                      int64_t sample_count, int64_t key) {
  hgc::check_device_type(x, kDeviceType, "x");
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
  hgc::check_dgc_select_args(k, sample_count);
  const int64_t n = x.numel();
  const at::ScalarType ity = hgc::dgc_index_type(n);
  if (n == 0 || k == 0)
    return {at::empty({0}, x.options().dtype(ity)), at::empty({0}, x.options()),
            std::numeric_limits<double>::infinity(), 2};
  const hgc_dev::DeviceGuard guard(x.device());
  const hgc_dev::Ctx ctx = hgc_dev::current_ctx();
  const hgc_dev::DType dt = hgc_dev::dev_dtype(x.scalar_type());
  const hgc_dev::DgcThreshold t =
      hgc_dev::dgc_threshold(ctx, dt, x.data_ptr(), n, k, sample_count, static_cast<uint64_t>(key));
  auto idx = at::empty({t.count}, x.options().dtype(ity));
  auto vals = at::empty({t.count}, x.options());
  hgc_dev::dgc_compact(ctx, dt, x.data_ptr(), n, t.key, ity == at::kLong, idx.data_ptr(), vals.data_ptr(), t.count);
  return {idx, vals, t.value, t.path};
}

at::Tensor dgc_scatter_sum_device(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values,
                                  int64_t n, at::ScalarType dtype, double scale,
                                  const c10::optional<at::Tensor>& out_opt) {
  const bool wide = hgc::check_dgc_scatter_args(indices, values, n, dtype, kDeviceType) == at::kLong;
  const int64_t K = static_cast<int64_t>(indices.size());
  const at::Device dev = indices[0].device();
  const hgc_dev::DeviceGuard guard(dev);
  const hgc_dev::Ctx ctx = hgc_dev::current_ctx();
  std::vector<at::Tensor> ix(K), vx(K);
  std::vector<const void*> ip(K), vp(K);
  std::vector<int64_t> cnt(K), bad(K);
  for (int64_t r = 0; r < K; ++r) {
    ix[r] = indices[r].contiguous();
    vx[r] = values[r].contiguous();
    ip[r] = ix[r].data_ptr();
    vp[r] = vx[r].data_ptr();
    cnt[r] = ix[r].numel();
  }
  // The indices are data: checked before anything is written (K flags read back at once), so
  // that the error names the first bad payload, as the CPU's does, and `out` stays untouched.
  hgc_dev::dgc_check_indices(ctx, ip.data(), wide, cnt.data(), K, n, bad.data());
  for (int64_t r = 0; r < K; ++r)
    TORCH_CHECK(bad[r] == 0, "dgc_decode: payload ", r, ": indices must be strictly increasing and in [0, ", n, ")");
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, dev, "dgc_decode");
  hgc_dev::dgc_scatter_sum(ctx, hgc_dev::dev_dtype(dtype), ip.data(), wide, vp.data(), cnt.data(), K, n, scale,
                           out.data_ptr());
  return out;
}

at::Tensor dgc_index_encode_device(const at::Tensor& idx, int64_t n) {
  const at::ScalarType ity = hgc::check_dgc_index_encode_args(idx, n, kDeviceType);
  const bool wide = ity == at::kLong;
  const hgc_dev::DeviceGuard guard(idx.device());
  const hgc_dev::Ctx ctx = hgc_dev::current_ctx();
  const at::Tensor ix = idx.contiguous();
  const int64_t c = ix.numel();
  const auto bytes = ix.options().dtype(at::kByte);
  if (c == 0) return at::empty({0}, bytes);
  const hgc_dev::DgcIndexScan s = hgc_dev::dgc_index_scan(ctx, ix.data_ptr(), wide, c, n);
  TORCH_CHECK(s.ok, "dgc_index_encode: indices must be strictly increasing and in [0, ", n, ")");
  const int w = s.top < 256 ? 1 : s.top < 65536 ? 2 : 0;
  if (w == 0) {  // a gap too wide: the absolute indices, as they are
    const int64_t size = ix.element_size();
    at::Tensor out = at::empty({c * size}, bytes);
    hgc_dev::dgc_copy_bytes(ctx, ix.data_ptr(), c * size, out.data_ptr());
    return out;
  }
  at::Tensor out = at::empty({c * w}, bytes);
  hgc_dev::dgc_index_write_gaps(ctx, ix.data_ptr(), wide, c, w, out.data_ptr<uint8_t>());
  return out;
}

at::Tensor dgc_index_decode_device(const at::Tensor& code, int64_t count, int64_t n) {
  const int64_t w = hgc::check_dgc_index_decode_args(code, count, n, kDeviceType);
  const at::ScalarType ity = hgc::dgc_index_type(n);
  const bool wide = ity == at::kLong;
  const hgc_dev::DeviceGuard guard(code.device());
  const hgc_dev::Ctx ctx = hgc_dev::current_ctx();
  at::Tensor out = at::empty({count}, code.options().dtype(ity));
  if (count == 0) return out;
  const at::Tensor cx = code.contiguous();
  bool ok;
  if (w == (wide ? 8 : 4)) {  // the absolute indices: copied bytewise (the code may sit at any offset)
    hgc_dev::dgc_copy_bytes(ctx, cx.data_ptr(), cx.numel(), out.data_ptr());
    ok = hgc_dev::dgc_indices_ok(ctx, out.data_ptr(), wide, count, n);
  } else {
    ok = hgc_dev::dgc_index_read_gaps(ctx, cx.data_ptr<uint8_t>(), static_cast<int>(w), count, n, wide,
                                      out.data_ptr());
  }
  TORCH_CHECK(ok, "dgc_index_decode: indices must be strictly increasing and in [0, ", n, ")");
  return out;
}

void dgc_accumulate_device(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                           double coef) {
  hgc::check_dgc_accumulate_args(u, v, g, momentum, kDeviceType);
  const hgc_dev::DeviceGuard guard(g.device());
  hgc_dev::dgc_accumulate(hgc_dev::current_ctx(), hgc_dev::dev_dtype(g.scalar_type()), u.data_ptr(), v.data_ptr(),
                          g.data_ptr(), g.numel(), momentum, nesterov, coef);
}

#if defined(HGC_TWIN)
namespace hgc_dev {
namespace {
namespace py = pybind11;
// The names and arguments of _C's DGC ops (csrc/binding.cpp).
void register_dgc_ops(py::module& m) {
  m.def("dgc_select", &dgc_select_device, HGC_DEV_RELEASE_GIL,
        "DGC selection of about k values by magnitude -> (indices, values, threshold, path)", py::arg("x"),
        py::arg("k"), py::arg("sample_count"), py::arg("key"));
  m.def("dgc_scatter_sum", &dgc_scatter_sum_device, HGC_DEV_RELEASE_GIL, "scale * sum of K scattered DGC payloads",
        py::arg("indices"), py::arg("values"), py::arg("n"), py::arg("dtype"), py::arg("scale") = 1.0,
        py::arg("out") = py::none());
  m.def("dgc_index_encode", &dgc_index_encode_device, HGC_DEV_RELEASE_GIL,
        "ascending DGC indices -> compact uint8 code (1- or 2-byte gaps, else the indices)", py::arg("indices"),
        py::arg("n"));
  m.def("dgc_index_decode", &dgc_index_decode_device, HGC_DEV_RELEASE_GIL, "uint8 index code -> the count indices",
        py::arg("code"), py::arg("count"), py::arg("n"));
  m.def("dgc_accumulate_", &dgc_accumulate_device, HGC_DEV_RELEASE_GIL,
        "DGC momentum correction in place: u = m u + c g; v += u (nesterov: v += c g + m u)", py::arg("u"),
        py::arg("v"), py::arg("g"), py::arg("momentum"), py::arg("nesterov"), py::arg("coef") = 1.0);
}
const Registrar registrar("dgc", &register_dgc_ops);
}  // namespace
}  // namespace hgc_dev
#endif
