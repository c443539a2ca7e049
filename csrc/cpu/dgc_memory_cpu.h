// DGC's per-rank state update, CPU: momentum correction and accumulation in one pass
// (see horovod_gradcomp/dgc_memory.py for the algorithm).
#pragma once
#include <torch/extension.h>

// In place, element by element (u, v, g contiguous, one shape, fp32 or fp64 on the CPU):
//   h = g * coef          (skipped when coef == 1)
//   u = u * momentum + h
//   v = v + u             (nesterov: v = (v + h) + momentum * u)
// Every product and sum rounds to the tensors' dtype separately (no fused multiply-add),
// which is what the same sequence of torch ops computes.
void dgc_accumulate_cpu(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                        double coef);
