// CUDA ops of horovod_gradcomp._C: argument checks (as the CPU ops make them), output
// allocation on the input's device, and calls of the kernel launchers of csrc/cuda/*.cu on
// the current CUDA stream. Only the host round trips the results' sizes need synchronize
// (DGC's selection count, the Elias stream length, validity flags of received payloads).
#include "ops_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <limits>

#include "../checks.h"
#include "dgc_cuda.h"
#include "onebit_cuda.h"
#include "qsgd_cuda.h"
#include "terngrad_cuda.h"

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

void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.device() == b.device(), op, ": buffers on different devices (",
              a.device(), ", ", b.device(), ")");
}

void check_float_dtype(at::ScalarType dtype, const char* op) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16, op,
              ": dtype must be fp16, bf16, fp32 or fp64, got ", dtype);
}

int qsgd_width(int64_t s) {
  int b = 0;
  while ((s >> b) != 0) ++b;
  return 1 + b;
}

void qsgd_check_common(int64_t s, int64_t bucket, int64_t n) {
  TORCH_CHECK(s >= 1 && s <= (int64_t(1) << 24) - 1, "qsgd: levels must be in [1, 2^24 - 1], got ", s);
  TORCH_CHECK(bucket >= 1 && bucket < (int64_t(1) << 31), "qsgd: bucket must be in [1, 2^31), got ", bucket);
  TORCH_CHECK(n >= 0, "qsgd: negative size");
}

at::ScalarType index_type(int64_t n) { return n >= (int64_t(1) << 31) ? at::kLong : at::kInt; }

}  // namespace

// ---- onebit ---------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> onebit_encode_cuda(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                      int64_t cols) {
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
                                      bits.data_ptr<uint8_t>(), scales.data_ptr<float>(), ws.data_ptr(), stream()));
  return {bits, scales};
}

at::Tensor onebit_decode_sum_cuda(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                  at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  check_same_device(bits, scales, "onebit_decode");
  check_float_dtype(dtype, "onebit_decode");
  TORCH_CHECK(bits.scalar_type() == at::kByte && scales.scalar_type() == at::kFloat,
              "onebit_decode: bits must be uint8 and scales float32");
  TORCH_CHECK(bits.dim() == 2 && scales.dim() == 2 && bits.size(0) == scales.size(0) &&
                  (bits.size(1) <= 1 || bits.stride(1) == 1) && (scales.size(1) <= 1 || scales.stride(1) == 1),
              "onebit_decode_sum: expected bits [K, nbytes] and scales [K, 2*cols] with contiguous rows");
  TORCH_CHECK(n >= 0 && cols >= 0 && (n == 0 || (cols > 0 && n % cols == 0)), "onebit_decode: ", n,
              " values do not split into columns of ", cols);
  TORCH_CHECK(bits.size(1) >= (n + 7) / 8 && scales.size(1) == 2 * cols, "onebit_decode: payload too small");
  const at::cuda::CUDAGuard guard(bits.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, bits.device(), "onebit_decode");
  if (n == 0) return out;
  HGC_CUDA_OK(hgc_cuda::onebit_decode_sum(cuda_dtype(dtype), bits.data_ptr<uint8_t>(), bits.stride(0),
                                          scales.data_ptr<float>(), scales.stride(0), bits.size(0), n, cols, scale,
                                          out.data_ptr(), stream()));
  return out;
}

// ---- TernGrad -------------------------------------------------------------------------------

double terngrad_max_abs_cuda(const at::Tensor& grad) {
  HGC_CHECK_CONTIGUOUS(grad);
  HGC_CHECK_FLOATING(grad);
  const at::cuda::CUDAGuard guard(grad.device());
  auto cell = at::empty({1}, grad.options().dtype(at::kDouble));
  HGC_CUDA_OK(hgc_cuda::terngrad_max_abs(cuda_dtype(grad.scalar_type()), grad.data_ptr(), grad.numel(),
                                         cell.data_ptr<double>(), stream()));
  return cell.item<double>();  // the shared scale is agreed on the host (MAX over ranks)
}

std::tuple<at::Tensor, at::Tensor> terngrad_encode_cuda(const at::Tensor& grad, double scale, double clip, int64_t key0,
                                                        int64_t key1) {
  HGC_CHECK_CONTIGUOUS(grad);
  HGC_CHECK_FLOATING(grad);
  const int64_t n = grad.numel();
  TORCH_CHECK(n <= (int64_t(1) << 32), "terngrad_encode: at most 2^32 values per tensor, got ", n);
  TORCH_CHECK(!(scale < 0), "terngrad_encode: the scale must be >= 0, got ", scale);
  TORCH_CHECK(!(clip < 0) && !std::isnan(clip), "terngrad_encode: clip must be >= 0 (inf: none), got ", clip);
  TORCH_CHECK(key0 >= 0 && key0 <= 0xFFFFFFFFll && key1 >= 0 && key1 <= 0xFFFFFFFFll,
              "terngrad_encode: keys must be 32-bit unsigned values");
  const at::cuda::CUDAGuard guard(grad.device());
  auto codes = at::empty({(n + 3) / 4}, grad.options().dtype(at::kByte));
  auto scales = at::full({1}, scale, grad.options().dtype(at::kFloat));
  HGC_CUDA_OK(hgc_cuda::terngrad_encode(cuda_dtype(grad.scalar_type()), grad.data_ptr(), n, scale, clip,
                                        static_cast<uint32_t>(key0), static_cast<uint32_t>(key1),
                                        codes.data_ptr<uint8_t>(), stream()));
  return {codes, scales};
}

at::Tensor terngrad_decode_sum_cuda(const at::Tensor& codes, const at::Tensor& scales, int64_t n, at::ScalarType dtype,
                                    double scale, const c10::optional<at::Tensor>& out_opt) {
  check_same_device(codes, scales, "terngrad_decode");
  TORCH_CHECK(codes.scalar_type() == at::kByte, "terngrad_decode: codes must be uint8, got ", codes.scalar_type());
  TORCH_CHECK(scales.scalar_type() == at::kFloat, "terngrad_decode: scales must be float32, got ",
              scales.scalar_type());
  TORCH_CHECK(codes.dim() == 2 && scales.dim() == 2 && codes.size(0) == scales.size(0),
              "terngrad_decode_sum: expected codes [K, nbytes] and scales [K, 1] with the same K");
  TORCH_CHECK(codes.size(1) <= 1 || codes.stride(1) == 1, "terngrad_decode_sum: code rows must be contiguous");
  TORCH_CHECK(n >= 0 && codes.size(1) >= (n + 3) / 4 && scales.size(1) >= 1,
              "terngrad_decode: payload too small for ", n, " values");
  check_float_dtype(dtype, "terngrad_decode");
  const int64_t K = codes.size(0);
  TORCH_CHECK(K >= 1, "terngrad_decode_sum: needs at least one payload");
  const at::cuda::CUDAGuard guard(codes.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, codes.device(), "terngrad_decode");
  if (n == 0) return out;
  HGC_CUDA_OK(hgc_cuda::terngrad_decode_sum(cuda_dtype(dtype), codes.data_ptr<uint8_t>(), codes.stride(0),
                                            scales.data_ptr<float>(), scales.stride(0), K, n, scale, out.data_ptr(),
                                            stream()));
  return out;
}

// ---- QSGD -----------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_cuda(const at::Tensor& x, int64_t s, int64_t bucket, bool max_norm,
                                                          int64_t key) {
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
  const int64_t n = x.numel();
  qsgd_check_common(s, bucket, n);
  const at::cuda::CUDAGuard guard(x.device());
  const int w = qsgd_width(s);
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
  check_same_device(norms, packed, "qsgd_decode");
  qsgd_check_common(s, bucket, n);
  check_float_dtype(dtype, "qsgd_decode");
  TORCH_CHECK(norms.scalar_type() == at::kFloat && packed.scalar_type() == at::kByte,
              "qsgd_decode: norms must be float32 and packed uint8");
  at::Tensor nr = norms.dim() == 1 ? norms.unsqueeze(0) : norms;
  at::Tensor pk = packed.dim() == 1 ? packed.unsqueeze(0) : packed;
  TORCH_CHECK(nr.dim() == 2 && pk.dim() == 2 && nr.size(0) == pk.size(0),
              "qsgd_decode: expected norms [K, buckets] and packed [K, bytes]");
  TORCH_CHECK((nr.size(1) <= 1 || nr.stride(1) == 1) && (pk.size(1) <= 1 || pk.stride(1) == 1),
              "qsgd_decode: rows must be contiguous");
  const int64_t nbytes = (n * qsgd_width(s) + 7) / 8;
  const int64_t B = (n + bucket - 1) / bucket;
  TORCH_CHECK(nr.size(1) == B, "qsgd_decode: expected ", B, " norms, got ", nr.size(1));
  TORCH_CHECK(pk.size(1) == nbytes, "qsgd_decode: expected ", nbytes, " packed bytes, got ", pk.size(1));
  const int64_t K = nr.size(0);
  TORCH_CHECK(K >= 1 || n == 0, "qsgd_decode: no payloads");
  const at::cuda::CUDAGuard guard(norms.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  HGC_CUDA_OK(hgc_cuda::qsgd_decode_fixed(cuda_dtype(dtype), nr.data_ptr<float>(), nr.stride(0),
                                          pk.data_ptr<uint8_t>(), pk.stride(0), K, n, s, bucket, scale,
                                          out.data_ptr(), stream()));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_cuda(const at::Tensor& x, int64_t s, int64_t bucket,
                                                                      bool max_norm, int64_t key,
                                                                      int64_t group_buckets) {
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
  const int64_t n = x.numel();
  qsgd_check_common(s, bucket, n);
  TORCH_CHECK(group_buckets >= 1, "qsgd_encode_elias: group_buckets must be >= 1");
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
  check_same_device(norms, nbits, "qsgd_decode");
  check_same_device(norms, stream_t, "qsgd_decode");
  qsgd_check_common(s, bucket, n);
  check_float_dtype(dtype, "qsgd_decode");
  TORCH_CHECK(group_buckets >= 1, "qsgd_decode: group_buckets must be >= 1");
  TORCH_CHECK(norms.scalar_type() == at::kFloat && nbits.scalar_type() == at::kLong &&
                  stream_t.scalar_type() == at::kByte,
              "qsgd_decode: expected norms float32, nbits int64, stream uint8");
  TORCH_CHECK(norms.dim() == 1 && nbits.dim() == 1 && stream_t.dim() == 1, "qsgd_decode: expected flat buffers");
  const int64_t B = (n + bucket - 1) / bucket;
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  TORCH_CHECK(norms.numel() == B, "qsgd_decode: expected ", B, " norms, got ", norms.numel());
  TORCH_CHECK(nbits.numel() == G, "qsgd_decode: expected ", G, " group bit counts, got ", nbits.numel());
  const at::cuda::CUDAGuard guard(norms.device());
  auto nb = nbits.contiguous();
  // The header decides the stream's layout: checked on the host (G values), as the CPU does.
  auto nb_host = nb.cpu();
  const int64_t* h = nb_host.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t g = 0; g < G; ++g) {
    TORCH_CHECK(h[g] >= 0, "qsgd_decode: negative bit count");
    total += (h[g] + 7) / 8;
  }
  TORCH_CHECK(stream_t.numel() == total, "qsgd_decode: the stream holds ", stream_t.numel(),
              " bytes, the header says ", total);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  auto gbytes = (nb + 7).div(8, "floor");
  auto gstart = (gbytes.cumsum(0) - gbytes).contiguous();
  auto bad = at::zeros({1}, norms.options().dtype(at::kInt));
  auto st = stream_t.contiguous();
  auto nr = norms.contiguous();
  HGC_CUDA_OK(hgc_cuda::qsgd_elias_decode(cuda_dtype(dtype), nr.data_ptr<float>(), nb.data_ptr<int64_t>(),
                                          gstart.data_ptr<int64_t>(), st.data_ptr<uint8_t>(), total, n, s, bucket,
                                          group_buckets, G, out.data_ptr(), bad.data_ptr<int>(), stream()));
  TORCH_CHECK(bad.item<int>() == 0, "qsgd_decode: malformed Elias stream");
  return out;
}

// ---- DGC ------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select_cuda(const at::Tensor& x, int64_t k,
                                                                    int64_t sample_count, int64_t key) {
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
  TORCH_CHECK(k >= 0 && sample_count >= 0, "dgc_select: k and sample_count must be >= 0");
  const int64_t n = x.numel();
  const at::ScalarType ity = index_type(n);
  if (n == 0 || k == 0)
    return {at::empty({0}, x.options().dtype(ity)), at::empty({0}, x.options()),
            std::numeric_limits<double>::infinity(), 2};
  const at::cuda::CUDAGuard guard(x.device());
  const auto dt = cuda_dtype(x.scalar_type());
  uint64_t t_key = 1;
  double t = 0;
  int64_t path = 2, count = 0;
  HGC_CUDA_OK(hgc_cuda::dgc_threshold(dt, x.data_ptr(), n, k, sample_count, static_cast<uint64_t>(key), &t_key, &t,
                                      &path, &count, stream()));
  auto idx = at::empty({count}, x.options().dtype(ity));
  auto vals = at::empty({count}, x.options());
  HGC_CUDA_OK(hgc_cuda::dgc_compact(dt, x.data_ptr(), n, t_key, ity == at::kLong, idx.data_ptr(), vals.data_ptr(),
                                    count, stream()));
  return {idx, vals, t, path};
}

at::Tensor dgc_scatter_sum_cuda(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values, int64_t n,
                                at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  TORCH_CHECK(n >= 0, "dgc_decode: negative size");
  check_float_dtype(dtype, "dgc_decode");
  TORCH_CHECK(indices.size() == values.size(), "dgc_decode: ", indices.size(), " index buffers but ", values.size(),
              " value buffers");
  TORCH_CHECK(!indices.empty(), "dgc_decode: no payloads");
  const at::ScalarType ity = index_type(n);
  const int64_t K = static_cast<int64_t>(indices.size());
  const at::Device dev = indices[0].device();
  std::vector<at::Tensor> ix(K), vx(K);
  std::vector<const void*> ip(K), vp(K);
  std::vector<int64_t> cnt(K);
  for (int64_t r = 0; r < K; ++r) {
    TORCH_CHECK(indices[r].device() == dev && values[r].device() == dev, "dgc_decode: payload ", r,
                ": buffers on different devices");
    TORCH_CHECK(indices[r].dim() == 1 && values[r].dim() == 1 && indices[r].numel() == values[r].numel(),
                "dgc_decode: payload ", r, ": indices and values must be 1-D of the same length");
    TORCH_CHECK(indices[r].scalar_type() == ity, "dgc_decode: payload ", r, ": indices must be ", ity, " for ", n,
                " values, got ", indices[r].scalar_type());
    TORCH_CHECK(values[r].scalar_type() == dtype, "dgc_decode: payload ", r, ": values must be ", dtype, ", got ",
                values[r].scalar_type());
    ix[r] = indices[r].contiguous();
    vx[r] = values[r].contiguous();
    ip[r] = ix[r].data_ptr();
    vp[r] = vx[r].data_ptr();
    cnt[r] = ix[r].numel();
  }
  const at::cuda::CUDAGuard guard(dev);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, dev, "dgc_decode");
  const bool direct = dtype == at::kFloat || dtype == at::kDouble;  // accumulate in `out` itself
  at::Tensor acc = direct ? out : at::empty({n}, out.options().dtype(at::kFloat));
  auto bad = at::zeros({1}, out.options().dtype(at::kInt));
  HGC_CUDA_OK(hgc_cuda::dgc_scatter_sum(cuda_dtype(dtype), ip.data(), ity == at::kLong, vp.data(), cnt.data(), K, n,
                                        scale, out.data_ptr(), acc.data_ptr(), bad.data_ptr<int>(), stream()));
  TORCH_CHECK(bad.item<int>() == 0, "dgc_decode: indices must be strictly increasing and in [0, ", n, ")");
  return out;
}

at::Tensor dgc_index_encode_cuda(const at::Tensor& idx, int64_t n) {
  TORCH_CHECK(n >= 0, "dgc_index_encode: negative size");
  const at::ScalarType ity = index_type(n);
  TORCH_CHECK(idx.dim() == 1 && idx.scalar_type() == ity, "dgc_index_encode: indices must be 1-D ", ity, " for ", n,
              " values, got ", idx.dim(), "-D ", idx.scalar_type());
  const at::cuda::CUDAGuard guard(idx.device());
  const at::Tensor ix = idx.contiguous();
  const int64_t c = ix.numel();
  const auto bytes = ix.options().dtype(at::kByte);
  if (c == 0) return at::empty({0}, bytes);
  int64_t top = 0;
  bool ok = true;
  HGC_CUDA_OK(hgc_cuda::dgc_index_scan(ix.data_ptr(), ity == at::kLong, c, n, &top, &ok, stream()));
  TORCH_CHECK(ok, "dgc_index_encode: indices must be strictly increasing and in [0, ", n, ")");
  const int w = top < 256 ? 1 : top < 65536 ? 2 : 0;
  if (w == 0) return ix.view(at::kByte).clone();  // a gap too wide: the absolute indices
  at::Tensor out = at::empty({c * w}, bytes);
  HGC_CUDA_OK(hgc_cuda::dgc_index_write_gaps(ix.data_ptr(), ity == at::kLong, c, w, out.data_ptr<uint8_t>(), stream()));
  return out;
}

at::Tensor dgc_index_decode_cuda(const at::Tensor& code, int64_t count, int64_t n) {
  TORCH_CHECK(n >= 0 && count >= 0, "dgc_index_decode: negative size");
  TORCH_CHECK(code.dim() == 1 && code.scalar_type() == at::kByte, "dgc_index_decode: the index code must be 1-D "
              "uint8, got ", code.dim(), "-D ", code.scalar_type());
  const at::ScalarType ity = index_type(n);
  const int64_t abs_w = ity == at::kLong ? 8 : 4;
  const int64_t len = code.numel();
  TORCH_CHECK(len == count || len == 2 * count || len == abs_w * count, "dgc_index_decode: ", len,
              " bytes of index code for ", count, " values (1, 2 or ", abs_w, " bytes per index expected)");
  const at::cuda::CUDAGuard guard(code.device());
  if (count == 0) return at::empty({0}, code.options().dtype(ity));
  const at::Tensor cx = code.contiguous();
  const int64_t w = len / count;
  at::Tensor out;
  bool ok = true;
  if (w == abs_w) {
    out = cx.clone().view(ity);
    int64_t top = 0;
    HGC_CUDA_OK(hgc_cuda::dgc_index_scan(out.data_ptr(), ity == at::kLong, count, n, &top, &ok, stream()));
  } else {
    out = at::empty({count}, code.options().dtype(ity));
    HGC_CUDA_OK(hgc_cuda::dgc_index_read_gaps(cx.data_ptr<uint8_t>(), static_cast<int>(w), count, n, ity == at::kLong,
                                              out.data_ptr(), &ok, stream()));
  }
  TORCH_CHECK(ok, "dgc_index_decode: indices must be strictly increasing and in [0, ", n, ")");
  return out;
}

void dgc_accumulate_cuda(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                         double coef) {
  for (const at::Tensor* t : {static_cast<const at::Tensor*>(&u), static_cast<const at::Tensor*>(&v), &g}) {
    HGC_CHECK_CUDA(*t);
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
  const at::cuda::CUDAGuard guard(g.device());
  HGC_CUDA_OK(hgc_cuda::dgc_accumulate(cuda_dtype(g.scalar_type()), u.data_ptr(), v.data_ptr(), g.data_ptr(), g.numel(),
                                       momentum, nesterov, coef, stream()));
}
