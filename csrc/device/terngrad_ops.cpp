// Torch ops of TernGrad's device path (see ops_common.h): the CPU ops' checks and messages,
// outputs on the input's device, the launchers of terngrad_device.cu on the current stream.
// Host round trips: max_abs and sigma read their one double back (the scale is agreed on the
// host); encode and the decodes none. The bucket ops (*_many) read nothing back: the scale
// stats stay in one device tensor, which the caller reads once for the whole bucket.
#include "terngrad_ops.h"

#include "../checks.h"
#include "../payload_checks.h"
#include "ops_common.h"
#include "registry.h"
#include "terngrad_device.h"

double terngrad_max_abs_device(const at::Tensor& grad) {
  hgc::check_values_input(grad, hgc_dev::kDeviceType, "grad");
  const hgc_dev::DeviceGuard guard(grad.device());
  return hgc_dev::terngrad_max_abs(hgc_dev::current_ctx(), hgc_dev::dev_dtype(grad.scalar_type()), grad.data_ptr(),
                                   grad.numel());
}

double terngrad_sigma_device(const at::Tensor& grad) {
  hgc::check_values_input(grad, hgc_dev::kDeviceType, "grad");
  const hgc_dev::DeviceGuard guard(grad.device());
  return hgc_dev::terngrad_sigma(hgc_dev::current_ctx(), hgc_dev::dev_dtype(grad.scalar_type()), grad.data_ptr(),
                                 grad.numel());
}

std::tuple<at::Tensor, at::Tensor> terngrad_encode_device(const at::Tensor& grad, double scale, double clip,
                                                          int64_t key0, int64_t key1) {
  hgc::check_values_input(grad, hgc_dev::kDeviceType, "grad");
  const int64_t n = grad.numel();
  hgc::check_terngrad_encode_args(n, scale, clip, key0, key1);
  const hgc_dev::DeviceGuard guard(grad.device());
  auto codes = at::empty({(n + 3) / 4}, grad.options().dtype(at::kByte));
  auto scales = at::full({1}, scale, grad.options().dtype(at::kFloat));
  hgc_dev::terngrad_encode(hgc_dev::current_ctx(), hgc_dev::dev_dtype(grad.scalar_type()), grad.data_ptr(), n, scale,
                           clip, static_cast<uint32_t>(key0), static_cast<uint32_t>(key1), codes.data_ptr<uint8_t>());
  return {codes, scales};
}

at::Tensor terngrad_decode_sum_device(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                      at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out_opt) {
  const int64_t K = hgc::check_terngrad_decode_args(codes, scales, n, dtype, hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(codes.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, codes.device(), "terngrad_decode");
  if (n == 0) return out;
  hgc_dev::terngrad_decode_sum(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), codes.data_ptr<uint8_t>(),
                               codes.stride(0), scales.data_ptr<float>(), scales.stride(0), K, n, scale,
                               out.data_ptr());
  return out;
}

at::Tensor terngrad_sum_levels_device(const at::Tensor& codes, int64_t n, int64_t width) {
  hgc::check_device_type(codes, hgc_dev::kDeviceType, "codes");
  const int64_t K = hgc::check_terngrad_sum_levels_args(codes, n, width);
  const hgc_dev::DeviceGuard guard(codes.device());
  auto levels = at::empty({(n * width + 7) / 8}, codes.options());
  if (n == 0) return levels;
  hgc_dev::terngrad_sum_levels(hgc_dev::current_ctx(), codes.data_ptr<uint8_t>(), codes.stride(0), K, n,
                               static_cast<int>(width), levels.data_ptr<uint8_t>());
  return levels;
}

at::Tensor terngrad_sum_decode_device(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                                      at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  hgc::check_device_type(levels, hgc_dev::kDeviceType, "levels");
  hgc::check_terngrad_sum_decode_args(levels, n, k, width);
  const hgc_dev::DeviceGuard guard(levels.device());
  const hgc_dev::DType dt = hgc_dev::dev_dtype(dtype);
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, levels.device(), "terngrad_sum_decode");
  if (n == 0) return out;
  hgc_dev::terngrad_sum_decode(hgc_dev::current_ctx(), dt, levels.data_ptr<uint8_t>(), n, k, static_cast<int>(width),
                               mult, out.data_ptr());
  return out;
}

at::Tensor terngrad_scale_stats_many_device(const std::vector<at::Tensor>& grads, bool with_sigma) {
  constexpr const char* op = "terngrad_scale_stats_many";
  const int64_t count = static_cast<int64_t>(grads.size());
  if (count == 0) return at::zeros({2, 0}, at::kDouble);
  const at::Device device = hgc_dev::bucket_device(grads, op, "gradient");
  std::vector<at::ScalarType> dtypes;
  for (const at::Tensor& g : grads) {
    hgc::check_values_input(g, hgc_dev::kDeviceType, "grad");
    dtypes.push_back(g.scalar_type());
  }
  const hgc_dev::DeviceGuard guard(device);
  at::Tensor stats = at::zeros({2, count}, grads[0].options().dtype(at::kDouble));
  double* max_abs = stats.data_ptr<double>();
  double* sigma = max_abs + count;
  std::vector<hgc_dev::TerngradStatsItem> items;
  for (int64_t i = 0; i < count; ++i) {
    items.push_back({grads[i].data_ptr(), grads[i].numel(), max_abs + i, with_sigma ? sigma + i : nullptr});
  }
  hgc_dev::launch_by_dtype(dtypes, items, [](hgc_dev::DType dt, const hgc_dev::TerngradStatsItem* group, int64_t size) {
    hgc_dev::terngrad_scale_stats_many(hgc_dev::current_ctx(), dt, group, size);
  });
  return stats;
}

TerngradPayloads terngrad_encode_many_device(const std::vector<at::Tensor>& grads, const std::vector<double>& scales,
                                             const std::vector<double>& clips, const std::vector<int64_t>& key0s,
                                             const std::vector<int64_t>& key1s) {
  constexpr const char* op = "terngrad_encode_many";
  const std::size_t count = grads.size();
  TORCH_CHECK(scales.size() == count && clips.size() == count && key0s.size() == count && key1s.size() == count, op,
              ": ", count, " gradients but ", scales.size(), " scales, ", clips.size(), " clips, ", key0s.size(),
              " key0s and ", key1s.size(), " key1s (give one of each per gradient)");
  std::vector<at::Tensor> codes_out, scales_out;
  if (count == 0) return {codes_out, scales_out};
  const at::Device device = hgc_dev::bucket_device(grads, op, "gradient");
  int64_t code_bytes = 0;
  std::vector<at::ScalarType> dtypes;
  std::vector<float> scale_values;
  for (std::size_t i = 0; i < count; ++i) {
    hgc::check_values_input(grads[i], hgc_dev::kDeviceType, "grad");
    hgc::check_terngrad_encode_args(grads[i].numel(), scales[i], clips[i], key0s[i], key1s[i]);
    code_bytes += (grads[i].numel() + 3) / 4;
    dtypes.push_back(grads[i].scalar_type());
    scale_values.push_back(static_cast<float>(scales[i]));  // as terngrad_encode's scale buffer
  }
  const hgc_dev::DeviceGuard guard(device);
  const auto options = grads[0].options();
  at::Tensor codes = at::empty({code_bytes}, options.dtype(at::kByte));
  const at::Tensor scale_buf = hgc_dev::upload(  // one copy, not waited for
      at::from_blob(scale_values.data(), {static_cast<int64_t>(count)}, at::kFloat).clone(), device);
  std::vector<hgc_dev::TerngradEncodeItem> items;
  for (std::size_t i = 0, at_byte = 0; i < count; ++i) {
    const int64_t n = grads[i].numel(), nbytes = (n + 3) / 4;
    codes_out.push_back(codes.narrow(0, static_cast<int64_t>(at_byte), nbytes));
    scales_out.push_back(scale_buf.narrow(0, static_cast<int64_t>(i), 1));
    items.push_back({grads[i].data_ptr(), n, scales[i], clips[i], static_cast<uint32_t>(key0s[i]),
                     static_cast<uint32_t>(key1s[i]), codes_out[i].data_ptr<uint8_t>()});
    at_byte += static_cast<std::size_t>(nbytes);
  }
  hgc_dev::launch_by_dtype(dtypes, items, [](hgc_dev::DType dt, const hgc_dev::TerngradEncodeItem* group, int64_t size) {
    hgc_dev::terngrad_encode_many(hgc_dev::current_ctx(), dt, group, size);
  });
  return {codes_out, scales_out};
}

std::vector<at::Tensor> terngrad_decode_sum_many_device(const std::vector<at::Tensor>& codes,
                                                        const std::vector<at::Tensor>& scales,
                                                        const std::vector<int64_t>& n,
                                                        const std::vector<at::ScalarType>& dtypes, double scale,
                                                        const std::vector<c10::optional<at::Tensor>>& outs) {
  constexpr const char* op = "terngrad_decode_sum_many";
  const std::size_t count = codes.size();
  hgc::check_one_entry_per_tensor(op, "codes, scales, n, dtypes and outs", count,
                                  {scales.size(), n.size(), dtypes.size(), outs.size()});
  std::vector<at::Tensor> results;
  if (count == 0) return results;
  const at::Device device = hgc_dev::bucket_device(codes, op, "codes");
  const hgc_dev::DeviceGuard guard(device);
  int64_t K = -1;
  std::vector<hgc_dev::TerngradDecodeItem> items;
  for (std::size_t i = 0; i < count; ++i) {
    K = hgc::check_same_payload_count(
        op, i, hgc::check_terngrad_decode_args(codes[i], scales[i], n[i], dtypes[i], hgc_dev::kDeviceType), K);
    results.push_back(hgc_decode_output(outs[i], n[i], dtypes[i], device, op));
    items.push_back({codes[i].data_ptr<uint8_t>(), codes[i].stride(0), scales[i].data_ptr<float>(),
                     scales[i].stride(0), n[i], results[i].data_ptr()});
  }
  hgc_dev::launch_by_dtype(dtypes, items, [&](hgc_dev::DType dt, const hgc_dev::TerngradDecodeItem* group, int64_t size) {
    hgc_dev::terngrad_decode_sum_many(hgc_dev::current_ctx(), dt, group, size, K, scale);
  });
  return results;
}

HGC_DEVICE_OPS(terngrad, HGC_TERNGRAD_OPS, HGC_TERNGRAD_INTO_OPS)
