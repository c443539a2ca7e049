// DGC sparsification codec, CPU kernels (see horovod_gradcomp/codecs/dgc.py for the
// selection rule, the sampling stream and the wire format).
#pragma once
#include <torch/extension.h>
#include <tuple>
#include <vector>

// Select about k of the n values of x (contiguous fp16/bf16/fp32/fp64) by magnitude.
// sample_count > 0: estimate the threshold from sample_count values drawn at random
// (stream `key`), correct it if the count is off by more than 2x; sample_count == 0:
// exact threshold (the k-th largest magnitude). The selected set is always
// {i : |x_i| >= t} with t > 0 (zeros are never selected; NaN counts as larger than inf).
// Returns (indices int32 when n < 2^31 else int64, ascending; values of x's dtype;
// t as a double; path: 0 = sampled threshold accepted, 1 = refined among the candidates
// above the sampled threshold, 2 = exact selection over all values).
std::tuple<at::Tensor, at::Tensor, double, int64_t> dgc_select_cpu(const at::Tensor& x, int64_t k,
                                                                   int64_t sample_count, int64_t key);

// scale * sum_k scatter(indices[k], values[k]) as a flat tensor of n values of `dtype`
// (accumulated in float32, float64 for fp64, ranks in order). Each payload's indices
// must be strictly increasing and < n. Written into `out` when given.
at::Tensor dgc_scatter_sum_cpu(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& values,
                               int64_t n, at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out);

// ---- the bucket ops (dgc_many_cpu.cpp; the state ops' are in dgc_memory_cpu.h) ----------------
// The ops above applied to a bucket's tensors one after the other: the same results as the
// device's bucket ops (csrc/device/dgc_ops.h). Each checks that every per-tensor list has one
// entry per tensor, and the payload lists that every tensor has as many payloads as tensor 0
// (a bucket's tensors come from the same K ranks).

// dgc_select_cpu of every xs[i] with its own k, sample_count and key: (indices, values,
// thresholds, paths), one entry per tensor.
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<double>, std::vector<int64_t>>
dgc_select_many_cpu(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& k,
                    const std::vector<int64_t>& sample_count, const std::vector<int64_t>& keys);

// dgc_index_encode_cpu (dgc_index_cpu.h) of every indices[i] with its n[i].
std::vector<at::Tensor> dgc_index_encode_many_cpu(const std::vector<at::Tensor>& indices,
                                                  const std::vector<int64_t>& n);

// dgc_scatter_sum_cpu of every tensor's payloads (indices[t][r], values[t][r]).
std::vector<at::Tensor> dgc_scatter_sum_many_cpu(const std::vector<std::vector<at::Tensor>>& indices,
                                                 const std::vector<std::vector<at::Tensor>>& values,
                                                 const std::vector<int64_t>& n,
                                                 const std::vector<at::ScalarType>& dtypes, double scale,
                                                 const std::vector<c10::optional<at::Tensor>>& outs);

// dgc_scatter_sum_many_cpu of index codes: each codes[t][r] decoded by dgc_index_decode_cpu
// (as many indices as values[t][r] has values) first.
std::vector<at::Tensor> dgc_decode_sum_many_cpu(const std::vector<std::vector<at::Tensor>>& codes,
                                                const std::vector<std::vector<at::Tensor>>& values,
                                                const std::vector<int64_t>& n,
                                                const std::vector<at::ScalarType>& dtypes, double scale,
                                                const std::vector<c10::optional<at::Tensor>>& outs);
