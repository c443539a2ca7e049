// Torch ops of the DGC device path (dgc_ops.cpp): CUDA tensors in _C (WITH_CUDA), CPU tensors in
// the twin (_C_twin). Same arguments, checks, messages and results as the CPU ops of
// csrc/cpu/dgc_cpu.h, dgc_index_cpu.h and dgc_memory_cpu.h.
#pragma once
#include <torch/extension.h>

#include <tuple>
#include <vector>

std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select_device(const at::Tensor& x, int64_t k,
                                                                      int64_t sample_count, int64_t key);
at::Tensor dgc_scatter_sum_device(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values,
                                  int64_t n, at::ScalarType dtype, double scale,
                                  const c10::optional<at::Tensor>& out);
at::Tensor dgc_index_encode_device(const at::Tensor& idx, int64_t n);
at::Tensor dgc_index_decode_device(const at::Tensor& code, int64_t count, int64_t n);
void dgc_accumulate_device(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                           double coef);

// A bucket at once (see dgc_device.h's *_many): the per-tensor ops' results, bitwise, in a
// fixed number of device algorithm calls whatever the tensor count, with one read-back per
// bucket (the decode-sum's validity flags). Every tensor of a bucket on one device.
using DgcPayloadLists = std::vector<std::vector<at::Tensor>>;
// dgc_scatter_sum of each tensor t: scale * the sum of its K payloads (indices[t][r], values[t][r];
// one K for the bucket) as n[t] values of dtypes[t] (into outs[t] when given).
std::vector<at::Tensor> dgc_scatter_sum_many_device(const DgcPayloadLists& indices, const DgcPayloadLists& values,
                                                    const std::vector<int64_t>& n,
                                                    const std::vector<at::ScalarType>& dtypes, double scale,
                                                    const std::vector<c10::optional<at::Tensor>>& outs);
// The same from the payloads as they arrive: codes[t][r] is an index code (dgc_index_encode's),
// of values[t][r].numel() indices: dgc_index_decode of every code, then dgc_scatter_sum.
std::vector<at::Tensor> dgc_decode_sum_many_device(const DgcPayloadLists& codes, const DgcPayloadLists& values,
                                                   const std::vector<int64_t>& n,
                                                   const std::vector<at::ScalarType>& dtypes, double scale,
                                                   const std::vector<c10::optional<at::Tensor>>& outs);
// dgc_accumulate_ of every (u[i], v[i], g[i]) with one momentum, nesterov and coef.
void dgc_accumulate_many_device(const std::vector<at::Tensor>& u, const std::vector<at::Tensor>& v,
                                const std::vector<at::Tensor>& g, double momentum, bool nesterov, double coef);
// v[i].view(-1).index_fill_(0, indices[i], 0) (and u[i]'s, when us is given) for every tensor: the
// sent entries leave the accumulation (and the momentum). indices[i]: the selection's (1-D,
// dgc_index_type of v[i].numel()); out-of-range ones are skipped, not refused.
void dgc_mask_many_device(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& v,
                          const c10::optional<std::vector<at::Tensor>>& u);
// dgc_select of every xs[i] with its own k[i], sample_count[i] and key[i] -> (indices, values,
// thresholds, paths), bitwise the per-tensor op's; a fixed number of device calls whatever the
// tensor count (dgc_device.h's dgc_threshold_many, dgc_compact_many), one read-back of the counts
// per bucket (two when an estimate is off by more than 2x).
using DgcSelection =
    std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<double>, std::vector<int64_t>>;
DgcSelection dgc_select_many_device(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& k,
                                    const std::vector<int64_t>& sample_count, const std::vector<int64_t>& keys);
// dgc_index_encode of every indices[i] (for n[i] values), bitwise: one reduction with one
// read-back of every tensor's largest gap and validity, one for_each writing the codes.
std::vector<at::Tensor> dgc_index_encode_many_device(const std::vector<at::Tensor>& indices,
                                                     const std::vector<int64_t>& n);
