// The LSB-first bit reader of QSGD's Elias-coded payloads, shared by the CPU and CUDA
// decoders (plain C++, no PyTorch headers). Reads past the end see zero bits, so a truncated
// or corrupt stream decodes to a 0 ("malformed") rather than reading out of bounds.
#pragma once
#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace hgc {

struct EliasBitReader {
  const uint8_t* data;
  int64_t size;
  int64_t pos = 0;

  // The next bits from pos on (at least 57 valid ones; zeros past the end).
  HGC_HOST_DEVICE uint64_t peek() const {
    const int64_t byte = pos >> 3;
    uint64_t w = 0;
#if defined(__CUDA_ARCH__)
    for (int t = 0; t < 8; ++t)
      if (byte + t < size) w |= static_cast<uint64_t>(data[byte + t]) << (8 * t);
#else
    if (byte + 8 <= size) {
      std::memcpy(&w, data + byte, 8);
    } else {
      for (int64_t b = byte; b < size; ++b) w |= static_cast<uint64_t>(data[b]) << (8 * (b - byte));
    }
#endif
    return w >> (pos & 7);
  }

  // Elias gamma; returns 0 on a malformed code.
  HGC_HOST_DEVICE uint64_t gamma() {
    const uint64_t w = peek();
    if (w == 0) return 0;
#if defined(__CUDA_ARCH__)
    const int N = __ffsll(static_cast<long long>(w)) - 1;
#else
    const int N = __builtin_ctzll(w);
#endif
    if (N > 31) return 0;
    if (2 * N + 1 <= 57) {
      pos += 2 * N + 1;
      return (uint64_t(1) << N) | ((w >> (N + 1)) & ((uint64_t(1) << N) - 1));
    }
    pos += N + 1;
    const uint64_t m = peek() & ((uint64_t(1) << N) - 1);
    pos += N;
    return (uint64_t(1) << N) | m;
  }

  // One bit; the caller keeps pos < 8 * size.
  HGC_HOST_DEVICE uint32_t bit() {
    const uint32_t b = (data[pos >> 3] >> (pos & 7)) & 1;
    ++pos;
    return b;
  }
};

}  // namespace hgc
