// horovod_gradcomp._C: the `hgc` ops' schemas (the op lists of ops/schemas.h, defined here once) and
// their CPU kernels (the per-tensor kernels of csrc/cpu/, and the bucket ops tensor by tensor); their CUDA
// kernels are registered by device/<codec>_ops.cpp (WITH_CUDA). The dispatcher picks the kernel
// by the tensors' device; the Python module holds only what is not a tensor op.
#include <torch/extension.h>
#include <torch/library.h>

#include "ops/adapters.h"
#include "ops/schemas.h"

#include "checks.h"
#include "cpu/gloo_exit.h"
#include "cpu/onebit_cpu.h"
#include "cpu/terngrad_cpu.h"
#include "cpu/qsgd_cpu.h"
#include "cpu/dgc_cpu.h"
#include "cpu/dgc_index_cpu.h"
#include "cpu/dgc_memory_cpu.h"
#ifdef WITH_CUDA
#include "device/context.h"
#endif


namespace {

// onebit's ops take `by_rows` (the bucket ops: one per tensor, or None): rows mode, where `cols`
// counts the rows of the [cols, n / cols] view, each with its a+ and a- (csrc/cpu/onebit_cpu.h).
std::tuple<at::Tensor, at::Tensor> onebit_encode(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                 int64_t cols, const c10::optional<at::Tensor>& scales,
                                                 bool by_rows) {
  return onebit_encode_cpu(grad, residual, cols, scales, by_rows);
}

at::Tensor onebit_scales(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                         bool by_rows) {
  return onebit_scales_cpu(grad, residual, cols, by_rows);
}

// The given scales of tensor i of an optional list (None: none).
c10::optional<at::Tensor> scales_at(const c10::optional<std::vector<at::Tensor>>& scales, std::size_t i) {
  return scales.has_value() ? c10::optional<at::Tensor>((*scales)[i]) : c10::nullopt;
}

at::Tensor onebit_decode_sum(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out, bool by_rows) {
  TORCH_CHECK(bits.device() == scales.device(), "onebit_decode: bits and scales are on different devices");
  return onebit_decode_sum_cpu(bits, scales, n, cols, dtype, scale, out, by_rows);
}

std::tuple<at::Tensor, at::Tensor> onebit_encode_columns(const at::Tensor& full,
                                                         const c10::optional<at::Tensor>& residual, int64_t full_cols,
                                                         int64_t col0, int64_t col1,
                                                         const c10::optional<at::Tensor>& scales) {
  return onebit_encode_columns_cpu(full, residual, full_cols, col0, col1, scales);
}

void onebit_decode_columns(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out, int64_t full_cols,
                           int64_t col0, int64_t col1) {
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
  for (std::size_t i = 0; i < count; ++i) onebit_decode_columns_cpu(bits[i], scales[i], outs[i], full_cols[i], col0[i], col1[i]);
}

at::Tensor onebit_decode(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                         at::ScalarType dtype, const c10::optional<at::Tensor>& out, bool by_rows) {
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, "onebit_decode: expected flat bits and scales");
  return onebit_decode_sum(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out, by_rows);
}

// ---- the CPU ops check their own arguments ----

double terngrad_max_abs(const at::Tensor& grad) {
  return terngrad_max_abs_cpu(grad);
}

double terngrad_sigma(const at::Tensor& grad) {
  return terngrad_sigma_cpu(grad);
}

std::tuple<at::Tensor, at::Tensor> terngrad_encode(const at::Tensor& grad, double scale, double clip, int64_t key0,
                                                   int64_t key1) {
  return terngrad_encode_cpu(grad, scale, clip, key0, key1);
}

at::Tensor terngrad_decode_sum(const at::Tensor& codes, const at::Tensor& scales, int64_t n, at::ScalarType dtype,
                               double scale, const c10::optional<at::Tensor>& out) {
  return terngrad_decode_sum_cpu(codes, scales, n, dtype, scale, out);
}

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed(const at::Tensor& x, int64_t s, int64_t bucket, bool max_norm,
                                                     int64_t key) {
  return qsgd_encode_fixed_cpu(x, s, bucket, max_norm, key);
}

at::Tensor qsgd_decode_fixed(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s, int64_t bucket,
                             at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out) {
  return qsgd_decode_fixed_cpu(norms, packed, n, s, bucket, dtype, scale, out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias(const at::Tensor& x, int64_t s, int64_t bucket,
                                                                 bool max_norm, int64_t key, int64_t group_buckets) {
  return qsgd_encode_elias_cpu(x, s, bucket, max_norm, key, group_buckets);
}

at::Tensor qsgd_decode_elias(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream, int64_t n,
                             int64_t s, int64_t bucket, int64_t group_buckets, at::ScalarType dtype,
                             const c10::optional<at::Tensor>& out) {
  return qsgd_decode_elias_cpu(norms, nbits, stream, n, s, bucket, group_buckets, dtype, out);
}

// QSGD's bucket ops: CUDA tensors in a fixed number of device calls (qsgd_ops.h); CPU tensors
// tensor by tensor through the CPU kernels, with the same results.
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_fixed_many(const std::vector<at::Tensor>& xs,
                                                                                    int64_t s, int64_t bucket,
                                                                                    bool max_norm,
                                                                                    const std::vector<int64_t>& keys) {
  TORCH_CHECK(keys.size() == xs.size(), "qsgd_encode_fixed_many: ", xs.size(), " tensors but ", keys.size(), " keys");
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
  return terngrad_sum_levels_cpu(codes, n, width);
}

at::Tensor terngrad_sum_decode(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                               at::ScalarType dtype, const c10::optional<at::Tensor>& out) {
  return terngrad_sum_decode_cpu(levels, n, k, width, mult, dtype, out);
}

// A TernGrad bucket at once: CUDA tensors in a fixed number of device calls (terngrad_ops.h); CPU
// tensors tensor by tensor through the CPU kernels (one host call each, no launches to save).
at::Tensor terngrad_scale_stats_many(const std::vector<at::Tensor>& grads, bool with_sigma) {
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
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i) {
    results.push_back(terngrad_decode_sum_cpu(codes[i], scales[i], n[i], dtypes[i], scale, outs[i]));
  }
  return results;
}

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select(const at::Tensor& x, int64_t k, int64_t sample_count,
                                                               int64_t key) {
  return dgc_select_cpu(x, k, sample_count, key);
}

at::Tensor dgc_scatter_sum(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values, int64_t n,
                           at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out) {
  return dgc_scatter_sum_cpu(indices, values, n, dtype, scale, out);
}

at::Tensor dgc_index_encode(const at::Tensor& idx, int64_t n) {
  return dgc_index_encode_cpu(idx, n);
}

at::Tensor dgc_index_decode(const at::Tensor& code, int64_t count, int64_t n) {
  return dgc_index_decode_cpu(code, count, n);
}

void dgc_accumulate(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov, double coef) {
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

std::vector<at::Tensor> dgc_scatter_sum_many(const DgcPayloadLists& indices, const DgcPayloadLists& values,
                                             const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                                             double scale, const std::vector<c10::optional<at::Tensor>>& outs) {
  check_dgc_sum_lists("dgc_scatter_sum_many", indices, values, n, dtypes, outs);
  std::vector<at::Tensor> results;
  for (std::size_t t = 0; t < indices.size(); ++t)
    results.push_back(dgc_scatter_sum_cpu(indices[t], values[t], n[t], dtypes[t], scale, outs[t]));
  return results;
}

std::vector<at::Tensor> dgc_decode_sum_many(const DgcPayloadLists& codes, const DgcPayloadLists& values,
                                            const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                                            double scale, const std::vector<c10::optional<at::Tensor>>& outs) {
  check_dgc_sum_lists("dgc_decode_sum_many", codes, values, n, dtypes, outs);
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
  for (std::size_t i = 0; i < g.size(); ++i) {
    at::Tensor ui = u[i], vi = v[i];
    dgc_accumulate_cpu(ui, vi, g[i], momentum, nesterov, coef);
  }
}

void dgc_mask_many(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& v,
                   const c10::optional<std::vector<at::Tensor>>& u) {
  TORCH_CHECK(indices.size() == v.size() && (!u.has_value() || u->size() == v.size()),
              "dgc_mask_many: indices, v (and u) must have one entry per tensor");
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


namespace {

// Every schema of _C, codec after codec.
std::vector<const char*> all_schemas() {
  std::vector<const char*> all;
  for (const auto* list : {&hgc::terngrad_schemas(), &hgc::onebit_schemas(), &hgc::qsgd_schemas(), &hgc::dgc_schemas()})
    all.insert(all.end(), list->begin(), list->end());
  return all;
}

#ifndef WITH_CUDA
// The CUDA kernel of every op in a build without CUDA: a clear error, not the CPU kernel.
void no_cuda_kernel(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK(false, op.schema().name(), ": horovod_gradcomp._C was built without CUDA kernels; got CUDA tensors "
              "(rebuild with CUDA, see hgc.native_cuda_status(), or use impl='reference')");
}
#endif

// The CPU kernels, under CPU and under CompositeExplicitAutograd: the latter serves calls with no
// tensor at all (an empty bucket), which have no device to dispatch on.
void register_cpu_kernels(torch::Library& m) {
  HGC_TERNGRAD_OPS(HGC_IMPL_CPU)
  HGC_ONEBIT_OPS(HGC_IMPL_CPU)
  HGC_QSGD_OPS(HGC_IMPL_CPU)
  HGC_DGC_OPS(HGC_IMPL_CPU)
  HGC_TERNGRAD_INTO_OPS(HGC_IMPL_INTO_CPU)
  HGC_ONEBIT_INTO_OPS(HGC_IMPL_INTO_CPU)
  HGC_QSGD_INTO_OPS(HGC_IMPL_INTO_CPU)
  HGC_DGC_INTO_OPS(HGC_IMPL_INTO_CPU)
}

}  // namespace

TORCH_LIBRARY(hgc, m) { hgc::define_ops(m, all_schemas()); }

TORCH_LIBRARY_IMPL(hgc, CPU, m) { register_cpu_kernels(m); }

TORCH_LIBRARY_IMPL(hgc, CompositeExplicitAutograd, m) { register_cpu_kernels(m); }

#ifndef WITH_CUDA
TORCH_LIBRARY_IMPL(hgc, CUDA, m) {
  for (const std::string& name : hgc::op_names(all_schemas()))
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&no_cuda_kernel>());
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod_gradcomp native codec kernels: the torch.ops.hgc ops (see horovod_gradcomp/ops.py)";
  m.def("has_cuda", &has_cuda, "True when built with the CUDA kernels");
  m.attr("ops") = hgc::op_names(all_schemas());  // the ops this module registers under torch.ops.hgc
#ifdef WITH_CUDA
  // The CUDA kernels' counters (csrc/device/exec.cuh), as the twin has them: bench devtime reads them.
  m.def("algorithm_calls", &hgc_dev::algorithm_calls, "device algorithm (Thrust) calls issued so far, all threads");
  m.def("host_syncs", &hgc_dev::host_syncs, "host synchronizations (reads back from the GPU) issued so far, all threads");
#endif
  // Holds the GIL: replacing the held object releases the previous one.
  m.def("retain_backward_context", &retain_backward_context,
        "during a backward: keep its stashed context alive (see horovod_gradcomp/ddp/gloo_exit.py)");
  m.def("keep_until_exit", &keep_until_exit, "hold a C++ reference to each tensor until the process ends",
        py::arg("tensors"));
  m.def("hold_latest", &hold_latest, "hold a C++ reference to each tensor under slot, releasing the slot's previous ones",
        py::arg("slot"), py::arg("tensors"));
}
