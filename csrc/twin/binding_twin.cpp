// horovod_gradcomp._C_twin: the device sources of csrc/device/ built by g++ with Thrust's
// OpenMP backend, their ops registered under torch.ops.hgc_twin for CPU tensors (see
// csrc/device/registry.h). A test build: it runs on the CPU exactly the algorithm calls and
// functors that _C runs on a GPU (see csrc/device/exec.cuh). The Python module says which
// codecs and ops this build holds and counts the device algorithm calls.
#include <torch/extension.h>

#include <algorithm>

#include "../device/context.h"
#include "../device/registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod_gradcomp device kernels built for the CPU (Thrust's OpenMP backend): the GPU path's twin";
  m.def("has_cuda", [] { return false; }, "False: the twin runs the device sources on the CPU");
  m.def("algorithm_calls", &hgc_dev::algorithm_calls,
        "device algorithm (Thrust) calls issued so far by this module, all threads");
  m.def("host_syncs", &hgc_dev::host_syncs,
        "host synchronizations (reads back from the device) issued so far by this module, all threads");
  m.def("set_index32_limit", &hgc_dev::set_index32_limit, py::arg("limit"),
        "sets the largest padded position count (and tensor count) of a multi-tensor stage that runs with "
        "32-bit index math (default 2**31 - 1; 0: every stage 64-bit) and returns the previous one; "
        "ValueError outside [0, 2**31 - 1]");
  m.def("index32_limit", &hgc_dev::index32_limit, "the 32-bit index limit of multi-tensor stages (set_index32_limit)");
  m.def("stage_runs", [] { return std::make_pair(hgc_dev::narrow_stage_runs(), hgc_dev::wide_stage_runs()); },
        "(32-bit, 64-bit): multi-tensor stages run so far with each index width, all threads");
  auto regs = hgc_dev::registrations();
  std::sort(regs.begin(), regs.end(), [](const auto& a, const auto& b) { return a.codec < b.codec; });
  std::vector<std::string> codecs, ops;
  for (const auto& reg : regs) {
    codecs.push_back(reg.codec);
    ops.insert(ops.end(), reg.ops.begin(), reg.ops.end());
  }
  m.attr("codecs") = codecs;  // the codecs whose device ops this build holds
  m.attr("ops") = ops;        // their ops, under torch.ops.hgc_twin
}
