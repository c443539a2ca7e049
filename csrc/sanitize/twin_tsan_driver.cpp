// ThreadSanitizer driver of the device sources' OpenMP twin (no Python, no torch: torch links
// libgomp, whose synchronization TSan cannot see; this driver is built by clang++ with LLVM's
// libomp, whose Archer tool tells TSan about OpenMP's barriers and tasks).
//
//   twin_tsan_driver CASES_DIR...     each case directory holds `case.txt` (the op on its first
//                                     line, then key=value parameters), its input files and the
//                                     expected output files, written by tests/test_twin_tsan.py
//                                     from the CPU kernels; every case runs at 1, 2 and 4 OpenMP
//                                     threads and its outputs must equal the expected bytes. The
//                                     cases of each codec: tsan_<codec>.cpp (every bucket launcher
//                                     of the codec, called as its torch op calls it).
//   twin_tsan_driver --race           a deliberately racy functor (every index adds into one
//                                     word) through the same launch path: TSan must report it.
//
// Prints one line per output, case and thread count; exit status 1 on any mismatch or missing output.
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "../device/exec.cuh"
#include "tsan_case.h"

namespace {

using hgc_tsan::Bytes;
using hgc_tsan::Case;

// Runs one case through its codec's launchers; returns its outputs by name (compared with
// <name>.expect).
hgc_tsan::Outputs run(const Case& c) {
  hgc_tsan::Outputs out;
  if (hgc_tsan::run_onebit(c, out) || hgc_tsan::run_terngrad(c, out) || hgc_tsan::run_qsgd(c, out) ||
      hgc_tsan::run_dgc(c, out))
    return out;
  std::fprintf(stderr, "unknown op %s in %s\n", c.op.c_str(), c.dir.c_str());
  std::exit(2);
}

// The outputs a case expects: its <name>.expect files.
std::set<std::string> expected_names(const std::string& dir) {
  std::set<std::string> names;
  const std::string ext = ".expect";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.size() > ext.size() && f.compare(f.size() - ext.size(), ext.size(), ext) == 0)
      names.insert(f.substr(0, f.size() - ext.size()));
  }
  return names;
}

// Every index adds into one word: the race the TSan run must be able to see.
struct RacyAdd {
  int64_t* word;
  void operator()(int64_t i) const { *word += i; }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--race") == 0) {
    omp_set_num_threads(4);
    int64_t word = 0;
    hgc_dev::Exec ex(hgc_tsan::host_ctx());
    ex.for_each_index(1 << 16, RacyAdd{&word});
    std::printf("racy sum %lld\n", static_cast<long long>(word));
    return 0;
  }
  if (argc < 2) { std::fprintf(stderr, "usage: %s CASE_DIR... | --race\n", argv[0]); return 2; }
  int failures = 0;
  for (int a = 1; a < argc; ++a) {
    const Case c = hgc_tsan::load(argv[a]);
    const std::set<std::string> want_names = expected_names(argv[a]);
    for (int threads : {1, 2, 4}) {
      omp_set_num_threads(threads);
      const hgc_tsan::Outputs outs = run(c);
      for (const std::string& name : want_names) {
        if (outs.count(name)) continue;
        ++failures;
        std::printf("MISSING %s %s threads=%d %s (expected, not produced)\n", c.op.c_str(), argv[a], threads,
                    name.c_str());
      }
      for (const auto& [name, got] : outs) {
        const Bytes want = c.in(name + ".expect");
        const bool same = got == want;
        failures += !same;
        std::printf("%s %s %s threads=%d %s (%zu bytes)\n", same ? "OK" : "MISMATCH", c.op.c_str(), argv[a], threads,
                    name.c_str(), got.size());
      }
    }
  }
  std::printf("%d mismatches\n", failures);
  return failures ? 1 : 0;
}
