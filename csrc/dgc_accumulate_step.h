// DGC's momentum correction of one value, shared by the CPU and CUDA kernels (plain C++, no
// PyTorch headers, so that nvcc compiles it too). Every product and sum is its own rounded
// step; the builds forbid fused multiply-adds (-ffp-contract=off, --fmad=false), so both
// devices and the torch reference agree bit for bit.
#pragma once

#include "host_device.h"

namespace hgc {

// h = g * c (when clip); u = u * m + h; v = v + u (nesterov: v = (v + h) + u * m).
template <typename T>
HGC_HOST_DEVICE inline void dgc_accumulate_step(T& u, T& v, T g, T m, T c, bool clip, bool nesterov) {
  T h = g;
  if (clip) h = h * c;
  const T mu = u * m;
  const T un = mu + h;
  u = un;
  if (nesterov) {
    const T vh = v + h;
    const T mun = un * m;
    v = vh + mun;
  } else {
    v = v + un;
  }
}

}  // namespace hgc
