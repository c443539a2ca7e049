// QSGD's bucket ops on the CPU (declared in qsgd_cpu.h): the per-tensor kernels of qsgd_cpu.cpp,
// tensor by tensor (one host call each: there are no launches to save).
#include "qsgd_cpu.h"

#include "../checks.h"
#include "../payload_checks.h"

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_fixed_many_cpu(
    const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket, bool max_norm, const std::vector<int64_t>& keys) {
  TORCH_CHECK(keys.size() == xs.size(), "qsgd_encode_fixed_many: ", xs.size(), " tensors but ", keys.size(), " keys");
  std::vector<at::Tensor> norms, packed;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto [nr, pk] = qsgd_encode_fixed_cpu(xs[i], s, bucket, max_norm, keys[i]);
    norms.push_back(nr);
    packed.push_back(pk);
  }
  return {norms, packed};
}

std::vector<at::Tensor> qsgd_decode_fixed_many_cpu(const std::vector<at::Tensor>& norms,
                                                   const std::vector<at::Tensor>& packed,
                                                   const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                   const std::vector<at::ScalarType>& dtypes, double scale,
                                                   const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = norms.size();
  hgc::check_one_entry_per_tensor("qsgd_decode_fixed_many", "norms, packed, n, dtypes and outs", count,
                                  {packed.size(), n.size(), dtypes.size(), outs.size()});
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i)
    results.push_back(qsgd_decode_fixed_cpu(norms[i], packed[i], n[i], s, bucket, dtypes[i], scale, outs[i]));
  return results;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>> qsgd_encode_elias_many_cpu(
    const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket, bool max_norm, const std::vector<int64_t>& keys,
    int64_t group_buckets) {
  TORCH_CHECK(keys.size() == xs.size(), "qsgd_encode_elias_many: ", xs.size(), " tensors but ", keys.size(), " keys");
  std::vector<at::Tensor> norms, nbits, streams;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto [nr, nb, st] = qsgd_encode_elias_cpu(xs[i], s, bucket, max_norm, keys[i], group_buckets);
    norms.push_back(nr);
    nbits.push_back(nb);
    streams.push_back(st);
  }
  return {norms, nbits, streams};
}

std::vector<at::Tensor> qsgd_decode_elias_many_cpu(const std::vector<std::vector<at::Tensor>>& norms,
                                                   const std::vector<std::vector<at::Tensor>>& nbits,
                                                   const std::vector<std::vector<at::Tensor>>& streams,
                                                   const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                   int64_t group_buckets, const std::vector<at::ScalarType>& dtypes,
                                                   double scale, const std::vector<c10::optional<at::Tensor>>& outs) {
  hgc::check_qsgd_elias_many_lists(norms, nbits, streams, n, dtypes, outs);
  const std::size_t count = norms.size();
  std::vector<at::Tensor> results;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t K = norms[i].size();
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
