// CUDA ops of horovod_gradcomp._C: argument checks (the CPU ops' own: the shared helpers of
// csrc/checks.h and csrc/payload_checks.h, made before anything is launched), output
// allocation on the input's device, and calls of the kernel launchers of csrc/cuda/*.cu on
// the current CUDA stream. Only the host round trips the results' sizes need synchronize
// (the Elias stream length and header, validity flags of received payloads: Elias codes are
// data, checked on the device, flag read back once). DGC: csrc/device/dgc_ops.cpp.
#include "ops_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <limits>

#include "../checks.h"
#include "../payload_checks.h"
#include "onebit_cuda.h"
#include "qsgd_cuda.h"

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

// ---- QSGD -----------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_cuda(const at::Tensor& x, int64_t s, int64_t bucket, bool max_norm,
                                                          int64_t key) {
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
  const int64_t n = x.numel();
  hgc::check_qsgd_params(s, bucket, n);
  const at::cuda::CUDAGuard guard(x.device());
  const int w = hgc::qsgd_code_width(s);
  auto norms = at::empty({(n + bucket - 1) / bucket}, x.options().dtype(at::kFloat));
  auto packed = at::empty({(n * w + 7) / 8}, x.options().dtype(at::kByte));
  HGC_CUDA_OK(hgc_cuda::qsgd_encode_fixed(cuda_dtype(x.scalar_type()), x.data_ptr(), n, s, bucket, max_norm,
                                          static_cast<uint64_t>(key), norms.data_ptr<float>(),
                                          packed.data_ptr<uint8_t>(), stream()));
  return {norms, packed};
}

at::Tensor qsgd_decode_fixed_cuda(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                  int64_t bucket, at::ScalarType dtype, double scale,
                                  const c10::optional<at::Tensor>& out_opt) {
  // One payload as flat buffers, or K stacked as [K, length].
  const hgc::QsgdFixedPayloads p = hgc::check_qsgd_fixed_decode_args(norms, packed, n, s, bucket, dtype, at::kCUDA);
  const at::cuda::CUDAGuard guard(norms.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  HGC_CUDA_OK(hgc_cuda::qsgd_decode_fixed(cuda_dtype(dtype), p.norms.data_ptr<float>(), p.norms.stride(0),
                                          p.packed.data_ptr<uint8_t>(), p.packed.stride(0), p.K, n, s, bucket, scale,
                                          out.data_ptr(), stream()));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_cuda(const at::Tensor& x, int64_t s, int64_t bucket,
                                                                      bool max_norm, int64_t key,
                                                                      int64_t group_buckets) {
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
  const int64_t n = x.numel();
  hgc::check_qsgd_elias_encode_args(s, bucket, n, group_buckets);
  const at::cuda::CUDAGuard guard(x.device());
  const int64_t B = (n + bucket - 1) / bucket;
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  auto opts = x.options();
  auto norms = at::empty({B}, opts.dtype(at::kFloat));
  if (B == 0) return {norms, at::zeros({G}, opts.dtype(at::kLong)), at::empty({0}, opts.dtype(at::kByte))};
  auto q = at::empty({n}, opts.dtype(at::kInt));
  HGC_CUDA_OK(hgc_cuda::qsgd_levels(cuda_dtype(x.scalar_type()), x.data_ptr(), n, s, bucket, max_norm,
                                    static_cast<uint64_t>(key), norms.data_ptr<float>(), q.data_ptr<int32_t>(),
                                    stream()));
  // Bucket code lengths -> group lengths, group byte offsets, bucket bit offsets (torch scans).
  auto bb = at::zeros({G * group_buckets}, opts.dtype(at::kLong));
  HGC_CUDA_OK(hgc_cuda::qsgd_elias_bucket_bits(q.data_ptr<int32_t>(), n, bucket, bb.data_ptr<int64_t>(), stream()));
  auto grid = bb.view({G, group_buckets});
  auto nbits = grid.sum(1);
  auto gbytes = (nbits + 7).div(8, "floor");
  auto gend = gbytes.cumsum(0);
  auto gstart = gend - gbytes;
  auto within = grid.cumsum(1) - grid;
  auto off = (within + gstart.mul(8).unsqueeze(1)).reshape({-1}).narrow(0, 0, B).contiguous();
  const int64_t total = gend[G - 1].item<int64_t>();  // the stream's size, needed to allocate it
  auto words = at::zeros({(total + 3) / 4 * 4}, opts.dtype(at::kByte));
  HGC_CUDA_OK(hgc_cuda::qsgd_elias_write(q.data_ptr<int32_t>(), n, bucket, off.data_ptr<int64_t>(),
                                         words.data_ptr<uint8_t>(), stream()));
  return {norms, nbits, words.narrow(0, 0, total)};
}

at::Tensor qsgd_decode_elias_cuda(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream_t, int64_t n,
                                  int64_t s, int64_t bucket, int64_t group_buckets, at::ScalarType dtype,
                                  const c10::optional<at::Tensor>& out_opt) {
  const int64_t G =
      hgc::check_qsgd_elias_decode_args(norms, nbits, stream_t, n, s, bucket, group_buckets, dtype, at::kCUDA);
  const at::cuda::CUDAGuard guard(norms.device());
  // The header decides the stream's layout: its G bit counts are checked on the host (one
  // copy), as the CPU checks them, before the offsets are summed from them on the device.
  const at::Tensor nb = nbits.contiguous();
  const at::Tensor nb_host = nb.to(at::kCPU);
  const int64_t total = stream_t.numel();
  hgc::qsgd_elias_group_starts(nb_host.data_ptr<int64_t>(), G, total);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  const at::Tensor gbytes = (nb + 7).div(8, "floor");
  const at::Tensor gstart = (gbytes.cumsum(0) - gbytes).contiguous();
  // The codes themselves are checked while decoding (the kernel stays in bounds whatever they
  // hold): a flag, read back once.
  auto bad = at::zeros({1}, norms.options().dtype(at::kInt));
  auto st = stream_t.contiguous();
  auto nr = norms.contiguous();
  HGC_CUDA_OK(hgc_cuda::qsgd_elias_decode(cuda_dtype(dtype), nr.data_ptr<float>(), nb.data_ptr<int64_t>(),
                                          gstart.data_ptr<int64_t>(), st.data_ptr<uint8_t>(), total, n, s, bucket,
                                          group_buckets, G, out.data_ptr(), bad.data_ptr<int>(), stream()));
  TORCH_CHECK(bad.item<int>() == 0, hgc::kQsgdEliasMalformed);  // one synchronization
  return out;
}
