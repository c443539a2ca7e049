// What a device launcher needs from its caller, in plain C++ (no PyTorch, no CUDA, no Thrust
// headers): the element type, the stream, an allocator for Thrust's temporary storage and a
// counter of device algorithm calls. The torch ops (ops_device.cpp) fill it in; the device
// sources (*_device.cu, built by nvcc for CUDA and by g++ for the OpenMP twin) read it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hgc_dev {

// Element types of gradients and outputs.
enum class DType : int { kHalf = 0, kBFloat16 = 1, kFloat = 2, kDouble = 3 };

// Device memory from the caller's allocator (PyTorch's caching allocator on CUDA, its CPU
// allocator in the twin). `state` is passed back unchanged.
using AllocFn = void* (*)(std::size_t bytes, void* state);
using FreeFn = void (*)(void* ptr, void* state);

struct Ctx {
  void* stream = nullptr;      // cudaStream_t on CUDA; unused by the twin
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  void* alloc_state = nullptr;
};

// Device algorithm calls (Thrust algorithms) issued since the process started, all threads:
// every call goes through Exec::policy() (exec.cuh), which counts it. Tests read it around
// an op to check how many calls a bucket costs.
int64_t algorithm_calls();

}  // namespace hgc_dev
