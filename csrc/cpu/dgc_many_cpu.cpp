// DGC's bucket ops on the CPU (declared in dgc_cpu.h and dgc_memory_cpu.h): the per-tensor
// kernels of dgc_cpu.cpp, dgc_index_cpu.cpp and dgc_memory_cpu.cpp, tensor by tensor (one host
// call each: there are no launches to save).
#include "dgc_cpu.h"
#include "dgc_index_cpu.h"
#include "dgc_memory_cpu.h"

#include "../payload_checks.h"

namespace {

using PayloadLists = std::vector<std::vector<at::Tensor>>;

}  // namespace

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<double>, std::vector<int64_t>>
dgc_select_many_cpu(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& k,
                    const std::vector<int64_t>& sample_count, const std::vector<int64_t>& keys) {
  hgc::check_one_entry_per_tensor("dgc_select_many", "xs, k, sample_count and keys", xs.size(),
                                  {k.size(), sample_count.size(), keys.size()});
  std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<double>, std::vector<int64_t>> res;
  auto& [indices, values, thresholds, paths] = res;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto [idx, vals, t, path] = dgc_select_cpu(xs[i], k[i], sample_count[i], keys[i]);
    indices.push_back(idx);
    values.push_back(vals);
    thresholds.push_back(t);
    paths.push_back(path);
  }
  return res;
}

std::vector<at::Tensor> dgc_index_encode_many_cpu(const std::vector<at::Tensor>& indices,
                                                  const std::vector<int64_t>& n) {
  hgc::check_one_entry_per_tensor("dgc_index_encode_many", "indices and n", indices.size(), {n.size()});
  std::vector<at::Tensor> codes;
  for (std::size_t i = 0; i < indices.size(); ++i) codes.push_back(dgc_index_encode_cpu(indices[i], n[i]));
  return codes;
}

std::vector<at::Tensor> dgc_scatter_sum_many_cpu(const PayloadLists& indices, const PayloadLists& values,
                                                 const std::vector<int64_t>& n,
                                                 const std::vector<at::ScalarType>& dtypes, double scale,
                                                 const std::vector<c10::optional<at::Tensor>>& outs) {
  hgc::check_dgc_sum_lists("dgc_scatter_sum_many", indices, values, n, dtypes, outs);
  std::vector<at::Tensor> results;
  for (std::size_t t = 0; t < indices.size(); ++t)
    results.push_back(dgc_scatter_sum_cpu(indices[t], values[t], n[t], dtypes[t], scale, outs[t]));
  return results;
}

std::vector<at::Tensor> dgc_decode_sum_many_cpu(const PayloadLists& codes, const PayloadLists& values,
                                                const std::vector<int64_t>& n,
                                                const std::vector<at::ScalarType>& dtypes, double scale,
                                                const std::vector<c10::optional<at::Tensor>>& outs) {
  hgc::check_dgc_sum_lists("dgc_decode_sum_many", codes, values, n, dtypes, outs);
  std::vector<at::Tensor> results;
  for (std::size_t t = 0; t < codes.size(); ++t) {
    std::vector<at::Tensor> indices;
    for (std::size_t r = 0; r < codes[t].size(); ++r)
      indices.push_back(dgc_index_decode_cpu(codes[t][r], values[t][r].numel(), n[t]));
    results.push_back(dgc_scatter_sum_cpu(indices, values[t], n[t], dtypes[t], scale, outs[t]));
  }
  return results;
}

void dgc_accumulate_many_cpu(const std::vector<at::Tensor>& u, const std::vector<at::Tensor>& v,
                             const std::vector<at::Tensor>& g, double momentum, bool nesterov, double coef) {
  hgc::check_one_entry_per_tensor("dgc_accumulate_many", "g, u and v", g.size(), {u.size(), v.size()});
  for (std::size_t i = 0; i < g.size(); ++i) {
    at::Tensor ui = u[i], vi = v[i];
    dgc_accumulate_cpu(ui, vi, g[i], momentum, nesterov, coef);
  }
}

void dgc_mask_many_cpu(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& v,
                       const c10::optional<std::vector<at::Tensor>>& u) {
  hgc::check_one_entry_per_tensor("dgc_mask_many", "v, indices (and u, or None)", v.size(),
                                  {indices.size(), u.has_value() ? u->size() : v.size()});
  for (std::size_t i = 0; i < v.size(); ++i) {
    const at::Tensor idx = indices[i].to(at::kLong);
    v[i].view(-1).index_fill_(0, idx, 0);
    if (u.has_value()) (*u)[i].view(-1).index_fill_(0, idx, 0);
  }
}
