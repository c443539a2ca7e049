// The counter-based splitmix64 stream of QSGD and DGC, one definition for csrc/cpu and
// csrc/device so that both devices draw the same numbers (plain C++, no PyTorch headers).
#pragma once

#include <cstdint>

#include "host_device.h"

namespace hgc {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's output finalizer.
HGC_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Where sample j of DGC's threshold estimate reads in a tensor of n values:
// mix64(key + (j + 1) * golden) scaled to [0, n) (the high word of the 128-bit product).
HGC_HOST_DEVICE inline int64_t dgc_sample_place(uint64_t key, int64_t j, int64_t n) {
  const uint64_t h = mix64(key + static_cast<uint64_t>(j + 1) * kGolden);
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(__umul64hi(h, static_cast<uint64_t>(n)));
#else
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(n)) >> 64);
#endif
}

}  // namespace hgc
