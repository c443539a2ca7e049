// The chunk table of a multi-tensor stage (multi_tensor.cuh) as plain C++ (no Thrust), so that
// the functors of the device sources can read it too: a chunk is up to C = 2^shift consecutive
// indices of one tensor; position p of a stage belongs to chunk p >> shift, element p & (C - 1).
#pragma once

#include <cstdint>

#include "../host_device.h"

namespace hgc_dev {

// One chunk of a stage: up to C consecutive indices of one tensor, [first, first + len), len >= 1.
// I: the index type of the stage's mapping (uint32_t or int64_t).
template <typename I> struct Chunk {
  I tensor, first, len;
};

// A put() stage's chunk table read the other way round, for the algorithms other than run() that
// walk the same positions (DGC's segmented scans: a scan by tensor over [0, positions)): position
// p's tensor and its index there, found by a shift and a mask as MultiFor finds them (no search).
// A padding position (the tail of a tensor's last chunk) names its chunk's tensor and no index.
struct ChunkMap {
  const void* chunk;
  int shift;
  bool narrow;

  // Position p's tensor; its index in *i, or -1 when p is padding.
  HGC_HOST_DEVICE int64_t at(int64_t p, int64_t* i) const {
    const int64_t e = p & ((int64_t(1) << shift) - 1);
    int64_t t, first, len;
    if (narrow) {
      const Chunk<uint32_t> c = static_cast<const Chunk<uint32_t>*>(chunk)[p >> shift];
      t = c.tensor, first = c.first, len = c.len;
    } else {
      const Chunk<int64_t> c = static_cast<const Chunk<int64_t>*>(chunk)[p >> shift];
      t = c.tensor, first = c.first, len = c.len;
    }
    *i = e < len ? first + e : -1;
    return t;
  }
  HGC_HOST_DEVICE int64_t tensor(int64_t p) const {
    int64_t i;
    return at(p, &i);
  }
};

}  // namespace hgc_dev
