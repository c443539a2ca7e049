// onebit's bucket ops on the CPU (declared in onebit_cpu.h): the per-tensor kernels of
// onebit_cpu.cpp, tensor by tensor (one host call each: there are no launches to save).
#include "onebit_cpu.h"

#include "../checks.h"

namespace {

// Entry i of an optional list of tensors (None: none).
c10::optional<at::Tensor> entry_at(const c10::optional<std::vector<at::Tensor>>& list, std::size_t i) {
  return list.has_value() ? c10::optional<at::Tensor>((*list)[i]) : c10::nullopt;
}

}  // namespace

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> onebit_encode_many_cpu(
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
    auto [b, s] = onebit_encode_cpu(grads[i], entry_at(residuals, i), cols[i], entry_at(given, i),
                                    hgc::by_rows_at(by_rows, i));
    bits.push_back(b);
    scales.push_back(s);
  }
  return {bits, scales};
}

std::vector<at::Tensor> onebit_scales_many_cpu(const std::vector<at::Tensor>& grads,
                                               const c10::optional<std::vector<at::Tensor>>& residuals,
                                               const std::vector<int64_t>& cols,
                                               const c10::optional<std::vector<bool>>& by_rows) {
  TORCH_CHECK(cols.size() == grads.size() && (!residuals.has_value() || residuals->size() == grads.size()) &&
                  (!by_rows.has_value() || by_rows->size() == grads.size()),
              "onebit_scales_many: give one column count (and one residual, or None; one mode, or None) per gradient");
  std::vector<at::Tensor> scales;
  for (std::size_t i = 0; i < grads.size(); ++i)
    scales.push_back(onebit_scales_cpu(grads[i], entry_at(residuals, i), cols[i], hgc::by_rows_at(by_rows, i)));
  return scales;
}

std::vector<at::Tensor> onebit_decode_sum_many_cpu(const std::vector<at::Tensor>& bits,
                                                   const std::vector<at::Tensor>& scales, const std::vector<int64_t>& n,
                                                   const std::vector<int64_t>& cols,
                                                   const std::vector<at::ScalarType>& dtypes, double scale,
                                                   const std::vector<c10::optional<at::Tensor>>& outs,
                                                   const c10::optional<std::vector<bool>>& by_rows) {
  const std::size_t count = bits.size();
  hgc::check_one_entry_per_tensor("onebit_decode_sum_many", "bits, scales, n, cols, dtypes, outs (and by_rows, or None)",
                                  count, {scales.size(), n.size(), cols.size(), dtypes.size(), outs.size(),
                                          by_rows.has_value() ? by_rows->size() : count});
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i)
    results.push_back(onebit_decode_sum_cpu(bits[i], scales[i], n[i], cols[i], dtypes[i], scale, outs[i],
                                            hgc::by_rows_at(by_rows, i)));
  return results;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> onebit_encode_columns_many_cpu(
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
    auto [b, s] = onebit_encode_columns_cpu(fulls[i], entry_at(residuals, i), full_cols[i], col0[i], col1[i],
                                            entry_at(given, i));
    bits.push_back(b);
    scales.push_back(s);
  }
  return {bits, scales};
}

void onebit_decode_columns_many_cpu(const std::vector<at::Tensor>& bits, const std::vector<at::Tensor>& scales,
                                    const std::vector<at::Tensor>& outs, const std::vector<int64_t>& full_cols,
                                    const std::vector<int64_t>& col0, const std::vector<int64_t>& col1) {
  const std::size_t count = outs.size();
  TORCH_CHECK(bits.size() == count && scales.size() == count && full_cols.size() == count && col0.size() == count &&
                  col1.size() == count,
              "onebit_decode_columns_many: give bits, scales, full_cols, col0 and col1 for every out");
  for (std::size_t i = 0; i < count; ++i)
    onebit_decode_columns_cpu(bits[i], scales[i], outs[i], full_cols[i], col0[i], col1[i]);
}
