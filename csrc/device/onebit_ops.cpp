// Torch ops of the onebit device path (see ops_common.h and onebit_ops.h): the CPU ops' checks
// (csrc/checks.h, csrc/payload_checks.h) against kDeviceType, outputs on the input's device,
// the launchers of onebit_device.cu on the current stream. No host round trip.
#include "onebit_ops.h"

#include "../checks.h"
#include "../payload_checks.h"
#include "onebit_device.h"
#include "ops_common.h"
#include "registry.h"

namespace {

// Element `offset` of t's storage (a column window's first value).
void* at_element(const at::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * static_cast<int64_t>(t.element_size());
}

bool given(const c10::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The encode of the n-value matrix of `cols` columns from element `offset` of `src` (and of the
// residual), rows `ld` elements apart (arguments checked by the callers); by_rows: of the
// contiguous matrix of `cols` rows, a+ and a- per row. With `scales` given (checked here) the pack
// alone, with them (the payload's scales are `scales` itself); `pack` false: the scales alone (bits
// empty).
std::tuple<at::Tensor, at::Tensor> encode_matrix(const at::Tensor& src, const c10::optional<at::Tensor>& residual,
                                                 int64_t n, int64_t cols, int64_t ld, int64_t offset,
                                                 const c10::optional<at::Tensor>& given_scales = c10::nullopt,
                                                 bool pack = true, bool by_rows = false) {
  const hgc_dev::DeviceGuard guard(src.device());
  const bool has_res = residual.has_value() && residual->defined();
  const bool has_given = given(given_scales);
  if (has_given) hgc::check_onebit_given_scales(*given_scales, src, cols);
  auto bits = at::empty({pack ? (n + 7) / 8 : 0}, src.options().dtype(at::kByte));
  const auto sopt = src.options().dtype(at::kFloat);
  auto scales = has_given ? *given_scales : (n == 0 ? at::zeros({2 * cols}, sopt) : at::empty({2 * cols}, sopt));
  const auto passes = has_given ? hgc_dev::OnebitPasses::kPack
                                : (pack ? hgc_dev::OnebitPasses::kBoth : hgc_dev::OnebitPasses::kScales);
  hgc_dev::onebit_encode(hgc_dev::current_ctx(), hgc_dev::dev_dtype(src.scalar_type()), at_element(src, offset),
                         has_res ? at_element(*residual, offset) : nullptr, n, cols, ld, bits.data_ptr<uint8_t>(),
                         scales.data_ptr<float>(), passes, by_rows);
  return {bits, scales};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> onebit_encode_device(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                                        int64_t cols, const c10::optional<at::Tensor>& scales,
                                                        bool by_rows) {
  hgc::check_onebit_encode_args(grad, residual, cols, hgc_dev::kDeviceType, by_rows);
  return encode_matrix(grad, residual, grad.numel(), cols, cols, 0, scales, true, by_rows);
}

at::Tensor onebit_scales_device(const at::Tensor& grad, const c10::optional<at::Tensor>& residual, int64_t cols,
                                bool by_rows) {
  hgc::check_onebit_encode_args(grad, residual, cols, hgc_dev::kDeviceType, by_rows);
  return std::get<1>(encode_matrix(grad, residual, grad.numel(), cols, cols, 0, c10::nullopt, false, by_rows));
}

at::Tensor onebit_decode_sum_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                    at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt,
                                    bool by_rows) {
  hgc::check_onebit_payload_devices(bits, scales);
  const int64_t K = hgc::check_onebit_decode_args(bits, scales, n, cols, dtype, hgc_dev::kDeviceType, by_rows);
  const hgc_dev::DeviceGuard guard(bits.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, bits.device(), "onebit_decode");
  hgc_dev::onebit_decode_sum(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), bits.data_ptr<uint8_t>(),
                             bits.stride(0), scales.data_ptr<float>(), scales.stride(0), K, n, cols, cols, scale,
                             out.data_ptr(), by_rows);
  return out;
}

at::Tensor onebit_decode_device(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                at::ScalarType dtype, const c10::optional<at::Tensor>& out, bool by_rows) {
  hgc::check_onebit_flat_payload(bits, scales, "onebit_decode");
  return onebit_decode_sum_device(bits.unsqueeze(0), scales.unsqueeze(0), n, cols, dtype, 1.0, out, by_rows);
}

std::tuple<at::Tensor, at::Tensor> onebit_encode_columns_device(const at::Tensor& full,
                                                                const c10::optional<at::Tensor>& residual,
                                                                int64_t full_cols, int64_t col0, int64_t col1,
                                                                const c10::optional<at::Tensor>& scales) {
  const int64_t n =
      hgc::check_onebit_encode_columns_args(full, residual, full_cols, col0, col1, hgc_dev::kDeviceType);
  return encode_matrix(full, residual, n, col1 - col0, full_cols, col0, scales);
}

void onebit_decode_columns_device(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                                  int64_t full_cols, int64_t col0, int64_t col1) {
  const int64_t n =
      hgc::check_onebit_decode_columns_args(bits, scales, out, full_cols, col0, col1, hgc_dev::kDeviceType);
  TORCH_CHECK(bits.device() == out.device(), "onebit_decode_columns: out is on ", out.device(), ", the payload on ",
              bits.device());
  const hgc_dev::DeviceGuard guard(out.device());
  hgc_dev::onebit_decode_sum(hgc_dev::current_ctx(), hgc_dev::dev_dtype(out.scalar_type()), bits.data_ptr<uint8_t>(),
                             0, scales.data_ptr<float>(), 0, 1, n, col1 - col0, full_cols, 1.0, at_element(out, col0));
}

namespace {

// One matrix of a bucket encode: n values in `cols` columns from element `offset` of `src` (and
// of `residual`), rows `ld` elements apart (by_rows: in `cols` contiguous rows, a+ and a- per row;
// arguments checked by the callers).
struct EncodeSource {
  at::Tensor src;
  c10::optional<at::Tensor> residual;
  int64_t n, cols, ld, offset;
  bool by_rows = false;
};

// The payloads of every source (bits and scales: views into one buffer each), one launch
// sequence per dtype present. `given`: every source's scales (checked here; the pack alone, and
// the payloads' scales are these tensors), or None. `pack` false: the scales alone (no bits).
OnebitPayloads encode_sources(const std::vector<EncodeSource>& sources, bool with_residual,
                              const c10::optional<std::vector<at::Tensor>>& given_scales = c10::nullopt,
                              bool pack = true) {
  std::vector<at::Tensor> bits_out, scales_out;
  if (sources.empty()) return {bits_out, scales_out};
  const bool has_given = given_scales.has_value();
  TORCH_CHECK(!has_given || given_scales->size() == sources.size(), "onebit_encode_many: ", sources.size(),
              " tensors but ", has_given ? given_scales->size() : 0, " given scales");
  const at::Device device = sources[0].src.device();
  int64_t bit_bytes = 0, scale_count = 0;
  std::vector<at::ScalarType> dtypes;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const EncodeSource& s = sources[i];
    if (has_given) hgc::check_onebit_given_scales((*given_scales)[i], s.src, s.cols);
    bit_bytes += pack ? (s.n + 7) / 8 : 0;
    scale_count += has_given ? 0 : 2 * s.cols;
    dtypes.push_back(s.src.scalar_type());
  }
  const hgc_dev::DeviceGuard guard(device);
  const auto options = sources[0].src.options();
  at::Tensor bits = at::empty({bit_bytes}, options.dtype(at::kByte));
  at::Tensor scales = at::empty({scale_count}, options.dtype(at::kFloat));  // n == 0: the finish stages write 0
  std::vector<hgc_dev::OnebitEncodeItem> items;
  for (std::size_t i = 0, b = 0, c = 0; i < sources.size(); ++i) {
    const EncodeSource& s = sources[i];
    const int64_t nb = pack ? (s.n + 7) / 8 : 0;
    bits_out.push_back(bits.narrow(0, static_cast<int64_t>(b), nb));
    scales_out.push_back(has_given ? (*given_scales)[i] : scales.narrow(0, static_cast<int64_t>(c), 2 * s.cols));
    items.push_back({at_element(s.src, s.offset), with_residual ? at_element(*s.residual, s.offset) : nullptr, s.n,
                     s.cols, s.ld, bits_out[i].data_ptr<uint8_t>(), scales_out[i].data_ptr<float>(), s.by_rows});
    b += static_cast<std::size_t>(nb);
    c += static_cast<std::size_t>(has_given ? 0 : 2 * s.cols);
  }
  const auto passes = has_given ? hgc_dev::OnebitPasses::kPack
                                : (pack ? hgc_dev::OnebitPasses::kBoth : hgc_dev::OnebitPasses::kScales);
  hgc_dev::launch_by_dtype(dtypes, items, [&](hgc_dev::DType dt, const hgc_dev::OnebitEncodeItem* group, int64_t size) {
    hgc_dev::onebit_encode_many(hgc_dev::current_ctx(), dt, group, size, with_residual, passes);
  });
  return {bits_out, scales_out};
}

// Decodes every item (K payloads each, scaled), one launch sequence per dtype present.
void decode_items(const std::vector<hgc_dev::OnebitDecodeItem>& items, const std::vector<at::ScalarType>& dtypes,
                  const at::Device& device, int64_t K, double scale) {
  const hgc_dev::DeviceGuard guard(device);
  hgc_dev::launch_by_dtype(dtypes, items, [&](hgc_dev::DType dt, const hgc_dev::OnebitDecodeItem* group, int64_t size) {
    hgc_dev::onebit_decode_sum_many(hgc_dev::current_ctx(), dt, group, size, K, scale);
  });
}

// The residual of source i of an optional list (None: none).
c10::optional<at::Tensor> residual_at(const c10::optional<std::vector<at::Tensor>>& residuals, std::size_t i) {
  return residuals.has_value() ? c10::optional<at::Tensor>((*residuals)[i]) : c10::nullopt;
}

}  // namespace

namespace {

// The checked sources of a bucket encode of whole tensors (onebit_encode_many, onebit_scales_many).
// by_rows: each tensor's mode (None: columns mode for all).
std::vector<EncodeSource> whole_sources(const std::vector<at::Tensor>& grads,
                                        const c10::optional<std::vector<at::Tensor>>& residuals,
                                        const std::vector<int64_t>& cols,
                                        const c10::optional<std::vector<bool>>& by_rows, const char* op) {
  const std::size_t count = grads.size();
  TORCH_CHECK(cols.size() == count, op, ": ", count, " gradients but ", cols.size(), " column counts");
  TORCH_CHECK(!by_rows.has_value() || by_rows->size() == count, op, ": ", count, " gradients but ",
              by_rows.has_value() ? by_rows->size() : 0, " modes (give one per gradient, or None)");
  TORCH_CHECK(!residuals.has_value() || residuals->size() == count, op, ": ", count, " gradients but ",
              residuals.has_value() ? residuals->size() : 0, " residuals (give one per gradient, or None)");
  if (count > 0) hgc_dev::bucket_device(grads, op, "gradient");
  std::vector<EncodeSource> sources;
  for (std::size_t i = 0; i < count; ++i) {
    const auto res = residual_at(residuals, i);
    const bool rows = hgc::by_rows_at(by_rows, i);
    hgc::check_onebit_encode_args(grads[i], res, cols[i], hgc_dev::kDeviceType, rows);
    sources.push_back({grads[i], res, grads[i].numel(), cols[i], cols[i], 0, rows});
  }
  return sources;
}

}  // namespace

OnebitPayloads onebit_encode_many_device(const std::vector<at::Tensor>& grads,
                                         const c10::optional<std::vector<at::Tensor>>& residuals,
                                         const std::vector<int64_t>& cols,
                                         const c10::optional<std::vector<at::Tensor>>& scales,
                                         const c10::optional<std::vector<bool>>& by_rows) {
  return encode_sources(whole_sources(grads, residuals, cols, by_rows, "onebit_encode_many"), residuals.has_value(),
                        scales);
}

std::vector<at::Tensor> onebit_scales_many_device(const std::vector<at::Tensor>& grads,
                                                  const c10::optional<std::vector<at::Tensor>>& residuals,
                                                  const std::vector<int64_t>& cols,
                                                  const c10::optional<std::vector<bool>>& by_rows) {
  return std::get<1>(encode_sources(whole_sources(grads, residuals, cols, by_rows, "onebit_scales_many"),
                                    residuals.has_value(), c10::nullopt, false));
}

OnebitPayloads onebit_encode_columns_many_device(const std::vector<at::Tensor>& fulls,
                                                 const c10::optional<std::vector<at::Tensor>>& residuals,
                                                 const std::vector<int64_t>& full_cols,
                                                 const std::vector<int64_t>& col0, const std::vector<int64_t>& col1,
                                                 const c10::optional<std::vector<at::Tensor>>& scales) {
  constexpr const char* op = "onebit_encode_columns_many";
  const std::size_t count = fulls.size();
  TORCH_CHECK(full_cols.size() == count && col0.size() == count && col1.size() == count, op,
              ": give full_cols, col0 and col1 for every tensor");
  TORCH_CHECK(!residuals.has_value() || residuals->size() == count, op, ": ", count, " tensors but ",
              residuals.has_value() ? residuals->size() : 0, " residuals (give one per tensor, or None)");
  if (count > 0) hgc_dev::bucket_device(fulls, op, "tensor");
  std::vector<EncodeSource> sources;
  for (std::size_t i = 0; i < count; ++i) {
    const auto res = residual_at(residuals, i);
    hgc::check_onebit_encode_args(fulls[i], res, full_cols[i], hgc_dev::kDeviceType);
    hgc::check_column_window(fulls[i].numel(), full_cols[i], col0[i], col1[i], op);
    const int64_t rows = fulls[i].numel() / full_cols[i], cols = col1[i] - col0[i];
    sources.push_back({fulls[i], res, rows * cols, cols, full_cols[i], col0[i]});
  }
  return encode_sources(sources, residuals.has_value(), scales);
}

std::vector<at::Tensor> onebit_decode_sum_many_device(const std::vector<at::Tensor>& bits,
                                                      const std::vector<at::Tensor>& scales,
                                                      const std::vector<int64_t>& n, const std::vector<int64_t>& cols,
                                                      const std::vector<at::ScalarType>& dtypes, double scale,
                                                      const std::vector<c10::optional<at::Tensor>>& outs,
                                                      const c10::optional<std::vector<bool>>& by_rows) {
  constexpr const char* op = "onebit_decode_sum_many";
  const std::size_t count = bits.size();
  hgc::check_one_entry_per_tensor(op, "bits, scales, n, cols, dtypes, outs (and by_rows, or None)", count,
                                  {scales.size(), n.size(), cols.size(), dtypes.size(), outs.size(),
                                   by_rows.has_value() ? by_rows->size() : count});
  std::vector<at::Tensor> results;
  if (count == 0) return results;
  const at::Device device = hgc_dev::bucket_device(bits, op, "bits");
  int64_t K = -1;
  std::vector<hgc_dev::OnebitDecodeItem> items;
  for (std::size_t i = 0; i < count; ++i) {
    const bool rows = hgc::by_rows_at(by_rows, i);
    K = hgc::check_same_payload_count(
        op, i, hgc::check_onebit_decode_args(bits[i], scales[i], n[i], cols[i], dtypes[i], hgc_dev::kDeviceType, rows),
        K);
    results.push_back(hgc_decode_output(outs[i], n[i], dtypes[i], device, op));
    items.push_back({bits[i].data_ptr<uint8_t>(), bits[i].stride(0), scales[i].data_ptr<float>(), scales[i].stride(0),
                     n[i], cols[i], cols[i], results[i].data_ptr(), rows});
  }
  decode_items(items, dtypes, device, K, scale);
  return results;
}

void onebit_decode_columns_many_device(const std::vector<at::Tensor>& bits, const std::vector<at::Tensor>& scales,
                                       const std::vector<at::Tensor>& outs, const std::vector<int64_t>& full_cols,
                                       const std::vector<int64_t>& col0, const std::vector<int64_t>& col1) {
  constexpr const char* op = "onebit_decode_columns_many";
  const std::size_t count = outs.size();
  TORCH_CHECK(bits.size() == count && scales.size() == count && full_cols.size() == count && col0.size() == count &&
                  col1.size() == count,
              op, ": give bits, scales, full_cols, col0 and col1 for every out");
  if (count == 0) return;
  const at::Device device = hgc_dev::bucket_device(outs, op, "out");
  std::vector<hgc_dev::OnebitDecodeItem> items;
  std::vector<at::ScalarType> dtypes;
  for (std::size_t i = 0; i < count; ++i) {
    const at::Tensor& out = outs[i];
    hgc::check_onebit_columns_out(out, hgc_dev::kDeviceType, op);
    hgc::check_column_window(out.numel(), full_cols[i], col0[i], col1[i], op);
    const int64_t rows = out.numel() / full_cols[i], cols = col1[i] - col0[i], n = rows * cols;
    hgc::check_onebit_flat_payload(bits[i], scales[i], op);
    const auto stacked_bits = bits[i].unsqueeze(0), stacked_scales = scales[i].unsqueeze(0);
    hgc::check_onebit_decode_args(stacked_bits, stacked_scales, n, cols, out.scalar_type(), hgc_dev::kDeviceType);
    TORCH_CHECK(bits[i].device() == device, op, ": out is on ", device, ", payload ", i, " on ", bits[i].device());
    items.push_back({stacked_bits.data_ptr<uint8_t>(), 0, stacked_scales.data_ptr<float>(), 0, n, cols,
                     full_cols[i], at_element(out, col0[i])});
    dtypes.push_back(out.scalar_type());
  }
  decode_items(items, dtypes, device, 1, 1.0);
}

HGC_DEVICE_OPS(onebit, HGC_ONEBIT_OPS, HGC_ONEBIT_INTO_OPS)
