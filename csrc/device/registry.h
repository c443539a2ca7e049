// Registration of a codec's device kernels with the dispatcher (HGC_DEVICE_OPS in each
// <codec>_ops.cpp):
//   _C with WITH_CUDA: the CUDA kernels of the `hgc` ops (schemas defined by binding.cpp);
//   _C_twin (HGC_TWIN): the codec's schemas under the `hgc_twin` namespace (a fragment per codec,
//     the schemas of ops/schemas.h) and their kernels for CPU tensors, so that tests pick the
//     twin explicitly (torch.ops.hgc_twin.*). A Registrar records the codec and its ops, so that a
//     twin built from a subset of the codecs' sources (ci/build_twin_dev.py) says what it holds.
#pragma once
#include <torch/library.h>

#include <string>
#include <vector>

#include "../ops/adapters.h"
#include "../ops/schemas.h"

namespace hgc_dev {

struct TwinCodec {
  std::string codec;
  std::vector<std::string> ops;
};

// The codecs registered by this module, in static-initialization order.
inline std::vector<TwinCodec>& registrations() {
  static std::vector<TwinCodec> all;
  return all;
}

struct Registrar {
  Registrar(const char* codec, const std::vector<const char*>& schemas) {
    registrations().push_back({codec, hgc::op_names(schemas)});
  }
};

}  // namespace hgc_dev

// HGC_DEVICE_OPS(codec, OPS, INTO): the device kernels `<op>_device` of every op of the list OPS
// (HGC_<CODEC>_OPS, ops/schemas.h) and of the `_into` ops of the list INTO (HGC_<CODEC>_INTO_OPS).
#if defined(HGC_TWIN)
// The twin's kernels serve every dispatch key (CompositeExplicitAutograd): CPU tensors, and
// calls without tensors (an empty bucket); tensors on another device meet the kernels' checks.
#define HGC_DEVICE_OPS(codec, OPS, INTO)                                                            \
  TORCH_LIBRARY_FRAGMENT(hgc_twin, m) { hgc::define_ops(m, hgc::codec##_schemas()); }               \
  TORCH_LIBRARY_IMPL(hgc_twin, CompositeExplicitAutograd, m) { OPS(HGC_IMPL_DEVICE) INTO(HGC_IMPL_INTO_DEVICE) } \
  namespace {                                                                                \
  const hgc_dev::Registrar registrar_##codec(#codec, hgc::codec##_schemas());                \
  }
#else
#define HGC_DEVICE_OPS(codec, OPS, INTO) \
  TORCH_LIBRARY_IMPL(hgc, CUDA, m) { OPS(HGC_IMPL_DEVICE) INTO(HGC_IMPL_INTO_DEVICE) }
#endif
