// The one binding file of horovod_gradcomp._C: argument checks, dispatch by device.
#include <torch/extension.h>

#include "checks.h"
#include "cpu/onebit_cpu.h"
// @terngrad-includes
#include "cpu/terngrad_cpu.h"
// @qsgd-includes
#include "cpu/qsgd_cpu.h"
// @dgc-includes
#include "cpu/dgc_cpu.h"
#include "cpu/dgc_index_cpu.h"
#include "cpu/dgc_memory_cpu.h"

#ifdef WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/onebit_cuda.h"

namespace {

hgc_cuda::DType cuda_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return hgc_cuda::DType::kHalf;
    case at::kBFloat16: return hgc_cuda::DType::kBFloat16;
    case at::kFloat: return hgc_cuda::DType::kFloat;
    case at::kDouble: return hgc_cuda::DType::kDouble;
    default: TORCH_CHECK(false, "horovod_gradcomp: unsupported dtype ", t);
  }
}

#define HGC_CUDA_OK(expr)                                                               \
  do {                                                                                  \
    cudaError_t err__ = (expr);                                                         \
    TORCH_CHECK(err__ == cudaSuccess, #expr " failed: ", cudaGetErrorString(err__));    \
  } while (0)

std::tuple<at::Tensor, at::Tensor> onebit_encode_cuda(const at::Tensor& grad,
                                                      const c10::optional<at::Tensor>& residual, int64_t cols) {
  HGC_CHECK_CONTIGUOUS(grad);
  HGC_CHECK_FLOATING(grad);
  const at::cuda::CUDAGuard guard(grad.device());
  const int64_t n = grad.numel();
  TORCH_CHECK(cols >= 0 && (n == 0 || (cols > 0 && n % cols == 0)),
              "onebit_encode: ", n, " values do not split into columns of ", cols);
  void* res = nullptr;
  if (residual.has_value() && residual->defined()) {
    HGC_CHECK_CUDA(*residual);
    HGC_CHECK_CONTIGUOUS(*residual);
    TORCH_CHECK(residual->scalar_type() == grad.scalar_type() && residual->numel() == n &&
                    residual->device() == grad.device(),
                "onebit_encode: residual must match the gradient's dtype, size and device");
    res = residual->data_ptr();
  }
  auto bits = at::empty({(n + 7) / 8}, grad.options().dtype(at::kByte));
  auto scales = at::zeros({2 * cols}, grad.options().dtype(at::kFloat));
  auto ws = at::empty({static_cast<int64_t>(hgc_cuda::onebit_encode_workspace_bytes(cols))},
                      grad.options().dtype(at::kByte));
  HGC_CUDA_OK(hgc_cuda::onebit_encode(cuda_dtype(grad.scalar_type()), grad.data_ptr(), res, n, cols,
                                      bits.data_ptr<uint8_t>(), scales.data_ptr<float>(), ws.data_ptr(),
                                      at::cuda::getCurrentCUDAStream()));
  return {bits, scales};
}

at::Tensor onebit_decode_sum_cuda(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                  at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  HGC_CHECK_CUDA(scales);
  TORCH_CHECK(bits.scalar_type() == at::kByte && scales.scalar_type() == at::kFloat,
              "onebit_decode: bits must be uint8 and scales float32");
  TORCH_CHECK(bits.dim() == 2 && scales.dim() == 2 && bits.size(0) == scales.size(0) &&
                  bits.stride(1) == 1 && scales.stride(1) == 1,
              "onebit_decode_sum: expected bits [K, nbytes] and scales [K, 2*cols] with contiguous rows");
  TORCH_CHECK(bits.size(1) >= (n + 7) / 8 && scales.size(1) == 2 * cols, "onebit_decode: payload too small");
  const at::cuda::CUDAGuard guard(bits.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, bits.device(), "onebit_decode");
  HGC_CUDA_OK(hgc_cuda::onebit_decode_sum(cuda_dtype(dtype), bits.data_ptr<uint8_t>(), bits.stride(0),
                                          scales.data_ptr<float>(), scales.stride(0), bits.size(0), n, cols,
                                          scale, out.data_ptr(),
                                          at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace
#endif  // WITH_CUDA

namespace {

std::tuple<at::Tensor, at::Tensor> onebit_encode(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                 int64_t cols) {
  if (grad.is_cuda()) {
#ifdef WITH_CUDA
    return onebit_encode_cuda(grad, residual, cols);
#else
    TORCH_CHECK(false, "horovod_gradcomp._C was built without CUDA; got a CUDA gradient (use impl='reference')");
#endif
  }
  return onebit_encode_cpu(grad, residual, cols);
}

at::Tensor onebit_decode_sum(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(bits.device() == scales.device(), "onebit_decode: bits and scales are on different devices");
  if (bits.is_cuda()) {
#ifdef WITH_CUDA
    return onebit_decode_sum_cuda(bits, scales, n, cols, dtype, scale, out);
#else
    TORCH_CHECK(false, "horovod_gradcomp._C was built without CUDA; got CUDA payloads (use impl='reference')");
#endif
  }
  return onebit_decode_sum_cpu(bits, scales, n, cols, dtype, scale, out);
}

at::Tensor onebit_decode(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                         at::ScalarType dtype, const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, "onebit_decode: expected flat bits and scales");
  return onebit_decode_sum(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out);
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
  m.def("onebit_encode", &onebit_encode, HGC_RELEASE_GIL, "1-bit encode with fused error feedback -> (bits, scales)",
        py::arg("grad"), py::arg("residual"), py::arg("cols"));
  m.def("onebit_decode", &onebit_decode, HGC_RELEASE_GIL, "1-bit decode of one payload", py::arg("bits"), py::arg("scales"),
        py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("out") = py::none());
  m.def("onebit_decode_sum", &onebit_decode_sum, HGC_RELEASE_GIL, "scale * sum of K decoded 1-bit payloads", py::arg("bits"),
        py::arg("scales"), py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("scale"),
        py::arg("out") = py::none());
  // @terngrad-defs
  m.def("terngrad_max_abs", &terngrad_max_abs_cpu, HGC_RELEASE_GIL, "max |grad| (NaN if any)", py::arg("grad"));
  m.def("terngrad_encode", &terngrad_encode_cpu, HGC_RELEASE_GIL, "TernGrad stochastic ternarize + pack -> (codes, scale)",
        py::arg("grad"), py::arg("scale"), py::arg("clip"), py::arg("key0"), py::arg("key1"));
  m.def("terngrad_decode_sum", &terngrad_decode_sum_cpu, HGC_RELEASE_GIL, "scale * sum of K decoded TernGrad payloads",
        py::arg("codes"), py::arg("scales"), py::arg("n"), py::arg("dtype"), py::arg("scale"),
        py::arg("out") = py::none());
  // @qsgd-defs
  m.def("qsgd_encode_fixed", &qsgd_encode_fixed_cpu, HGC_RELEASE_GIL, "QSGD encode, fixed-width coding -> (norms, packed)",
        py::arg("x"), py::arg("s"), py::arg("bucket"), py::arg("max_norm"), py::arg("key"));
  m.def("qsgd_decode_fixed", &qsgd_decode_fixed_cpu, HGC_RELEASE_GIL, "scale * sum of K fixed-width QSGD payloads",
        py::arg("norms"), py::arg("packed"), py::arg("n"), py::arg("s"), py::arg("bucket"), py::arg("dtype"),
        py::arg("scale") = 1.0, py::arg("out") = py::none());
  m.def("qsgd_encode_elias", &qsgd_encode_elias_cpu, HGC_RELEASE_GIL, "QSGD encode, Elias coding -> (norms, nbits, stream)",
        py::arg("x"), py::arg("s"), py::arg("bucket"), py::arg("max_norm"), py::arg("key"),
        py::arg("group_buckets"));
  m.def("qsgd_decode_elias", &qsgd_decode_elias_cpu, HGC_RELEASE_GIL, "QSGD decode of one Elias-coded payload", py::arg("norms"),
        py::arg("nbits"), py::arg("stream"), py::arg("n"), py::arg("s"), py::arg("bucket"),
        py::arg("group_buckets"), py::arg("dtype"), py::arg("out") = py::none());
  // @dgc-defs
  m.def("dgc_select", &dgc_select_cpu, HGC_RELEASE_GIL, "DGC selection of about k values by magnitude -> (indices, values, "
        "threshold, path)", py::arg("x"), py::arg("k"), py::arg("sample_count"), py::arg("key"));
  m.def("dgc_scatter_sum", &dgc_scatter_sum_cpu, HGC_RELEASE_GIL, "scale * sum of K scattered DGC payloads", py::arg("indices"),
        py::arg("values"), py::arg("n"), py::arg("dtype"), py::arg("scale") = 1.0, py::arg("out") = py::none());
  m.def("dgc_index_encode", &dgc_index_encode_cpu, HGC_RELEASE_GIL, "ascending DGC indices -> compact uint8 code "
        "(1- or 2-byte gaps, else the indices)", py::arg("indices"), py::arg("n"));
  m.def("dgc_index_decode", &dgc_index_decode_cpu, HGC_RELEASE_GIL, "uint8 index code -> the count indices",
        py::arg("code"), py::arg("count"), py::arg("n"));
  m.def("dgc_accumulate_", &dgc_accumulate_cpu, HGC_RELEASE_GIL, "DGC momentum correction in place: u = m u + c g; "
        "v += u (nesterov: v += c g + m u)", py::arg("u"), py::arg("v"), py::arg("g"), py::arg("momentum"),
        py::arg("nesterov"), py::arg("coef") = 1.0);
}
