// What a device launcher needs from its caller, in plain C++ (no PyTorch, no CUDA, no Thrust
// headers): the element type, the stream, an allocator for Thrust's temporary storage and a
// counter of device algorithm calls. The torch ops (<codec>_ops.cpp) fill it in; the device
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

// Pinned host memory for the uploads of tables (CUDA): host_alloc gives a buffer of `bytes` and a
// handle; host_release(handle, stream) gives it back, to be reused only once the work issued on
// `stream` so far is done (PyTorch's caching host allocator records an event on the stream). So
// an upload never waits for the copy. Null in the twin, whose uploads are memcpy.
using HostAllocFn = void* (*)(std::size_t bytes, void** handle);
using HostReleaseFn = void (*)(void* handle, void* stream);

struct Ctx {
  void* stream = nullptr;      // cudaStream_t on CUDA; unused by the twin
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  void* alloc_state = nullptr;
  HostAllocFn host_alloc = nullptr;
  HostReleaseFn host_release = nullptr;
};

// Device algorithm calls (Thrust algorithms) issued since the process started, all threads:
// every call goes through Exec::policy() (exec.cuh), which counts it. Tests read it around
// an op to check how many calls a bucket costs.
int64_t algorithm_calls();

// Host synchronizations (a wait of the host for the stream: the reads back of Exec::to_host)
// issued since the process started, all threads; counted alike in both builds, so the twin's
// count is the GPU path's. Tests read it around an op, as algorithm_calls.
int64_t host_syncs();
// Counts one host synchronization made outside Exec (a torch op's read back, ops_common.h).
void count_host_sync();

// The largest position count (padded to whole chunks) and tensor count of a multi-tensor stage
// that runs with 32-bit index math (multi_tensor.cuh); larger stages run with 64-bit math.
// Default 2^31 - 1. set_index32_limit returns the previous limit and refuses one outside
// [0, 2^31 - 1] (std::invalid_argument); tests lower it to run the 64-bit branch on small data.
int64_t index32_limit();
int64_t set_index32_limit(int64_t limit);
// Multi-tensor stages run since the process started with 32-bit (narrow) and with 64-bit (wide)
// index math, all threads.
int64_t narrow_stage_runs();
int64_t wide_stage_runs();

}  // namespace hgc_dev
