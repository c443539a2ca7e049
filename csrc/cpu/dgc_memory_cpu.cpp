// DGC momentum correction, CPU: one pass over (g, u, v) instead of the three or four
// passes of separate torch ops (the step of one value: ../dgc_accumulate_step.h).
#include "dgc_memory_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "../checks.h"
#include "../dgc_accumulate_step.h"

namespace {

constexpr int64_t kGrain = 1 << 15;

// The flags as template arguments: each of the four loops is compiled without branches.
template <typename T, bool kClip, bool kNesterov>
void accumulate_range(T* u, T* v, const T* g, T m, T c, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) hgc::dgc_accumulate_step(u[i], v[i], g[i], m, c, kClip, kNesterov);
}

template <typename T>
void accumulate(T* u, T* v, const T* g, int64_t n, T m, T c, bool clip, bool nesterov) {
  at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (clip) {
      nesterov ? accumulate_range<T, true, true>(u, v, g, m, c, lo, hi)
               : accumulate_range<T, true, false>(u, v, g, m, c, lo, hi);
    } else {
      nesterov ? accumulate_range<T, false, true>(u, v, g, m, c, lo, hi)
               : accumulate_range<T, false, false>(u, v, g, m, c, lo, hi);
    }
  });
}

}  // namespace

void dgc_accumulate_cpu(at::Tensor& u, at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                        double coef) {
  hgc::check_dgc_accumulate_args(u, v, g, momentum, at::kCPU);
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "dgc_accumulate", [&] {
    accumulate<scalar_t>(u.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), g.numel(),
                         static_cast<scalar_t>(momentum), static_cast<scalar_t>(coef), coef != 1.0, nesterov);
  });
}
