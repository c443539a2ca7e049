// TernGrad's bucket ops on the CPU (declared in terngrad_cpu.h): the per-tensor kernels of
// terngrad_cpu.cpp, tensor by tensor (one host call each: there are no launches to save).
#include "terngrad_cpu.h"

#include "../checks.h"

at::Tensor terngrad_scale_stats_many_cpu(const std::vector<at::Tensor>& grads, bool with_sigma) {
  const int64_t count = static_cast<int64_t>(grads.size());
  at::Tensor stats = at::zeros({2, count}, at::kDouble);
  auto acc = stats.accessor<double, 2>();
  for (int64_t i = 0; i < count; ++i) {
    acc[0][i] = terngrad_max_abs_cpu(grads[i]);
    if (with_sigma) acc[1][i] = terngrad_sigma_cpu(grads[i]);
  }
  return stats;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> terngrad_encode_many_cpu(
    const std::vector<at::Tensor>& grads, const std::vector<double>& scales, const std::vector<double>& clips,
    const std::vector<int64_t>& key0s, const std::vector<int64_t>& key1s) {
  const std::size_t count = grads.size();
  TORCH_CHECK(scales.size() == count && clips.size() == count && key0s.size() == count && key1s.size() == count,
              "terngrad_encode_many: give a scale, a clip, a key0 and a key1 per gradient");
  std::vector<at::Tensor> codes, scale_bufs;
  for (std::size_t i = 0; i < count; ++i) {
    auto [c, s] = terngrad_encode_cpu(grads[i], scales[i], clips[i], key0s[i], key1s[i]);
    codes.push_back(c);
    scale_bufs.push_back(s);
  }
  return {codes, scale_bufs};
}

std::vector<at::Tensor> terngrad_decode_sum_many_cpu(const std::vector<at::Tensor>& codes,
                                                     const std::vector<at::Tensor>& scales,
                                                     const std::vector<int64_t>& n,
                                                     const std::vector<at::ScalarType>& dtypes, double scale,
                                                     const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = codes.size();
  hgc::check_one_entry_per_tensor("terngrad_decode_sum_many", "codes, scales, n, dtypes and outs", count,
                                  {scales.size(), n.size(), dtypes.size(), outs.size()});
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i)
    results.push_back(terngrad_decode_sum_cpu(codes[i], scales[i], n[i], dtypes[i], scale, outs[i]));
  return results;
}
