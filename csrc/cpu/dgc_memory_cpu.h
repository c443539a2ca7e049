// DGC's per-rank state update, CPU: momentum correction and accumulation in one pass
// (see horovod_gradcomp/state/dgc_memory.py for the algorithm).
#pragma once
#include <torch/extension.h>

#include <vector>

// In place, element by element (u, v, g contiguous, one shape, fp32 or fp64 on the CPU):
//   h = g * coef          (skipped when coef == 1)
//   u = u * momentum + h
//   v = v + u             (nesterov: v = (v + h) + momentum * u)
// Every product and sum rounds to the tensors' dtype separately (no fused multiply-add),
// which is what the same sequence of torch ops computes.
void dgc_accumulate_cpu(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                        double coef);

// ---- the bucket ops (dgc_many_cpu.cpp) -------------------------------------------------------

// dgc_accumulate_cpu of every (u[i], v[i], g[i]), in place.
void dgc_accumulate_many_cpu(const std::vector<at::Tensor>& u, const std::vector<at::Tensor>& v,
                             const std::vector<at::Tensor>& g, double momentum, bool nesterov, double coef);

// After a selection: v[i] (and u[i], when u is given) set to zero at the places indices[i]
// (int32 or int64) names, in place.
void dgc_mask_many_cpu(const std::vector<at::Tensor>& indices, const std::vector<at::Tensor>& v,
                       const c10::optional<std::vector<at::Tensor>>& u);
