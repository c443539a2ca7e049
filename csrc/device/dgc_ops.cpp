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
  hgc::check_values_input(x, kDeviceType, "x");
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

namespace {

// The one device of a bucket's payload buffers (every buffer checked).
at::Device sum_device(const char* op, const DgcPayloadLists& indices, const DgcPayloadLists& values) {
  const at::Device device = indices[0][0].device();
  for (std::size_t t = 0; t < indices.size(); ++t) {
    for (std::size_t r = 0; r < indices[t].size(); ++r) {
      for (const at::Tensor* b : {&indices[t][r], &values[t][r]}) {
        TORCH_CHECK(!b->defined() || b->device() == device, op, ": tensor ", t, ", payload ", r, " is on ",
                    b->device(), ", tensor 0's payload 0 on ", device, " (a bucket is on one device)");
      }
    }
  }
  return device;
}

// The decode-sum of a bucket whose payloads (checked, contiguous, tensor-major) are `pays`: the
// outputs, or an error naming the first payload with bad indices (outputs left untouched).
std::vector<at::Tensor> run_sum_many(const std::vector<hgc_dev::DgcSumPayload>& pays, int64_t K,
                                     const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                                     double scale, const std::vector<c10::optional<at::Tensor>>& outs,
                                     const at::Device& device) {
  const std::size_t count = n.size();
  const hgc_dev::DeviceGuard guard(device);
  std::vector<at::Tensor> results;
  std::vector<hgc_dev::DgcSumTensor> tensors(count);
  for (std::size_t t = 0; t < count; ++t) {
    results.push_back(hgc_decode_output(outs[t], n[t], dtypes[t], device, "dgc_decode"));
    tensors[t] = {hgc_dev::dev_dtype(dtypes[t]), n[t], results[t].data_ptr()};
  }
  std::vector<int64_t> bad(pays.size());
  const bool ok = hgc_dev::dgc_scatter_sum_many(hgc_dev::current_ctx(), tensors.data(), static_cast<int64_t>(count),
                                                pays.data(), K, scale, bad.data());
  if (!ok) {
    for (std::size_t p = 0; p < pays.size(); ++p) {
      const std::size_t t = p / static_cast<std::size_t>(K);
      TORCH_CHECK(bad[p] == 0, "dgc_decode: tensor ", t, ", payload ", p % static_cast<std::size_t>(K),
                  ": indices must be strictly increasing and in [0, ", n[t], ")");
    }
  }
  return results;
}

}  // namespace

std::vector<at::Tensor> dgc_scatter_sum_many_device(const DgcPayloadLists& indices, const DgcPayloadLists& values,
                                                    const std::vector<int64_t>& n,
                                                    const std::vector<at::ScalarType>& dtypes, double scale,
                                                    const std::vector<c10::optional<at::Tensor>>& outs) {
  constexpr const char* op = "dgc_scatter_sum_many";
  const int64_t K = hgc::check_dgc_sum_lists(op, indices, values, n, dtypes, outs);
  if (K == 0) return {};
  const at::Device device = sum_device(op, indices, values);
  std::vector<at::Tensor> keep;  // contiguous buffers, alive until the launcher returns
  std::vector<hgc_dev::DgcSumPayload> pays;
  for (std::size_t t = 0; t < indices.size(); ++t) {
    hgc::check_dgc_scatter_args(indices[t], values[t], n[t], dtypes[t], kDeviceType);
    for (int64_t r = 0; r < K; ++r) {
      const at::Tensor ix = indices[t][r].contiguous(), vx = values[t][r].contiguous();
      keep.push_back(ix);
      keep.push_back(vx);
      pays.push_back({static_cast<const uint8_t*>(ix.data_ptr()), static_cast<int>(ix.element_size()), ix.numel(),
                      vx.data_ptr()});
    }
  }
  return run_sum_many(pays, K, n, dtypes, scale, outs, device);
}

std::vector<at::Tensor> dgc_decode_sum_many_device(const DgcPayloadLists& codes, const DgcPayloadLists& values,
                                                   const std::vector<int64_t>& n,
                                                   const std::vector<at::ScalarType>& dtypes, double scale,
                                                   const std::vector<c10::optional<at::Tensor>>& outs) {
  constexpr const char* op = "dgc_decode_sum_many";
  const int64_t K = hgc::check_dgc_sum_lists(op, codes, values, n, dtypes, outs);
  if (K == 0) return {};
  const at::Device device = sum_device(op, codes, values);
  std::vector<at::Tensor> keep;
  std::vector<hgc_dev::DgcSumPayload> pays;
  for (std::size_t t = 0; t < codes.size(); ++t) {
    hgc::check_decode_dtype(dtypes[t], "dgc_decode");
    for (int64_t r = 0; r < K; ++r) {
      const at::Tensor& vals = values[t][r];
      TORCH_CHECK(vals.defined() && vals.dim() == 1 && vals.scalar_type() == dtypes[t], "dgc_decode: tensor ", t,
                  ", payload ", r, ": values must be 1-D ", dtypes[t]);
      hgc::check_device_type(vals, kDeviceType, "values[t][r]");
      const int64_t w = hgc::check_dgc_index_decode_args(codes[t][r], vals.numel(), n[t], kDeviceType);
      const at::Tensor cx = codes[t][r].contiguous(), vx = vals.contiguous();
      keep.push_back(cx);
      keep.push_back(vx);
      pays.push_back({cx.data_ptr<uint8_t>(), static_cast<int>(w), vx.numel(), vx.data_ptr()});
    }
  }
  return run_sum_many(pays, K, n, dtypes, scale, outs, device);
}

void dgc_accumulate_many_device(const std::vector<at::Tensor>& u, const std::vector<at::Tensor>& v,
                                const std::vector<at::Tensor>& g, double momentum, bool nesterov, double coef) {
  constexpr const char* op = "dgc_accumulate_many";
  const std::size_t count = g.size();
  hgc::check_one_entry_per_tensor(op, "g, u and v", count, {u.size(), v.size()});
  if (count == 0) return;
  const at::Device device = hgc_dev::bucket_device(g, op, "gradient");
  std::vector<hgc_dev::DgcAccumulateItem> items(count);
  for (std::size_t i = 0; i < count; ++i) {
    hgc::check_dgc_accumulate_args(u[i], v[i], g[i], momentum, kDeviceType);
    items[i] = {hgc_dev::dev_dtype(g[i].scalar_type()), u[i].data_ptr(), v[i].data_ptr(), g[i].data_ptr(),
                g[i].numel()};
  }
  const hgc_dev::DeviceGuard guard(device);
  hgc_dev::dgc_accumulate_many(hgc_dev::current_ctx(), items.data(), static_cast<int64_t>(count), momentum, nesterov,
                               coef);
}

void dgc_mask_many_device(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& v,
                          const c10::optional<std::vector<at::Tensor>>& u) {
  constexpr const char* op = "dgc_mask_many";
  const std::size_t count = v.size();
  hgc::check_one_entry_per_tensor(op, "v, indices (and u, or None)", count,
                                  {indices.size(), u.has_value() ? u->size() : count});
  if (count == 0) return;
  const at::Device device = hgc_dev::bucket_device(v, op, "accumulation");
  std::vector<hgc_dev::DgcMaskItem> items(count);
  for (std::size_t i = 0; i < count; ++i) {
    const at::Tensor& vi = v[i];
    hgc::check_device_type(vi, kDeviceType, "v[i]");
    HGC_CHECK_CONTIGUOUS(vi);
    HGC_CHECK_FLOATING(vi);
    const int64_t n = vi.numel();
    const at::ScalarType ity = hgc::dgc_index_type(n);
    const at::Tensor& ix = indices[i];
    TORCH_CHECK(ix.dim() == 1 && ix.scalar_type() == ity && ix.is_contiguous() && ix.device() == device, op,
                ": indices ", i, " must be contiguous 1-D ", ity, " on ", device, " for ", n, " values, got ",
                ix.dim(), "-D ", ix.scalar_type(), " on ", ix.device());
    void* ui = nullptr;
    if (u.has_value()) {
      const at::Tensor& t = (*u)[i];
      TORCH_CHECK(t.device() == device && t.is_contiguous() && t.scalar_type() == vi.scalar_type() &&
                      t.numel() == n,
                  op, ": u ", i, " must be a contiguous ", vi.scalar_type(), " tensor of ", n, " values on ", device);
      ui = t.data_ptr();
    }
    items[i] = {ix.data_ptr(), ity == at::kLong, ix.numel(), n, static_cast<int>(vi.element_size()), vi.data_ptr(),
                ui};
  }
  const hgc_dev::DeviceGuard guard(device);
  hgc_dev::dgc_mask_many(hgc_dev::current_ctx(), items.data(), static_cast<int64_t>(count));
}

DgcSelection dgc_select_many_device(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& k,
                                    const std::vector<int64_t>& sample_count, const std::vector<int64_t>& keys) {
  constexpr const char* op = "dgc_select_many";
  const std::size_t count = xs.size();
  hgc::check_one_entry_per_tensor(op, "xs, k, sample_count and keys", count,
                                  {k.size(), sample_count.size(), keys.size()});
  DgcSelection res;
  auto& [idx, vals, thresholds, paths] = res;
  if (count == 0) return res;
  const at::Device device = hgc_dev::bucket_device(xs, op, "x");
  for (std::size_t i = 0; i < count; ++i) {
    const at::Tensor& x = xs[i];
    TORCH_CHECK(x.defined(), op, ": x ", i, " is undefined");
    hgc::check_device_type(x, kDeviceType, "x");
    TORCH_CHECK(x.is_contiguous(), op, ": x ", i, " must be contiguous");
    TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble || x.scalar_type() == at::kHalf ||
                    x.scalar_type() == at::kBFloat16,
                op, ": x ", i, " must be fp16, bf16, fp32 or fp64, got ", x.scalar_type());
    TORCH_CHECK(k[i] >= 0 && sample_count[i] >= 0, op, ": tensor ", i, ": k and sample_count must be >= 0 (got ",
                k[i], ", ", sample_count[i], ")");
  }
  const hgc_dev::DeviceGuard guard(device);
  const hgc_dev::Ctx ctx = hgc_dev::current_ctx();
  std::vector<hgc_dev::DgcSelectItem> items;
  std::vector<std::size_t> which;  // the tensors with a selection to make (n >= 1, k >= 1)
  for (std::size_t i = 0; i < count; ++i) {
    if (xs[i].numel() == 0 || k[i] == 0) continue;
    items.push_back({hgc_dev::dev_dtype(xs[i].scalar_type()), xs[i].data_ptr(), xs[i].numel(), k[i],
                     sample_count[i], static_cast<uint64_t>(keys[i])});
    which.push_back(i);
  }
  std::vector<hgc_dev::DgcThreshold> th(items.size());
  hgc_dev::dgc_threshold_many(ctx, items.data(), static_cast<int64_t>(items.size()), th.data());
  std::vector<hgc_dev::DgcCompactItem> compact;
  std::size_t j = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const at::Tensor& x = xs[i];
    const at::ScalarType ity = hgc::dgc_index_type(x.numel());
    const bool active = j < which.size() && which[j] == i;
    const int64_t c = active ? th[j].count : 0;
    idx.push_back(at::empty({c}, x.options().dtype(ity)));
    vals.push_back(at::empty({c}, x.options()));
    thresholds.push_back(active ? th[j].value : std::numeric_limits<double>::infinity());
    paths.push_back(active ? th[j].path : 2);
    if (active) {
      compact.push_back({items[j].dtype, x.data_ptr(), x.numel(), th[j].key, ity == at::kLong, idx.back().data_ptr(),
                         vals.back().data_ptr(), c});
      ++j;
    }
  }
  hgc_dev::dgc_compact_many(ctx, compact.data(), static_cast<int64_t>(compact.size()));
  return res;
}

std::vector<at::Tensor> dgc_index_encode_many_device(const std::vector<at::Tensor>& indices,
                                                     const std::vector<int64_t>& n) {
  constexpr const char* op = "dgc_index_encode_many";
  const std::size_t count = indices.size();
  hgc::check_one_entry_per_tensor(op, "indices and n", count, {n.size()});
  if (count == 0) return {};
  const at::Device device = hgc_dev::bucket_device(indices, op, "indices");
  std::vector<at::Tensor> ix(count);
  std::vector<hgc_dev::DgcIndexItem> items(count);
  for (std::size_t i = 0; i < count; ++i) {
    const at::ScalarType ity = hgc::check_dgc_index_encode_args(indices[i], n[i], kDeviceType);
    ix[i] = indices[i].contiguous();
    items[i] = {ix[i].data_ptr(), ity == at::kLong, ix[i].numel(), n[i]};
  }
  const hgc_dev::DeviceGuard guard(device);
  const hgc_dev::Ctx ctx = hgc_dev::current_ctx();
  std::vector<hgc_dev::DgcIndexScan> scan(count);
  hgc_dev::dgc_index_scan_many(ctx, items.data(), static_cast<int64_t>(count), scan.data());
  for (std::size_t i = 0; i < count; ++i)
    TORCH_CHECK(scan[i].ok, "dgc_index_encode: tensor ", i, ": indices must be strictly increasing and in [0, ", n[i],
                ")");
  std::vector<at::Tensor> codes(count);
  std::vector<int> w(count);
  std::vector<uint8_t*> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    const hgc_dev::DgcIndexScan& s = scan[i];
    w[i] = s.top < 256 ? 1 : s.top < 65536 ? 2 : static_cast<int>(ix[i].element_size());
    codes[i] = at::empty({items[i].count * w[i]}, ix[i].options().dtype(at::kByte));
    out[i] = codes[i].data_ptr<uint8_t>();
  }
  hgc_dev::dgc_index_write_many(ctx, items.data(), w.data(), out.data(), static_cast<int64_t>(count));
  return codes;
}

HGC_DEVICE_OPS(dgc, HGC_DGC_OPS, HGC_DGC_INTO_OPS)
