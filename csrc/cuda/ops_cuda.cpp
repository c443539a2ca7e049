// CUDA ops of horovod_gradcomp._C: argument checks (the CPU ops' own: the shared helpers of
// csrc/checks.h and csrc/payload_checks.h, made before anything is launched), output
// allocation on the input's device, and calls of the kernel launchers of csrc/cuda/*.cu on
// the current CUDA stream. TernGrad, QSGD and DGC: csrc/device/<codec>_ops.cpp.
#include "ops_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <limits>

#include "../checks.h"
#include "../payload_checks.h"
#include "onebit_cuda.h"

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

cudaStream_t stream() { return at::cuda::getCurrentCUDAStream(); }

}  // namespace

// ---- onebit ---------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> onebit_encode_cuda(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                      int64_t cols) {
  hgc::check_onebit_encode_args(grad, residual, cols, at::kCUDA);
  const at::cuda::CUDAGuard guard(grad.device());
  const int64_t n = grad.numel();
  void* res = residual.has_value() && residual->defined() ? residual->data_ptr() : nullptr;
  auto bits = at::empty({(n + 7) / 8}, grad.options().dtype(at::kByte));
  auto scales = at::zeros({2 * cols}, grad.options().dtype(at::kFloat));
  auto ws = at::empty({static_cast<int64_t>(hgc_cuda::onebit_encode_workspace_bytes(cols))},
                      grad.options().dtype(at::kByte));
  HGC_CUDA_OK(hgc_cuda::onebit_encode(cuda_dtype(grad.scalar_type()), grad.data_ptr(), res, n, cols,
                                      bits.data_ptr<uint8_t>(), scales.data_ptr<float>(), ws.data_ptr(), stream()));
  return {bits, scales};
}

at::Tensor onebit_decode_sum_cuda(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                  at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  const int64_t K = hgc::check_onebit_decode_args(bits, scales, n, cols, dtype, at::kCUDA);
  const at::cuda::CUDAGuard guard(bits.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, bits.device(), "onebit_decode");
  if (n == 0) return out;
  HGC_CUDA_OK(hgc_cuda::onebit_decode_sum(cuda_dtype(dtype), bits.data_ptr<uint8_t>(), bits.stride(0),
                                          scales.data_ptr<float>(), scales.stride(0), K, n, cols, scale,
                                          out.data_ptr(), stream()));
  return out;
}
