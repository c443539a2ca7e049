// horovod_gradcomp._C_twin: the device sources of csrc/device/ built by g++ with Thrust's
// OpenMP backend, their ops registered under torch.ops.hgc_twin for CPU tensors (see
// csrc/device/registry.h). A test build: it runs on the CPU exactly the algorithm calls and
// functors that _C runs on a GPU (see csrc/device/exec.cuh). The Python module says which
// codecs and ops this build holds and counts the device algorithm calls.
#include <torch/extension.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../device/context.h"
#include "../device/registry.h"
#include "../device/scan.cuh"

namespace {

void* probe_alloc(std::size_t bytes, void*) { return std::malloc(bytes > 0 ? bytes : 1); }
void probe_free(void* p, void*) { std::free(p); }

struct Plus {
  int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};
struct Minus {  // not associative: (a - b) - c != a - (b - c)
  int64_t operator()(int64_t a, int64_t b) const { return a - b; }
};

// (the device scan wrapper's result, the sequential left-to-right scan's) of `values` (segments
// of equal consecutive `keys` for the *_by_key kinds) by `op`: the probe of the twin's two-level
// scan (csrc/device/scan.cuh; tests/test_twin_scan.py).
template <typename Op>
std::pair<std::vector<int64_t>, std::vector<int64_t>> scan_probe(const std::string& kind,
                                                                 const std::vector<int64_t>& v,
                                                                 const std::vector<int64_t>& keys, int64_t init,
                                                                 Op op) {
  const bool by_key = kind == "inclusive_by_key" || kind == "exclusive_by_key";
  const bool exclusive = kind == "exclusive" || kind == "exclusive_by_key";
  if (!by_key && !exclusive && kind != "inclusive")
    throw std::invalid_argument("scan_probe: kind must be inclusive, exclusive, inclusive_by_key or exclusive_by_key");
  if (by_key && keys.size() != v.size()) throw std::invalid_argument("scan_probe: one key per value");
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<int64_t> two(v.size()), seq(v.size());
  hgc_dev::Ctx ctx;
  ctx.alloc = &probe_alloc;
  ctx.free = &probe_free;
  hgc_dev::Exec ex(ctx);
  if (kind == "inclusive") hgc_dev::scan_inclusive(ex, v.data(), n, two.data(), op);
  if (kind == "exclusive") hgc_dev::scan_exclusive(ex, v.data(), n, two.data(), init, op);
  if (kind == "inclusive_by_key") hgc_dev::scan_inclusive_by_key(ex, keys.data(), v.data(), n, two.data(), op);
  if (kind == "exclusive_by_key") hgc_dev::scan_exclusive_by_key(ex, keys.data(), v.data(), n, two.data(), init, op);
  int64_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool head = i == 0 || (by_key && keys[i - 1] != keys[i]);
    if (exclusive) {
      if (head) acc = init;
      seq[i] = acc;
      acc = op(acc, v[i]);
    } else {
      acc = head ? v[i] : op(acc, v[i]);
      seq[i] = acc;
    }
  }
  return {two, seq};
}

}  // namespace

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
  m.def(
      "scan_probe",
      [](const std::string& kind, const std::vector<int64_t>& values, const std::vector<int64_t>& keys, int64_t init,
         const std::string& op) {
        if (op == "plus") return scan_probe(kind, values, keys, init, Plus());
        if (op == "minus") return scan_probe(kind, values, keys, init, Minus());
        throw std::invalid_argument("scan_probe: op must be plus or minus");
      },
      "(the device scan wrapper's result, the sequential scan's) of values by op (plus, or the non-associative "
      "minus); kind: inclusive, exclusive, inclusive_by_key or exclusive_by_key (keys: one per value)",
      pybind11::arg("kind"), pybind11::arg("values"), pybind11::arg("keys"), pybind11::arg("init"),
      pybind11::arg("op"));
  m.attr("scan_block") = hgc_dev::kScanBlock;
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
