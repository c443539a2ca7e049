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

// onebit's ops take `by_rows` (the bucket ops: one per tensor, or None): rows mode, where `cols`
// counts the rows of the [cols, n / cols] view, each with its a+ and a- (csrc/cpu/onebit_cpu.h).
std::tuple<at::Tensor, at::Tensor> onebit_encode(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                 int64_t cols, const c10::optional<at::Tensor>& scales,
                                                 bool by_rows) {
  HGC_ON_CUDA(grad.is_cuda(), onebit_encode_device(grad, residual, cols, scales, by_rows));
  return onebit_encode_cpu(grad, residual, cols, scales, by_rows);
}

at::Tensor onebit_scales(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                         bool by_rows) {
  HGC_ON_CUDA(grad.is_cuda(), onebit_scales_device(grad, residual, cols, by_rows));
  return onebit_scales_cpu(grad, residual, cols, by_rows);
}

// The given scales of tensor i of an optional list (None: none).
c10::optional<at::Tensor> scales_at(const c10::optional<std::vector<at::Tensor>>& scales, std::size_t i) {
  return scales.has_value() ? c10::optional<at::Tensor>((*scales)[i]) : c10::nullopt;
}

at::Tensor onebit_decode_sum(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out, bool by_rows) {
  TORCH_CHECK(bits.device() == scales.device(), "onebit_decode: bits and scales are on different devices");
  HGC_ON_CUDA(bits.is_cuda(), onebit_decode_sum_device(bits, scales, n, cols, dtype, scale, out, by_rows));
  return onebit_decode_sum_cpu(bits, scales, n, cols, dtype, scale, out, by_rows);
}

std::tuple<at::Tensor, at::Tensor> onebit_encode_columns(const at::Tensor& full,
                                                         const c10::optional<at::Tensor>& residual, int64_t full_cols,
                                                         int64_t col0, int64_t col1,
                                                         const c10::optional<at::Tensor>& scales) {
  HGC_ON_CUDA(full.is_cuda(), onebit_encode_columns_device(full, residual, full_cols, col0, col1, scales));
  return onebit_encode_columns_cpu(full, residual, full_cols, col0, col1, scales);
}

void onebit_decode_columns(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out, int64_t full_cols,
                           int64_t col0, int64_t col1) {
  HGC_ON_CUDA(out.is_cuda() || bits.is_cuda() || scales.is_cuda(),
              onebit_decode_columns_device(bits, scales, out, full_cols, col0, col1));
  onebit_decode_columns_cpu(bits, scales, out, full_cols, col0, col1);
}

// A bucket at once: CUDA tensors in a fixed number of device calls (onebit_ops.h); CPU tensors
// tensor by tensor through the CPU kernels (one host call each, no launches to save).
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> onebit_encode_many(
    const std::vector<at::Tensor>& grads, const c10::optional<std::vector<at::Tensor>>& residuals,
    const std::vector<int64_t>& cols, const c10::optional<std::vector<at::Tensor>>& given,
    const c10::optional<std::vector<bool>>& by_rows) {
  TORCH_CHECK(cols.size() == grads.size() && (!residuals.has_value() || residuals->size() == grads.size()) &&
                  (!given.has_value() || given->size() == grads.size()) &&
                  (!by_rows.has_value() || by_rows->size() == grads.size()),
              "onebit_encode_many: give one column count (and one residual, or None; one scales, or None; one "
              "mode, or None) per gradient");
  HGC_ON_CUDA(!grads.empty() && grads[0].is_cuda(), onebit_encode_many_device(grads, residuals, cols, given, by_rows));
  std::vector<at::Tensor> bits, scales;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    c10::optional<at::Tensor> res;
    if (residuals.has_value()) res = (*residuals)[i];
    auto payload = onebit_encode_cpu(grads[i], res, cols[i], scales_at(given, i), hgc::by_rows_at(by_rows, i));
    bits.push_back(std::get<0>(payload));
    scales.push_back(std::get<1>(payload));
  }
  return {bits, scales};
}

// onebit_scales of a bucket (CUDA: at most 4 device calls per dtype; CPU: tensor by tensor).
std::vector<at::Tensor> onebit_scales_many(const std::vector<at::Tensor>& grads,
                                           const c10::optional<std::vector<at::Tensor>>& residuals,
                                           const std::vector<int64_t>& cols,
                                           const c10::optional<std::vector<bool>>& by_rows) {
  TORCH_CHECK(cols.size() == grads.size() && (!residuals.has_value() || residuals->size() == grads.size()) &&
                  (!by_rows.has_value() || by_rows->size() == grads.size()),
              "onebit_scales_many: give one column count (and one residual, or None; one mode, or None) per gradient");
  HGC_ON_CUDA(!grads.empty() && grads[0].is_cuda(), onebit_scales_many_device(grads, residuals, cols, by_rows));
  std::vector<at::Tensor> scales;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    c10::optional<at::Tensor> res;
    if (residuals.has_value()) res = (*residuals)[i];
    scales.push_back(onebit_scales_cpu(grads[i], res, cols[i], hgc::by_rows_at(by_rows, i)));
  }
  return scales;
}

std::vector<at::Tensor> onebit_decode_sum_many(const std::vector<at::Tensor>& bits, const std::vector<at::Tensor>& scales,
                                               const std::vector<int64_t>& n, const std::vector<int64_t>& cols,
                                               const std::vector<at::ScalarType>& dtypes, double scale,
                                               const std::vector<c10::optional<at::Tensor>>& outs,
                                               const c10::optional<std::vector<bool>>& by_rows) {
  const std::size_t count = bits.size();
  TORCH_CHECK(scales.size() == count && n.size() == count && cols.size() == count && dtypes.size() == count &&
                  outs.size() == count && (!by_rows.has_value() || by_rows->size() == count),
              "onebit_decode_sum_many: bits, scales, n, cols, dtypes, outs (and by_rows, or None) must have one "
              "entry per tensor");
  HGC_ON_CUDA(count > 0 && bits[0].is_cuda(),
              onebit_decode_sum_many_device(bits, scales, n, cols, dtypes, scale, outs, by_rows));
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i) {
    results.push_back(onebit_decode_sum_cpu(bits[i], scales[i], n[i], cols[i], dtypes[i], scale, outs[i],
                                            hgc::by_rows_at(by_rows, i)));
  }
  return results;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> onebit_encode_columns_many(
    const std::vector<at::Tensor>& fulls, const c10::optional<std::vector<at::Tensor>>& residuals,
    const std::vector<int64_t>& full_cols, const std::vector<int64_t>& col0, const std::vector<int64_t>& col1,
    const c10::optional<std::vector<at::Tensor>>& given) {
  TORCH_CHECK(full_cols.size() == fulls.size() && col0.size() == fulls.size() && col1.size() == fulls.size() &&
                  (!residuals.has_value() || residuals->size() == fulls.size()) &&
                  (!given.has_value() || given->size() == fulls.size()),
              "onebit_encode_columns_many: give full_cols, col0, col1 (and a residual, or None; scales, or None) "
              "for every tensor");
  HGC_ON_CUDA(!fulls.empty() && fulls[0].is_cuda(),
              onebit_encode_columns_many_device(fulls, residuals, full_cols, col0, col1, given));
  std::vector<at::Tensor> bits, scales;
  for (std::size_t i = 0; i < fulls.size(); ++i) {
    c10::optional<at::Tensor> res;
    if (residuals.has_value()) res = (*residuals)[i];
    auto payload = onebit_encode_columns_cpu(fulls[i], res, full_cols[i], col0[i], col1[i], scales_at(given, i));
    bits.push_back(std::get<0>(payload));
    scales.push_back(std::get<1>(payload));
  }
  return {bits, scales};
}

void onebit_decode_columns_many(const std::vector<at::Tensor>& bits, const std::vector<at::Tensor>& scales,
                                const std::vector<at::Tensor>& outs, const std::vector<int64_t>& full_cols,
                                const std::vector<int64_t>& col0, const std::vector<int64_t>& col1) {
  const std::size_t count = outs.size();
  TORCH_CHECK(bits.size() == count && scales.size() == count && full_cols.size() == count && col0.size() == count &&
                  col1.size() == count,
              "onebit_decode_columns_many: give bits, scales, full_cols, col0 and col1 for every out");
  if (count > 0 && outs[0].is_cuda()) {
#ifdef WITH_CUDA
    onebit_decode_columns_many_device(bits, scales, outs, full_cols, col0, col1);
    return;
#else
    TORCH_CHECK(false, "horovod_gradcomp._C was built without CUDA kernels; got CUDA tensors (use impl='reference')");
#endif
  }
  for (std::size_t i = 0; i < count; ++i) onebit_decode_columns_cpu(bits[i], scales[i], outs[i], full_cols[i], col0[i], col1[i]);
}

at::Tensor onebit_decode(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                         at::ScalarType dtype, const c10::optional<at::Tensor>& out, bool by_rows) {
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, "onebit_decode: expected flat bits and scales");
  return onebit_decode_sum(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out, by_rows);
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

// QSGD's bucket ops: CUDA tensors in a fixed number of device calls (qsgd_ops.h); CPU tensors
// tensor by tensor through the CPU kernels, with the same results.
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_fixed_many(const std::vector<at::Tensor>& xs,
                                                                                    int64_t s, int64_t bucket,
                                                                                    bool max_norm,
                                                                                    const std::vector<int64_t>& keys) {
  TORCH_CHECK(keys.size() == xs.size(), "qsgd_encode_fixed_many: ", xs.size(), " tensors but ", keys.size(), " keys");
  HGC_ON_CUDA(!xs.empty() && xs[0].is_cuda(), qsgd_encode_fixed_many_device(xs, s, bucket, max_norm, keys));
  std::vector<at::Tensor> norms, packed;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto payload = qsgd_encode_fixed_cpu(xs[i], s, bucket, max_norm, keys[i]);
    norms.push_back(std::get<0>(payload));
    packed.push_back(std::get<1>(payload));
  }
  return {norms, packed};
}

std::vector<at::Tensor> qsgd_decode_fixed_many(const std::vector<at::Tensor>& norms,
                                               const std::vector<at::Tensor>& packed, const std::vector<int64_t>& n,
                                               int64_t s, int64_t bucket,
                                               const std::vector<at::ScalarType>& dtypes, double scale,
                                               const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = norms.size();
  TORCH_CHECK(packed.size() == count && n.size() == count && dtypes.size() == count && outs.size() == count,
              "qsgd_decode_fixed_many: norms, packed, n, dtypes and outs must have one entry per tensor");
  HGC_ON_CUDA(count > 0 && norms[0].is_cuda(),
              qsgd_decode_fixed_many_device(norms, packed, n, s, bucket, dtypes, scale, outs));
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i) {
    results.push_back(qsgd_decode_fixed_cpu(norms[i], packed[i], n[i], s, bucket, dtypes[i], scale, outs[i]));
  }
  return results;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_elias_many(
    const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket, bool max_norm, const std::vector<int64_t>& keys,
    int64_t group_buckets) {
  TORCH_CHECK(keys.size() == xs.size(), "qsgd_encode_elias_many: ", xs.size(), " tensors but ", keys.size(), " keys");
  HGC_ON_CUDA(!xs.empty() && xs[0].is_cuda(),
              qsgd_encode_elias_many_device(xs, s, bucket, max_norm, keys, group_buckets));
  std::vector<at::Tensor> norms, nbits, streams;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto payload = qsgd_encode_elias_cpu(xs[i], s, bucket, max_norm, keys[i], group_buckets);
    norms.push_back(std::get<0>(payload));
    nbits.push_back(std::get<1>(payload));
    streams.push_back(std::get<2>(payload));
  }
  return {norms, nbits, streams};
}

// The CPU loop of qsgd_decode_elias_many: Codec.decode_mean_list's arithmetic (a zero accumulator
// of float32, float64 for fp64, plus each decoded payload in order, times scale, cast).
std::vector<at::Tensor> qsgd_decode_elias_many(const std::vector<std::vector<at::Tensor>>& norms,
                                               const std::vector<std::vector<at::Tensor>>& nbits,
                                               const std::vector<std::vector<at::Tensor>>& streams,
                                               const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                               int64_t group_buckets, const std::vector<at::ScalarType>& dtypes,
                                               double scale, const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = norms.size();
  TORCH_CHECK(nbits.size() == count && streams.size() == count && n.size() == count && dtypes.size() == count &&
                  outs.size() == count,
              "qsgd_decode_elias_many: norms, nbits, streams, n, dtypes and outs must have one entry per tensor");
  HGC_ON_CUDA(count > 0 && !norms[0].empty() && norms[0][0].is_cuda(),
              qsgd_decode_elias_many_device(norms, nbits, streams, n, s, bucket, group_buckets, dtypes, scale, outs));
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t K = norms[i].size();
    TORCH_CHECK(K >= 1 && nbits[i].size() == K && streams[i].size() == K && (i == 0 || K == norms[0].size()),
                "qsgd_decode_elias_many: tensor ", i, " needs one norms, nbits and stream per payload, as many "
                "payloads as tensor 0");
    at::Tensor acc = at::zeros({n[i]}, at::TensorOptions().dtype(dtypes[i] == at::kDouble ? at::kDouble : at::kFloat));
    for (std::size_t k = 0; k < K; ++k) {
      acc.add_(qsgd_decode_elias_cpu(norms[i][k], nbits[i][k], streams[i][k], n[i], s, bucket, group_buckets,
                                     dtypes[i], c10::nullopt));
    }
    const at::Tensor mean = acc.mul_(scale).to(dtypes[i]);
    results.push_back(outs[i].has_value() && outs[i]->defined()
                          ? hgc_decode_output(outs[i], n[i], dtypes[i], at::kCPU, "qsgd_decode").copy_(mean)
                          : mean);
  }
  return results;
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

// A TernGrad bucket at once: CUDA tensors in a fixed number of device calls (terngrad_ops.h); CPU
// tensors tensor by tensor through the CPU kernels (one host call each, no launches to save).
at::Tensor terngrad_scale_stats_many(const std::vector<at::Tensor>& grads, bool with_sigma) {
  HGC_ON_CUDA(!grads.empty() && grads[0].is_cuda(), terngrad_scale_stats_many_device(grads, with_sigma));
  const int64_t count = static_cast<int64_t>(grads.size());
  at::Tensor stats = at::zeros({2, count}, at::kDouble);
  auto acc = stats.accessor<double, 2>();
  for (int64_t i = 0; i < count; ++i) {
    acc[0][i] = terngrad_max_abs_cpu(grads[i]);
    if (with_sigma) acc[1][i] = terngrad_sigma_cpu(grads[i]);
  }
  return stats;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> terngrad_encode_many(
    const std::vector<at::Tensor>& grads, const std::vector<double>& scales, const std::vector<double>& clips,
    const std::vector<int64_t>& key0s, const std::vector<int64_t>& key1s) {
  const std::size_t count = grads.size();
  TORCH_CHECK(scales.size() == count && clips.size() == count && key0s.size() == count && key1s.size() == count,
              "terngrad_encode_many: give a scale, a clip, a key0 and a key1 per gradient");
  HGC_ON_CUDA(count > 0 && grads[0].is_cuda(), terngrad_encode_many_device(grads, scales, clips, key0s, key1s));
  std::vector<at::Tensor> codes, scale_bufs;
  for (std::size_t i = 0; i < count; ++i) {
    auto payload = terngrad_encode_cpu(grads[i], scales[i], clips[i], key0s[i], key1s[i]);
    codes.push_back(std::get<0>(payload));
    scale_bufs.push_back(std::get<1>(payload));
  }
  return {codes, scale_bufs};
}

std::vector<at::Tensor> terngrad_decode_sum_many(const std::vector<at::Tensor>& codes,
                                                 const std::vector<at::Tensor>& scales, const std::vector<int64_t>& n,
                                                 const std::vector<at::ScalarType>& dtypes, double scale,
                                                 const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = codes.size();
  TORCH_CHECK(scales.size() == count && n.size() == count && dtypes.size() == count && outs.size() == count,
              "terngrad_decode_sum_many: codes, scales, n, dtypes and outs must have one entry per tensor");
  HGC_ON_CUDA(count > 0 && codes[0].is_cuda(), terngrad_decode_sum_many_device(codes, scales, n, dtypes, scale, outs));
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i) {
    results.push_back(terngrad_decode_sum_cpu(codes[i], scales[i], n[i], dtypes[i], scale, outs[i]));
  }
  return results;
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

// A bucket of DGC tensors (csrc/device/dgc_ops.h): CUDA -> the bucket ops (a fixed number of device
// calls); CPU -> the CPU kernels tensor by tensor (the same results).
using DgcPayloadLists = std::vector<std::vector<at::Tensor>>;
using DgcSelection =
    std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<double>, std::vector<int64_t>>;

void check_dgc_sum_lists(const char* op, const DgcPayloadLists& indices, const DgcPayloadLists& values,
                         const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                         const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = indices.size();
  TORCH_CHECK(values.size() == count && n.size() == count && dtypes.size() == count && outs.size() == count, op,
              ": indices, values, n, dtypes and outs must have one entry per tensor");
  for (std::size_t t = 0; t < count; ++t)
    TORCH_CHECK(indices[t].size() == indices[0].size(), op, ": tensor ", t, " has ", indices[t].size(),
                " payloads, tensor 0 has ", indices[0].size(), " (a bucket's tensors come from the same K ranks)");
}

bool dgc_bucket_is_cuda(const DgcPayloadLists& buffers) {
  return !buffers.empty() && !buffers[0].empty() && buffers[0][0].is_cuda();
}

std::vector<at::Tensor> dgc_scatter_sum_many(const DgcPayloadLists& indices, const DgcPayloadLists& values,
                                             const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                                             double scale, const std::vector<c10::optional<at::Tensor>>& outs) {
  check_dgc_sum_lists("dgc_scatter_sum_many", indices, values, n, dtypes, outs);
  HGC_ON_CUDA(dgc_bucket_is_cuda(indices), dgc_scatter_sum_many_device(indices, values, n, dtypes, scale, outs));
  std::vector<at::Tensor> results;
  for (std::size_t t = 0; t < indices.size(); ++t)
    results.push_back(dgc_scatter_sum_cpu(indices[t], values[t], n[t], dtypes[t], scale, outs[t]));
  return results;
}

std::vector<at::Tensor> dgc_decode_sum_many(const DgcPayloadLists& codes, const DgcPayloadLists& values,
                                            const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                                            double scale, const std::vector<c10::optional<at::Tensor>>& outs) {
  check_dgc_sum_lists("dgc_decode_sum_many", codes, values, n, dtypes, outs);
  HGC_ON_CUDA(dgc_bucket_is_cuda(codes), dgc_decode_sum_many_device(codes, values, n, dtypes, scale, outs));
  std::vector<at::Tensor> results;
  for (std::size_t t = 0; t < codes.size(); ++t) {
    std::vector<at::Tensor> indices;
    for (std::size_t r = 0; r < codes[t].size(); ++r)
      indices.push_back(dgc_index_decode_cpu(codes[t][r], values[t][r].numel(), n[t]));
    results.push_back(dgc_scatter_sum_cpu(indices, values[t], n[t], dtypes[t], scale, outs[t]));
  }
  return results;
}

void dgc_accumulate_many(const std::vector<at::Tensor>& u, const std::vector<at::Tensor>& v,
                         const std::vector<at::Tensor>& g, double momentum, bool nesterov, double coef) {
  TORCH_CHECK(u.size() == g.size() && v.size() == g.size(),
              "dgc_accumulate_many: u, v and g must have one entry per tensor");
  HGC_ON_CUDA(!g.empty() && g[0].is_cuda(), dgc_accumulate_many_device(u, v, g, momentum, nesterov, coef));
  for (std::size_t i = 0; i < g.size(); ++i) {
    at::Tensor ui = u[i], vi = v[i];
    dgc_accumulate_cpu(ui, vi, g[i], momentum, nesterov, coef);
  }
}

void dgc_mask_many(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& v,
                   const c10::optional<std::vector<at::Tensor>>& u) {
  TORCH_CHECK(indices.size() == v.size() && (!u.has_value() || u->size() == v.size()),
              "dgc_mask_many: indices, v (and u) must have one entry per tensor");
  HGC_ON_CUDA(!v.empty() && v[0].is_cuda(), dgc_mask_many_device(indices, v, u));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const at::Tensor idx = indices[i].to(at::kLong);
    v[i].view(-1).index_fill_(0, idx, 0);
    if (u.has_value()) (*u)[i].view(-1).index_fill_(0, idx, 0);
  }
}

// dgc_select of a bucket (each tensor its own k, sample_count, key): CUDA -> the bucket op (a fixed
// number of device calls, one read-back of the counts); CPU -> dgc_select_cpu tensor by tensor.
DgcSelection dgc_select_many(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& k,
                             const std::vector<int64_t>& sample_count, const std::vector<int64_t>& keys) {
  TORCH_CHECK(k.size() == xs.size() && sample_count.size() == xs.size() && keys.size() == xs.size(),
              "dgc_select_many: xs, k, sample_count and keys must have one entry per tensor (got ", xs.size(), ", ",
              k.size(), ", ", sample_count.size(), ", ", keys.size(), ")");
  HGC_ON_CUDA(!xs.empty() && xs[0].is_cuda(), dgc_select_many_device(xs, k, sample_count, keys));
  DgcSelection res;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto [idx, vals, t, path] = dgc_select_cpu(xs[i], k[i], sample_count[i], keys[i]);
    std::get<0>(res).push_back(idx);
    std::get<1>(res).push_back(vals);
    std::get<2>(res).push_back(t);
    std::get<3>(res).push_back(path);
  }
  return res;
}

// dgc_index_encode of a bucket: CUDA -> the bucket op (two device calls, one read-back); CPU ->
// dgc_index_encode_cpu tensor by tensor.
std::vector<at::Tensor> dgc_index_encode_many(const std::vector<at::Tensor>& indices, const std::vector<int64_t>& n) {
  TORCH_CHECK(n.size() == indices.size(), "dgc_index_encode_many: indices and n must have one entry per tensor (got ",
              indices.size(), ", ", n.size(), ")");
  HGC_ON_CUDA(!indices.empty() && indices[0].is_cuda(), dgc_index_encode_many_device(indices, n));
  std::vector<at::Tensor> codes;
  for (std::size_t i = 0; i < indices.size(); ++i) codes.push_back(dgc_index_encode_cpu(indices[i], n[i]));
  return codes;
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
  m.def("hold_latest", &hold_latest, "hold a C++ reference to each tensor under slot, releasing the slot's previous ones",
        py::arg("slot"), py::arg("tensors"));
  m.def("onebit_encode", &onebit_encode, HGC_RELEASE_GIL,
        "1-bit encode with fused error feedback -> (bits, scales); given scales (onebit_scales'): the pack alone",
        py::arg("grad"), py::arg("residual"), py::arg("cols"), py::arg("scales") = py::none(),
        py::arg("by_rows") = false);
  m.def("onebit_scales", &onebit_scales, HGC_RELEASE_GIL, "the 1-bit encode's scales alone (read-only)",
        py::arg("grad"), py::arg("residual"), py::arg("cols"), py::arg("by_rows") = false);
  m.def("onebit_scales_many", &onebit_scales_many, HGC_RELEASE_GIL,
        "onebit_scales of a bucket (CUDA: a fixed number of device calls)", py::arg("grads"), py::arg("residuals"),
        py::arg("cols"), py::arg("by_rows") = py::none());
  m.def("onebit_decode", &onebit_decode, HGC_RELEASE_GIL, "1-bit decode of one payload", py::arg("bits"), py::arg("scales"),
        py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("out") = py::none(), py::arg("by_rows") = false);
  m.def("onebit_decode_sum", &onebit_decode_sum, HGC_RELEASE_GIL, "scale * sum of K decoded 1-bit payloads", py::arg("bits"),
        py::arg("scales"), py::arg("n"), py::arg("cols"), py::arg("dtype"), py::arg("scale"),
        py::arg("out") = py::none(), py::arg("by_rows") = false);
  m.def("onebit_encode_columns", &onebit_encode_columns, HGC_RELEASE_GIL,
        "1-bit encode of the column window [col0, col1) of a [n / full_cols, full_cols] tensor, residual in place",
        py::arg("full"), py::arg("residual"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"),
        py::arg("scales") = py::none());
  m.def("onebit_decode_columns", &onebit_decode_columns, HGC_RELEASE_GIL,
        "decode one 1-bit payload into the column window [col0, col1) of out", py::arg("bits"), py::arg("scales"),
        py::arg("out"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"));
  m.def("onebit_encode_many", &onebit_encode_many, HGC_RELEASE_GIL,
        "onebit_encode of a bucket (CUDA: a fixed number of device calls) -> (bits list, scales list)",
        py::arg("grads"), py::arg("residuals"), py::arg("cols"), py::arg("scales") = py::none(),
        py::arg("by_rows") = py::none());
  m.def("onebit_decode_sum_many", &onebit_decode_sum_many, HGC_RELEASE_GIL,
        "onebit_decode_sum of a bucket (CUDA: one device call)", py::arg("bits"), py::arg("scales"), py::arg("n"),
        py::arg("cols"), py::arg("dtypes"), py::arg("scale"), py::arg("outs"), py::arg("by_rows") = py::none());
  m.def("onebit_encode_columns_many", &onebit_encode_columns_many, HGC_RELEASE_GIL,
        "onebit_encode_columns of many column windows (CUDA: a fixed number of device calls)", py::arg("fulls"),
        py::arg("residuals"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"), py::arg("scales") = py::none());
  m.def("onebit_decode_columns_many", &onebit_decode_columns_many, HGC_RELEASE_GIL,
        "onebit_decode_columns of many column windows (CUDA: one device call)", py::arg("bits"), py::arg("scales"),
        py::arg("outs"), py::arg("full_cols"), py::arg("col0"), py::arg("col1"));
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
  m.def("terngrad_scale_stats_many", &terngrad_scale_stats_many, HGC_RELEASE_GIL,
        "float64 [2, count]: max |grad| of every gradient, and its clip sigma when with_sigma (else 0)",
        py::arg("grads"), py::arg("with_sigma"));
  m.def("terngrad_encode_many", &terngrad_encode_many, HGC_RELEASE_GIL,
        "terngrad_encode of a bucket (CUDA: one device call) -> (codes list, scale list)", py::arg("grads"),
        py::arg("scales"), py::arg("clips"), py::arg("key0s"), py::arg("key1s"));
  m.def("terngrad_decode_sum_many", &terngrad_decode_sum_many, HGC_RELEASE_GIL,
        "terngrad_decode_sum of a bucket (CUDA: two device calls)", py::arg("codes"), py::arg("scales"),
        py::arg("n"), py::arg("dtypes"), py::arg("scale"), py::arg("outs"));
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
  m.def("qsgd_encode_fixed_many", &qsgd_encode_fixed_many, HGC_RELEASE_GIL,
        "qsgd_encode_fixed of a bucket, one key per tensor (CUDA: a fixed number of device calls) -> (norms list, "
        "packed list)",
        py::arg("xs"), py::arg("s"), py::arg("bucket"), py::arg("max_norm"), py::arg("keys"));
  m.def("qsgd_decode_fixed_many", &qsgd_decode_fixed_many, HGC_RELEASE_GIL,
        "qsgd_decode_fixed of a bucket, one K (CUDA: one device call per dtype)", py::arg("norms"), py::arg("packed"),
        py::arg("n"), py::arg("s"), py::arg("bucket"), py::arg("dtypes"), py::arg("scale"), py::arg("outs"));
  m.def("qsgd_encode_elias_many", &qsgd_encode_elias_many, HGC_RELEASE_GIL,
        "qsgd_encode_elias of a bucket, one key per tensor (CUDA: a fixed number of device calls, one read) -> "
        "(norms list, nbits list, stream list)",
        py::arg("xs"), py::arg("s"), py::arg("bucket"), py::arg("max_norm"), py::arg("keys"),
        py::arg("group_buckets"));
  m.def("qsgd_decode_elias_many", &qsgd_decode_elias_many, HGC_RELEASE_GIL,
        "scale * sum of each tensor's K Elias payloads (decode_mean_list's arithmetic) for a bucket",
        py::arg("norms"), py::arg("nbits"), py::arg("streams"), py::arg("n"), py::arg("s"), py::arg("bucket"),
        py::arg("group_buckets"), py::arg("dtypes"), py::arg("scale"), py::arg("outs"));
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
  m.def("dgc_scatter_sum_many", &dgc_scatter_sum_many, HGC_RELEASE_GIL,
        "dgc_scatter_sum of a bucket (CUDA: a fixed number of device calls)", py::arg("indices"), py::arg("values"),
        py::arg("n"), py::arg("dtypes"), py::arg("scale"), py::arg("outs"));
  m.def("dgc_decode_sum_many", &dgc_decode_sum_many, HGC_RELEASE_GIL,
        "dgc_index_decode + dgc_scatter_sum of a bucket (CUDA: a fixed number of device calls)", py::arg("codes"),
        py::arg("values"), py::arg("n"), py::arg("dtypes"), py::arg("scale"), py::arg("outs"));
  m.def("dgc_accumulate_many_", &dgc_accumulate_many, HGC_RELEASE_GIL,
        "dgc_accumulate_ of a bucket (CUDA: one device call per dtype)", py::arg("u"), py::arg("v"), py::arg("g"),
        py::arg("momentum"), py::arg("nesterov"), py::arg("coef") = 1.0);
  m.def("dgc_mask_many_", &dgc_mask_many, HGC_RELEASE_GIL,
        "zero v (and u) at each tensor's sent indices (CUDA: one device call)", py::arg("indices"), py::arg("v"),
        py::arg("u") = py::none());
  m.def("dgc_select_many", &dgc_select_many, HGC_RELEASE_GIL,
        "dgc_select of a bucket, each tensor with its own k, sample_count and key (CUDA: a fixed number of device "
        "calls) -> (indices list, values list, thresholds, paths)",
        py::arg("xs"), py::arg("k"), py::arg("sample_count"), py::arg("keys"));
  m.def("dgc_index_encode_many", &dgc_index_encode_many, HGC_RELEASE_GIL,
        "dgc_index_encode of a bucket (CUDA: two device calls, one read-back)", py::arg("indices"), py::arg("n"));
}
