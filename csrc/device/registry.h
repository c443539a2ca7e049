// The twin module (_C_twin) registers each codec's device ops under the names _C gives their
// CPU ops, so that a codec built with impl="twin" calls the same functions on another module.
// Each <codec>_ops.cpp, built with HGC_TWIN, adds its registration function with a static
// Registrar; the binding (csrc/twin/binding_twin.cpp) runs every one it finds, so a twin built
// from a subset of the codecs' sources (ci/build_twin_dev.py) works too.
#pragma once
#include <torch/extension.h>

#include <string>
#include <utility>
#include <vector>

namespace hgc_dev {

using RegisterFn = void (*)(pybind11::module& m);

// The registrations linked into this module, in static-initialization order.
inline std::vector<std::pair<std::string, RegisterFn>>& registrations() {
  static std::vector<std::pair<std::string, RegisterFn>> all;
  return all;
}

struct Registrar {
  Registrar(const char* codec, RegisterFn fn) { registrations().emplace_back(codec, fn); }
};

}  // namespace hgc_dev

// Kernels touch only tensors: release the GIL (as _C's binding does).
#define HGC_DEV_RELEASE_GIL pybind11::call_guard<pybind11::gil_scoped_release>()
