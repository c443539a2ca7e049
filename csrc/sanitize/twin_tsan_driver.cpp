// ThreadSanitizer driver of the device sources' OpenMP twin (no Python, no torch: torch links
// libgomp, whose synchronization TSan cannot see; this driver is built by clang++ with LLVM's
// libomp, whose Archer tool tells TSan about OpenMP's barriers and tasks).
//
//   twin_tsan_driver CASES_DIR        each case directory holds `case.txt` (the op on its first
//                                     line, then key=value parameters), its input files and the
//                                     expected output files, written by tests/test_twin_tsan.py
//                                     from the CPU kernels; every case runs at 1, 2 and 4 OpenMP
//                                     threads and its outputs must equal the expected bytes.
//   twin_tsan_driver --race           a deliberately racy functor (every index adds into one
//                                     word) through the same launch path: TSan must report it.
//
// Prints one line per case and thread count; exit status 1 on any mismatch.
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "../device/exec.cuh"
#include "../device/dgc_device.h"
#include "../device/onebit_device.h"
#include "../device/terngrad_device.h"
#if __has_include("../device/qsgd_device.h")
#include "../device/qsgd_device.h"
#define HGC_DRIVER_QSGD 1
#endif

namespace {

using Bytes = std::vector<uint8_t>;

void* host_alloc(std::size_t bytes, void*) { return std::malloc(bytes); }
void host_free(void* p, void*) { std::free(p); }

hgc_dev::Ctx host_ctx() {
  hgc_dev::Ctx c;
  c.alloc = &host_alloc;
  c.free = &host_free;
  return c;
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) { std::fprintf(stderr, "cannot read %s\n", path.c_str()); std::exit(2); }
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

struct Case {
  std::string dir, op;
  std::map<std::string, std::string> p;
  int64_t i(const std::string& k) const { return std::stoll(p.at(k)); }
  bool flag(const std::string& k) const { return p.count(k) && i(k) != 0; }  // absent: false
  double d(const char* k) const { return std::stod(p.at(k)); }
  Bytes in(const std::string& name) const { return read_file(dir + "/" + name); }
};

Case load(const std::string& dir) {
  Case c;
  c.dir = dir;
  std::ifstream f(dir + "/case.txt");
  std::getline(f, c.op);
  for (std::string line; std::getline(f, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) c.p[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return c;
}

// Runs one case; returns its outputs by name (compared with <name>.expect).
std::map<std::string, Bytes> run(const Case& c) {
  const hgc_dev::Ctx ctx = host_ctx();
  std::map<std::string, Bytes> out;
  const auto f32 = hgc_dev::DType::kFloat;
  if (c.op == "onebit_encode") {
    const int64_t n = c.i("n"), cols = c.i("cols");
    Bytes g = c.in("grad.bin"), r = c.in("residual.bin");
    Bytes bits((n + 7) / 8), scales(8 * cols, 0);
    hgc_dev::onebit_encode(ctx, f32, g.data(), r.data(), n, cols, cols, bits.data(),
                           reinterpret_cast<float*>(scales.data()), hgc_dev::OnebitPasses::kBoth, c.flag("by_rows"));
    out["bits"] = bits;
    out["scales"] = scales;
    out["residual"] = r;
  } else if (c.op == "onebit_decode_sum") {
    const int64_t n = c.i("n"), cols = c.i("cols"), K = c.i("K");
    Bytes bits = c.in("bits.bin"), scales = c.in("scales.bin"), o(4 * n);
    hgc_dev::onebit_decode_sum(ctx, f32, bits.data(), (n + 7) / 8, reinterpret_cast<const float*>(scales.data()),
                               2 * cols, K, n, cols, cols, c.d("scale"), o.data(), c.flag("by_rows"));
    out["out"] = o;
  } else if (c.op == "onebit_encode_many") {  // a bucket: every stage one call over all tensors
    const int64_t count = c.i("count");
    std::vector<Bytes> g(count), r(count), bits(count), scales(count);
    std::vector<hgc_dev::OnebitEncodeItem> items(count);
    for (int64_t t = 0; t < count; ++t) {
      const std::string k = std::to_string(t);
      const int64_t n = c.i("n" + k), cols = c.i("cols" + k);
      g[t] = c.in("grad" + k + ".bin");
      r[t] = c.in("residual" + k + ".bin");
      bits[t].assign((n + 7) / 8, 0);
      scales[t].assign(8 * cols, 0);
      items[t] = {g[t].data(), r[t].data(), n, cols, cols, bits[t].data(), reinterpret_cast<float*>(scales[t].data()),
                  c.flag("by_rows" + k)};
    }
    hgc_dev::onebit_encode_many(ctx, f32, items.data(), count, true);
    for (int64_t t = 0; t < count; ++t) {
      const std::string k = std::to_string(t);
      out["bits" + k] = bits[t];
      out["scales" + k] = scales[t];
      out["residual" + k] = r[t];
    }
  } else if (c.op == "onebit_decode_sum_many") {
    const int64_t count = c.i("count"), K = c.i("K");
    std::vector<Bytes> bits(count), scales(count), o(count);
    std::vector<hgc_dev::OnebitDecodeItem> items(count);
    for (int64_t t = 0; t < count; ++t) {
      const std::string k = std::to_string(t);
      const int64_t n = c.i("n" + k), cols = c.i("cols" + k);
      bits[t] = c.in("bits" + k + ".bin");
      scales[t] = c.in("scales" + k + ".bin");
      o[t].assign(4 * n, 0);
      items[t] = {bits[t].data(), (n + 7) / 8, reinterpret_cast<const float*>(scales[t].data()), 2 * cols, n, cols,
                  cols, o[t].data(), c.flag("by_rows" + k)};
    }
    hgc_dev::onebit_decode_sum_many(ctx, f32, items.data(), count, K, c.d("scale"));
    for (int64_t t = 0; t < count; ++t) out["out" + std::to_string(t)] = o[t];
  } else if (c.op == "terngrad_encode") {
    const int64_t n = c.i("n");
    Bytes g = c.in("grad.bin"), codes((n + 3) / 4);
    hgc_dev::terngrad_encode(ctx, f32, g.data(), n, c.d("scale"), c.d("clip"), static_cast<uint32_t>(c.i("key0")),
                             static_cast<uint32_t>(c.i("key1")), codes.data());
    out["codes"] = codes;
  } else if (c.op == "terngrad_decode_sum") {
    const int64_t n = c.i("n"), K = c.i("K");
    Bytes codes = c.in("codes.bin"), scales = c.in("scales.bin"), o(4 * n);
    hgc_dev::terngrad_decode_sum(ctx, f32, codes.data(), (n + 3) / 4, reinterpret_cast<const float*>(scales.data()), 1,
                                 K, n, c.d("scale"), o.data());
    out["out"] = o;
  } else if (c.op == "dgc_select") {
    const int64_t n = c.i("n");
    Bytes x = c.in("x.bin");
    const hgc_dev::DgcThreshold t = hgc_dev::dgc_threshold(ctx, f32, x.data(), n, c.i("k"), c.i("sample_count"),
                                                           static_cast<uint64_t>(c.i("key")));
    Bytes idx(4 * t.count), vals(4 * t.count);
    hgc_dev::dgc_compact(ctx, f32, x.data(), n, t.key, false, idx.data(), vals.data(), t.count);
    out["idx"] = idx;
    out["vals"] = vals;
  } else if (c.op == "dgc_scatter_sum") {
    const int64_t n = c.i("n"), K = c.i("K");
    std::vector<Bytes> idx(K), vals(K);
    std::vector<const void*> ip(K), vp(K);
    std::vector<int64_t> counts(K);
    for (int64_t r = 0; r < K; ++r) {
      idx[r] = c.in("idx" + std::to_string(r) + ".bin");
      vals[r] = c.in("vals" + std::to_string(r) + ".bin");
      ip[r] = idx[r].data();
      vp[r] = vals[r].data();
      counts[r] = static_cast<int64_t>(idx[r].size() / 4);
    }
    Bytes o(4 * n);
    hgc_dev::dgc_scatter_sum(ctx, f32, ip.data(), false, vp.data(), counts.data(), K, n, c.d("scale"), o.data());
    out["out"] = o;
#ifdef HGC_DRIVER_QSGD
  } else if (c.op == "qsgd_encode_fixed") {
    const int64_t n = c.i("n"), s = c.i("s"), d = c.i("d");
    const int w = 1 + (64 - __builtin_clzll(static_cast<uint64_t>(s)));
    Bytes x = c.in("x.bin"), norms(4 * ((n + d - 1) / d)), packed((n * w + 7) / 8);
    hgc_dev::qsgd_encode_fixed(ctx, f32, x.data(), n, s, d, c.i("max_norm") != 0, static_cast<uint64_t>(c.i("key")),
                               reinterpret_cast<float*>(norms.data()), packed.data());
    out["norms"] = norms;
    out["packed"] = packed;
#endif
  } else {
    std::fprintf(stderr, "unknown op %s in %s\n", c.op.c_str(), c.dir.c_str());
    std::exit(2);
  }
  return out;
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
    hgc_dev::Exec ex(host_ctx());
    ex.for_each_index(1 << 16, RacyAdd{&word});
    std::printf("racy sum %lld\n", static_cast<long long>(word));
    return 0;
  }
  if (argc < 2) { std::fprintf(stderr, "usage: %s CASE_DIR... | --race\n", argv[0]); return 2; }
  int failures = 0;
  for (int a = 1; a < argc; ++a) {
    const Case c = load(argv[a]);
    for (int threads : {1, 2, 4}) {
      omp_set_num_threads(threads);
      for (const auto& [name, got] : run(c)) {
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
