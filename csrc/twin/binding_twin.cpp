// horovod_gradcomp._C_twin: the device sources of csrc/device/ built by g++ with Thrust's
// OpenMP backend, their torch ops taking CPU tensors. A test build: it runs on the CPU exactly
// the algorithm calls and functors that _C runs on a GPU (see csrc/device/exec.cuh).
#include <torch/extension.h>

#include <algorithm>

#include "../device/context.h"
#include "../device/registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod_gradcomp device kernels built for the CPU (Thrust's OpenMP backend): the GPU path's twin";
  m.def("has_cuda", [] { return false; }, "False: the twin runs the device sources on the CPU");
  m.def("algorithm_calls", &hgc_dev::algorithm_calls,
        "device algorithm (Thrust) calls issued so far by this module, all threads");
  auto regs = hgc_dev::registrations();
  std::sort(regs.begin(), regs.end());
  std::vector<std::string> codecs;
  for (const auto& [codec, fn] : regs) {
    fn(m);
    codecs.push_back(codec);
  }
  m.attr("codecs") = codecs;  // the codecs whose device ops this build holds
}
