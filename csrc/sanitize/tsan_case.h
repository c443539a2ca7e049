// One case of the ThreadSanitizer driver (twin_tsan_driver.cpp): a directory written by
// tests/test_twin_tsan.py holding `case.txt` (the op on its first line, then key=value
// parameters), the input files and the expected outputs (<name>.expect, from the CPU kernels).
// Each codec's file (tsan_<codec>.cpp) runs its cases through the device launchers as the torch
// ops of csrc/device/<codec>_ops.cpp call them, with host memory for device memory.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "../device/context.h"

namespace hgc_tsan {

using Bytes = std::vector<uint8_t>;
using Outputs = std::map<std::string, Bytes>;  // output name -> bytes (compared with <name>.expect)

inline void* host_alloc(std::size_t bytes, void*) { return std::malloc(bytes > 0 ? bytes : 1); }
inline void host_free(void* p, void*) { std::free(p); }

// The twin's launch context: device memory is host memory.
inline hgc_dev::Ctx host_ctx() {
  hgc_dev::Ctx c;
  c.alloc = &host_alloc;
  c.free = &host_free;
  return c;
}

inline Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

struct Case {
  std::string dir, op;
  std::map<std::string, std::string> p;
  bool has(const std::string& k) const { return p.count(k) != 0; }
  int64_t i(const std::string& k) const {
    if (!has(k)) {
      std::fprintf(stderr, "%s: no parameter %s\n", dir.c_str(), k.c_str());
      std::exit(2);
    }
    return std::stoll(p.at(k));
  }
  int64_t i(const std::string& k, int64_t dflt) const { return has(k) ? i(k) : dflt; }
  bool flag(const std::string& k) const { return has(k) && i(k) != 0; }  // absent: false
  double d(const std::string& k) const { return std::stod(p.at(k)); }
  Bytes in(const std::string& name) const { return read_file(dir + "/" + name); }
  // Item t's dtype (parameter dt<t>: DType's code; absent: fp32).
  hgc_dev::DType dtype(int64_t t) const { return static_cast<hgc_dev::DType>(i("dt" + std::to_string(t), 2)); }
};

inline Case load(const std::string& dir) {
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

// Bytes per value of a DType.
inline int64_t esize(hgc_dev::DType t) {
  return t == hgc_dev::DType::kDouble ? 8 : t == hgc_dev::DType::kFloat ? 4 : 2;
}

// Each codec's cases: true when `c.op` is one of its ops (its outputs then in `out`).
bool run_onebit(const Case& c, Outputs& out);
bool run_terngrad(const Case& c, Outputs& out);
bool run_qsgd(const Case& c, Outputs& out);
bool run_dgc(const Case& c, Outputs& out);

}  // namespace hgc_tsan
