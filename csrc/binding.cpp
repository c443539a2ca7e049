// The one binding file of horovod_gradcomp._C: argument checks, dispatch by device.
#include <torch/extension.h>

#include "checks.h"
#include "cpu/gloo_exit.h"
#include "cpu/onebit_cpu.h"
#include "cpu/terngrad_cpu.h"
#include "cpu/qsgd_cpu.h"
#include "cpu/dgc_cpu.h"
#include "cpu/dgc_index_cpu.h"
#include "cpu/dgc_memory_cpu.h"

#ifdef WITH_CUDA
#include "device/dgc_ops.h"  // DGC's device path (csrc/device/dgc_ops.cpp)
#include "device/onebit_ops.h"    // onebit's device path (csrc/device/onebit_ops.cpp)
#include "device/qsgd_ops.h"      // QSGD's device path (csrc/device/qsgd_ops.cpp)
#include "device/terngrad_ops.h"  // TernGrad's device path (csrc/device/terngrad_ops.cpp)
// Device branch of a dispatch function: the CUDA op for CUDA tensors.
#define HGC_ON_CUDA(is_cuda, call) \
  if (is_cuda) return call
#else
// Built without CUDA: CUDA tensors get a clear error (the call is not compiled).
#define HGC_ON_CUDA(is_cuda, call)                                                                    \
  TORCH_CHECK(!(is_cuda), "horovod_gradcomp._C was built without CUDA kernels; got CUDA tensors (rebuild " \
              "with CUDA, see hgc.native_cuda_status(), or use impl='reference')")
#endif  // WITH_CUDA

namespace {

std::tuple<at::Tensor, at::Tensor> onebit_encode(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                 int64_t cols) {
  HGC_ON_CUDA(grad.is_cuda(), onebit_encode_device(grad, residual, cols));
  return onebit_encode_cpu(grad, residual, cols);
}

at::Tensor onebit_decode_sum(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(bits.device() == scales.device(), "onebit_decode: bits and scales are on different devices");
  HGC_ON_CUDA(bits.is_cuda(), onebit_decode_sum_device(bits, scales, n, cols, dtype, scale, out));
  return onebit_decode_sum_cpu(bits, scales, n, cols, dtype, scale, out);
}

std::tuple<at::Tensor, at::Tensor> onebit_encode_columns(const at::Tensor& full,
                                                         const c10::optional<at::Tensor>& residual, int64_t full_cols,
                                                         int64_t col0, int64_t col1) {
  HGC_ON_CUDA(full.is_cuda(), onebit_encode_columns_device(full, residual, full_cols, col0, col1));
  return onebit_encode_columns_cpu(full, residual, full_cols, col0, col1);
}

void onebit_decode_columns(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out, int64_t full_cols,
                           int64_t col0, int64_t col1) {
  HGC_ON_CUDA(out.is_cuda() || bits.is_cuda() || scales.is_cuda(),
              onebit_decode_columns_device(bits, scales, out, full_cols, col0, col1));
  onebit_decode_columns_cpu(bits, scales, out, full_cols, col0, col1);
}

at::Tensor onebit_decode(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                         at::ScalarType dtype, const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, "onebit_decode: expected flat bits and scales");
  return onebit_decode_sum(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out);
}

// ---- dispatch by device (the CPU ops check their own arguments) ----

double terngrad_max_abs(const at::Tensor& grad) {
  HGC_ON_CUDA(grad.is_cuda(), terngrad_max_abs_device(grad));
  return terngrad_max_abs_cpu(grad);
}

double terngrad_sigma(const at::Tensor& grad) {
  HGC_ON_CUDA(grad.is_cuda(), terngrad_sigma_device(grad));
  return terngrad_sigma_cpu(grad);
}

std::tuple<at::Tensor, at::Tensor> terngrad_encode(const at::Tensor& grad, double scale, double clip, int64_t key0,
                                                   int64_t key1) {
  HGC_ON_CUDA(grad.is_cuda(), terngrad_encode_device(grad, scale, clip, key0, key1));
  return terngrad_encode_cpu(grad, scale, clip, key0, key1);
}

at::Tensor terngrad_decode_sum(const at::Tensor& codes, const at::Tensor& scales, int64_t n, at::ScalarType dtype,
                               double scale, const c10::optional<at::Tensor>& out) {
  HGC_ON_CUDA(codes.is_cuda() || scales.is_cuda(), terngrad_decode_sum_device(codes, scales, n, dtype, scale, out));
  return terngrad_decode_sum_cpu(codes, scales, n, dtype, scale, out);
}

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed(const at::Tensor& x, int64_t s, int64_t bucket, bool max_norm,
                                                     int64_t key) {
  HGC_ON_CUDA(x.is_cuda(), qsgd_encode_fixed_device(x, s, bucket, max_norm, key));
  return qsgd_encode_fixed_cpu(x, s, bucket, max_norm, key);
}

at::Tensor qsgd_decode_fixed(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s, int64_t bucket,
                             at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out) {
  HGC_ON_CUDA(norms.is_cuda() || packed.is_cuda(),
              qsgd_decode_fixed_device(norms, packed, n, s, bucket, dtype, scale, out));
  return qsgd_decode_fixed_cpu(norms, packed, n, s, bucket, dtype, scale, out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias(const at::Tensor& x, int64_t s, int64_t bucket,
                                                                 bool max_norm, int64_t key, int64_t group_buckets) {
  HGC_ON_CUDA(x.is_cuda(), qsgd_encode_elias_device(x, s, bucket, max_norm, key, group_buckets));
  return qsgd_encode_elias_cpu(x, s, bucket, max_norm, key, group_buckets);
}

at::Tensor qsgd_decode_elias(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream, int64_t n,
                             int64_t s, int64_t bucket, int64_t group_buckets, at::ScalarType dtype,
                             const c10::optional<at::Tensor>& out) {
  HGC_ON_CUDA(norms.is_cuda() || nbits.is_cuda() || stream.is_cuda(),
              qsgd_decode_elias_device(norms, nbits, stream, n, s, bucket, group_buckets, dtype, out));
  return qsgd_decode_elias_cpu(norms, nbits, stream, n, s, bucket, group_buckets, dtype, out);
}

at::Tensor terngrad_sum_levels(const at::Tensor& codes, int64_t n, int64_t width) {
  HGC_ON_CUDA(codes.is_cuda(), terngrad_sum_levels_device(codes, n, width));
  return terngrad_sum_levels_cpu(codes, n, width);
}

at::Tensor terngrad_sum_decode(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                               at::ScalarType dtype, const c10::optional<at::Tensor>& out) {
  HGC_ON_CUDA(levels.is_cuda(), terngrad_sum_decode_device(levels, n, k, width, mult, dtype, out));
  return terngrad_sum_decode_cpu(levels, n, k, width, mult, dtype, out);
}

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select(const at::Tensor& x, int64_t k, int64_t sample_count,
                                                               int64_t key) {
  HGC_ON_CUDA(x.is_cuda(), dgc_select_device(x, k, sample_count, key));
  return dgc_select_cpu(x, k, sample_count, key);
}

at::Tensor dgc_scatter_sum(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values, int64_t n,
                           at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out) {
  HGC_ON_CUDA(!indices.empty() && indices[0].is_cuda(),
              dgc_scatter_sum_device(indices, values, n, dtype, scale, out));
  return dgc_scatter_sum_cpu(indices, values, n, dtype, scale, out);
}

at::Tensor dgc_index_encode(const at::Tensor& idx, int64_t n) {
  HGC_ON_CUDA(idx.is_cuda(), dgc_index_encode_device(idx, n));
  return dgc_index_encode_cpu(idx, n);
}

at::Tensor dgc_index_decode(const at::Tensor& code, int64_t count, int64_t n) {
  HGC_ON_CUDA(code.is_cuda(), dgc_index_decode_device(code, count, n));
  return dgc_index_decode_cpu(code, count, n);
}

void dgc_accumulate(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov, double coef) {
  if (g.is_cuda()) {
#ifdef WITH_CUDA
    dgc_accumulate_device(u, v, g, momentum, nesterov, coef);
    return;
#else
    TORCH_CHECK(false, "horovod_gradcomp._C was built without CUDA kernels; got CUDA tensors (use impl='reference')");
#endif
  }
  dgc_accumulate_cpu(u, v, g, momentum, nesterov, coef);
}

bool has_cuda() {
#ifdef WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

// Kernels touch only tensors: release the GIL so that a communication thread (or Horovod's
// hooks) can run Python while a kernel works.
#define HGC_RELEASE_GIL py::call_guard<py::gil_scoped_release>()

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod_gradcomp native codec kernels";
  m.def("has_cuda", &has_cuda, "True when built with the CUDA kernels");
  // Holds the GIL: replacing the held object releases the previous one.
  m.def("retain_backward_context", &retain_backward_context,
        "during a backward: keep its stashed context alive (see horovod_gradcomp/ddp/gloo_exit.py)");
  m.def("keep_until_exit", &keep_until_exit, "hold a C++ reference to each tensor until the process ends",
        py::arg("tensors"));
  m.def("onebit_encode", &onebit_encode, HGC_RELEASE_GIL, "1-bit encode with fused error feedback -> (bits, scales)",
        py::arg("grad"), py::arg("residual"), py::arg("cols"));
  m.def("onebit_decode", &onebit_decode, HGC_RELEASE_GIL, "1-bit decode of one payload", py::arg("bits"), py::arg("scales"),
        py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("out") = py::none());
  m.def("onebit_decode_sum", &onebit_decode_sum, HGC_RELEASE_GIL, "scale * sum of K decoded 1-bit payloads", py::arg("bits"),
        py::arg("scales"), py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("scale"),
        py::arg("out") = py::none());
  m.def("onebit_encode_columns", &onebit_encode_columns, HGC_RELEASE_GIL,
        "1-bit encode of the column window [col0, col1) of a [n / full_cols, full_cols] tensor, residual in place",
        py::arg("full"), py::arg("residual"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"));
  m.def("onebit_decode_columns", &onebit_decode_columns, HGC_RELEASE_GIL,
        "decode one 1-bit payload into the column window [col0, col1) of out", py::arg("bits"), py::arg("scales"),
        py::arg("out"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"));
  m.def("terngrad_max_abs", &terngrad_max_abs, HGC_RELEASE_GIL, "max |grad| (NaN if any)", py::arg("grad"));
  m.def("terngrad_sigma", &terngrad_sigma, HGC_RELEASE_GIL,
        "population standard deviation of grad in double, fixed summation order (the clip's sigma)",
        py::arg("grad"));
  m.def("terngrad_encode", &terngrad_encode, HGC_RELEASE_GIL, "TernGrad stochastic ternarize + pack -> (codes, scale)",
        py::arg("grad"), py::arg("scale"), py::arg("clip"), py::arg("key0"), py::arg("key1"));
  m.def("terngrad_decode_sum", &terngrad_decode_sum, HGC_RELEASE_GIL, "scale * sum of K decoded TernGrad payloads",
        py::arg("codes"), py::arg("scales"), py::arg("n"), py::arg("dtype"), py::arg("scale"),
        py::arg("out") = py::none());
  m.def("terngrad_sum_levels", &terngrad_sum_levels, HGC_RELEASE_GIL,
        "biased exact sums of K TernGrad payloads as width-bit fields (two-phase owner)", py::arg("codes"),
        py::arg("n"), py::arg("width"));
  m.def("terngrad_sum_decode", &terngrad_sum_decode, HGC_RELEASE_GIL,
        "(field - K) * mult of terngrad_sum_levels' fields", py::arg("levels"), py::arg("n"), py::arg("k"),
        py::arg("width"), py::arg("mult"), py::arg("dtype"), py::arg("out") = py::none());
  m.def("qsgd_encode_fixed", &qsgd_encode_fixed, HGC_RELEASE_GIL, "QSGD encode, fixed-width coding -> (norms, packed)",
        py::arg("x"), py::arg("s"), py::arg("bucket"), py::arg("max_norm"), py::arg("key"));
  m.def("qsgd_decode_fixed", &qsgd_decode_fixed, HGC_RELEASE_GIL, "scale * sum of K fixed-width QSGD payloads",
        py::arg("norms"), py::arg("packed"), py::arg("n"), py::arg("s"), py::arg("bucket"), py::arg("dtype"),
        py::arg("scale") = 1.0, py::arg("out") = py::none());
  m.def("qsgd_encode_elias", &qsgd_encode_elias, HGC_RELEASE_GIL, "QSGD encode, Elias coding -> (norms, nbits, stream)",
        py::arg("x"), py::arg("s"), py::arg("bucket"), py::arg("max_norm"), py::arg("key"),
        py::arg("group_buckets"));
  m.def("qsgd_decode_elias", &qsgd_decode_elias, HGC_RELEASE_GIL, "QSGD decode of one Elias-coded payload", py::arg("norms"),
        py::arg("nbits"), py::arg("stream"), py::arg("n"), py::arg("s"), py::arg("bucket"),
        py::arg("group_buckets"), py::arg("dtype"), py::arg("out") = py::none());
  m.def("dgc_select", &dgc_select, HGC_RELEASE_GIL, "DGC selection of about k values by magnitude -> (indices, values, "
        "threshold, path)", py::arg("x"), py::arg("k"), py::arg("sample_count"), py::arg("key"));
  m.def("dgc_scatter_sum", &dgc_scatter_sum, HGC_RELEASE_GIL, "scale * sum of K scattered DGC payloads", py::arg("indices"),
        py::arg("values"), py::arg("n"), py::arg("dtype"), py::arg("scale") = 1.0, py::arg("out") = py::none());
  m.def("dgc_index_encode", &dgc_index_encode, HGC_RELEASE_GIL, "ascending DGC indices -> compact uint8 code "
        "(1- or 2-byte gaps, else the indices)", py::arg("indices"), py::arg("n"));
  m.def("dgc_index_decode", &dgc_index_decode, HGC_RELEASE_GIL, "uint8 index code -> the count indices",
        py::arg("code"), py::arg("count"), py::arg("n"));
  m.def("dgc_accumulate_", &dgc_accumulate, HGC_RELEASE_GIL, "DGC momentum correction in place: u = m u + c g; "
        "v += u (nesterov: v += c g + m u)", py::arg("u"), py::arg("v"), py::arg("g"), py::arg("momentum"),
        py::arg("nesterov"), py::arg("coef") = 1.0);
}
