// Torch ops of QSGD's device path (see ops_common.h): the CPU ops' checks and messages, outputs
// on the input's device, the launchers of qsgd_device.cu on the current stream. Host round
// trips: the Elias encode reads its stream's size back; the Elias decode copies the G group bit
// counts to the host (checked there with the CPU's messages) and reads one malformed flag back.
#include "qsgd_ops.h"

#include <vector>

#include "../checks.h"
#include "../payload_checks.h"
#include "ops_common.h"
#include "qsgd_device.h"
#include "registry.h"

namespace {

void check_input(const at::Tensor& x) {
  hgc::check_device_type(x, hgc_dev::kDeviceType, "x");
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
}

struct StreamOut {
  at::TensorOptions options;
  at::Tensor stream;
};

uint8_t* alloc_stream(int64_t bytes, void* state) {
  auto* so = static_cast<StreamOut*>(state);
  so->stream = at::empty({bytes}, so->options);
  return so->stream.data_ptr<uint8_t>();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_device(const at::Tensor& x, int64_t s, int64_t bucket,
                                                            bool max_norm, int64_t key) {
  check_input(x);
  const int64_t n = x.numel();
  hgc::check_qsgd_params(s, bucket, n);
  const hgc_dev::DeviceGuard guard(x.device());
  const int w = hgc::qsgd_code_width(s);
  auto norms = at::empty({(n + bucket - 1) / bucket}, x.options().dtype(at::kFloat));
  auto packed = at::empty({(n * w + 7) / 8}, x.options().dtype(at::kByte));
  hgc_dev::qsgd_encode_fixed(hgc_dev::current_ctx(), hgc_dev::dev_dtype(x.scalar_type()), x.data_ptr(), n, s, bucket,
                             max_norm, static_cast<uint64_t>(key), norms.data_ptr<float>(),
                             packed.data_ptr<uint8_t>());
  return {norms, packed};
}

at::Tensor qsgd_decode_fixed_device(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                    int64_t bucket, at::ScalarType dtype, double scale,
                                    const c10::optional<at::Tensor>& out_opt) {
  // One payload as flat buffers, or K stacked as [K, length].
  const hgc::QsgdFixedPayloads p =
      hgc::check_qsgd_fixed_decode_args(norms, packed, n, s, bucket, dtype, hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(norms.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  hgc_dev::qsgd_decode_fixed(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), p.norms.data_ptr<float>(),
                             p.norms.stride(0), p.packed.data_ptr<uint8_t>(), p.packed.stride(0), p.nbytes, p.K, n, s,
                             bucket, scale, out.data_ptr());
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_device(const at::Tensor& x, int64_t s,
                                                                        int64_t bucket, bool max_norm, int64_t key,
                                                                        int64_t group_buckets) {
  check_input(x);
  const int64_t n = x.numel();
  hgc::check_qsgd_elias_encode_args(s, bucket, n, group_buckets);
  const hgc_dev::DeviceGuard guard(x.device());
  const int64_t B = (n + bucket - 1) / bucket;
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  const auto opts = x.options();
  auto norms = at::empty({B}, opts.dtype(at::kFloat));
  auto nbits = at::zeros({G}, opts.dtype(at::kLong));
  if (B == 0) return {norms, nbits, at::empty({0}, opts.dtype(at::kByte))};
  StreamOut so{opts.dtype(at::kByte), at::Tensor()};
  hgc_dev::qsgd_encode_elias(hgc_dev::current_ctx(), hgc_dev::dev_dtype(x.scalar_type()), x.data_ptr(), n, s, bucket,
                             max_norm, static_cast<uint64_t>(key), group_buckets, norms.data_ptr<float>(),
                             nbits.data_ptr<int64_t>(), &alloc_stream, &so);
  return {norms, nbits, so.stream};
}

at::Tensor qsgd_decode_elias_device(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                    int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                    at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  const int64_t G = hgc::check_qsgd_elias_decode_args(norms, nbits, stream, n, s, bucket, group_buckets, dtype,
                                                      hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(norms.device());
  // The header decides the stream's layout: its G bit counts are checked on the host (one copy),
  // with the CPU's messages, before anything reads the stream.
  const at::Tensor nb = nbits.contiguous();
  const at::Tensor nb_host = nb.to(at::kCPU);
  const std::vector<int64_t> start = hgc::qsgd_elias_group_starts(nb_host.data_ptr<int64_t>(), G, stream.numel());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  const at::Tensor start_dev =
      at::tensor(at::ArrayRef<int64_t>(start), at::TensorOptions().dtype(at::kLong)).to(norms.device());
  const at::Tensor nr = norms.contiguous(), st = stream.contiguous();
  const bool ok = hgc_dev::qsgd_decode_elias(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), nr.data_ptr<float>(),
                                             nb.data_ptr<int64_t>(), start_dev.data_ptr<int64_t>(),
                                             st.data_ptr<uint8_t>(), n, s, bucket, group_buckets, out.data_ptr());
  TORCH_CHECK(ok, hgc::kQsgdEliasMalformed);
  return out;
}

#if defined(HGC_TWIN)
namespace hgc_dev {
namespace {
void register_qsgd_ops(pybind11::module& m) {
  namespace py = pybind11;
  m.def("qsgd_encode_fixed", &qsgd_encode_fixed_device, HGC_DEV_RELEASE_GIL,
        "QSGD encode, fixed-width coding -> (norms, packed)", py::arg("x"), py::arg("s"), py::arg("bucket"),
        py::arg("max_norm"), py::arg("key"));
  m.def("qsgd_decode_fixed", &qsgd_decode_fixed_device, HGC_DEV_RELEASE_GIL,
        "scale * sum of K fixed-width QSGD payloads", py::arg("norms"), py::arg("packed"), py::arg("n"), py::arg("s"),
        py::arg("bucket"), py::arg("dtype"), py::arg("scale") = 1.0, py::arg("out") = py::none());
  m.def("qsgd_encode_elias", &qsgd_encode_elias_device, HGC_DEV_RELEASE_GIL,
        "QSGD encode, Elias coding -> (norms, nbits, stream)", py::arg("x"), py::arg("s"), py::arg("bucket"),
        py::arg("max_norm"), py::arg("key"), py::arg("group_buckets"));
  m.def("qsgd_decode_elias", &qsgd_decode_elias_device, HGC_DEV_RELEASE_GIL,
        "QSGD decode of one Elias-coded payload", py::arg("norms"), py::arg("nbits"), py::arg("stream"), py::arg("n"),
        py::arg("s"), py::arg("bucket"), py::arg("group_buckets"), py::arg("dtype"), py::arg("out") = py::none());
}
const Registrar registrar("qsgd", &register_qsgd_ops);
}  // namespace
}  // namespace hgc_dev
#endif
