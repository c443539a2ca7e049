// horovod_gradcomp._C: the `hgc` ops' schemas (the op lists of ops/schemas.h, defined here once)
// and the registration of their CPU kernels (`<op>_cpu`, csrc/cpu/); their CUDA kernels are
// registered by device/<codec>_ops.cpp (WITH_CUDA). The dispatcher picks the kernel by the
// tensors' device; the Python module holds only what is not a tensor op (has_cuda, the device
// counters, the gloo-exit helpers of cpu/gloo_exit.h).
#include <torch/extension.h>
#include <torch/library.h>

#include "ops/adapters.h"
#include "ops/schemas.h"

#include "cpu/dgc_cpu.h"
#include "cpu/dgc_index_cpu.h"
#include "cpu/dgc_memory_cpu.h"
#include "cpu/gloo_exit.h"
#include "cpu/onebit_cpu.h"
#include "cpu/qsgd_cpu.h"
#include "cpu/terngrad_cpu.h"
#ifdef WITH_CUDA
#include "device/context.h"
#endif

namespace {

bool has_cuda() {
#ifdef WITH_CUDA
  return true;
#else
  return false;
#endif
}

// Every schema of _C, codec after codec.
std::vector<const char*> all_schemas() {
  std::vector<const char*> all;
  for (const auto* list : {&hgc::terngrad_schemas(), &hgc::onebit_schemas(), &hgc::qsgd_schemas(), &hgc::dgc_schemas()})
    all.insert(all.end(), list->begin(), list->end());
  return all;
}

#ifndef WITH_CUDA
// The CUDA kernel of every op in a build without CUDA: a clear error, not the CPU kernel.
void no_cuda_kernel(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK(false, op.schema().name(), ": horovod_gradcomp._C was built without CUDA kernels; got CUDA tensors "
              "(rebuild with CUDA, see hgc.native_cuda_status(), or use impl='reference')");
}
#endif

// The CPU kernels, under CPU and under CompositeExplicitAutograd: the latter serves calls with no
// tensor at all (an empty bucket), which have no device to dispatch on.
void register_cpu_kernels(torch::Library& m) {
  HGC_TERNGRAD_OPS(HGC_IMPL_CPU)
  HGC_ONEBIT_OPS(HGC_IMPL_CPU)
  HGC_QSGD_OPS(HGC_IMPL_CPU)
  HGC_DGC_OPS(HGC_IMPL_CPU)
  HGC_TERNGRAD_INTO_OPS(HGC_IMPL_INTO_CPU)
  HGC_ONEBIT_INTO_OPS(HGC_IMPL_INTO_CPU)
  HGC_QSGD_INTO_OPS(HGC_IMPL_INTO_CPU)
  HGC_DGC_INTO_OPS(HGC_IMPL_INTO_CPU)
}

}  // namespace

TORCH_LIBRARY(hgc, m) { hgc::define_ops(m, all_schemas()); }

TORCH_LIBRARY_IMPL(hgc, CPU, m) { register_cpu_kernels(m); }

TORCH_LIBRARY_IMPL(hgc, CompositeExplicitAutograd, m) { register_cpu_kernels(m); }

#ifndef WITH_CUDA
TORCH_LIBRARY_IMPL(hgc, CUDA, m) {
  for (const std::string& name : hgc::op_names(all_schemas()))
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&no_cuda_kernel>());
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "horovod_gradcomp native codec kernels: the torch.ops.hgc ops (see horovod_gradcomp/ops.py)";
  m.def("has_cuda", &has_cuda, "True when built with the CUDA kernels");
  m.attr("ops") = hgc::op_names(all_schemas());  // the ops this module registers under torch.ops.hgc
#ifdef WITH_CUDA
  // The CUDA kernels' counters (csrc/device/exec.cuh), as the twin has them: bench devtime reads them.
  m.def("algorithm_calls", &hgc_dev::algorithm_calls, "device algorithm (Thrust) calls issued so far, all threads");
  m.def("host_syncs", &hgc_dev::host_syncs, "host synchronizations (reads back from the GPU) issued so far, all threads");
#endif
  bind_gloo_exit(m);
}
