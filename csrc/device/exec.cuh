// The execution layer of the device sources (*_device.cu), for both of their builds:
//   nvcc            -> Thrust's CUDA backend (cub underneath), on the caller's stream;
//   g++ -DHGC_TWIN  -> Thrust's OpenMP backend on the CPU's threads (the "twin" that CI runs).
// Codec code calls Thrust algorithms with `ex.policy()` over HGC_HOST_DEVICE functors and
// nothing else: no raw launches, shared memory or intrinsics. The only CUDA runtime calls of
// the device path are the copies and the synchronization at the bottom of this file.
#pragma once

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#if defined(HGC_TWIN)
#include <thrust/system/omp/execution_policy.h>
#else
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>
#endif

#include "../host_device.h"
#include "context.h"
#include "half_bits.h"

namespace hgc_dev {

namespace detail {
std::atomic<int64_t>& call_counter();
std::atomic<int64_t>& sync_counter();
std::atomic<int64_t>& narrow_stage_counter();  // multi-tensor stages run with 32-bit index math
std::atomic<int64_t>& wide_stage_counter();    // ... and with 64-bit index math (multi_tensor.cuh)
}  // namespace detail

// Thrust's temporary storage from the caller's allocator (so that on CUDA it comes from
// PyTorch's caching allocator, not cudaMalloc).
class TempAllocator {
 public:
  using value_type = char;
  explicit TempAllocator(const Ctx& ctx) : ctx_(ctx) {}
  char* allocate(std::ptrdiff_t n) {
    void* p = ctx_.alloc(static_cast<std::size_t>(n > 0 ? n : 1), ctx_.alloc_state);
    if (!p) throw std::bad_alloc();
    return static_cast<char*>(p);
  }
  void deallocate(char* p, std::size_t) { ctx_.free(p, ctx_.alloc_state); }

 private:
  Ctx ctx_;
};

// One launcher's view of its context. policy() is what every Thrust call takes; it counts
// the call (detail::call_counter) so tests can check the number of calls per op.
class Exec {
 public:
  explicit Exec(const Ctx& ctx) : ctx_(ctx), alloc_(ctx) {}

  auto policy() {
    detail::call_counter().fetch_add(1, std::memory_order_relaxed);
#if defined(HGC_TWIN)
    return thrust::omp::par(alloc_);
#else
    return thrust::cuda::par_nosync(alloc_).on(static_cast<cudaStream_t>(ctx_.stream));
#endif
  }

  // policy() of an algorithm whose result the host reads (a returned value, or the end of
  // copy_if's or reduce_by_key's output, which Thrust copies back): on CUDA the host waits for
  // the stream, so it counts as a host synchronization too.
  auto policy_read() {
    detail::sync_counter().fetch_add(1, std::memory_order_relaxed);
    return policy();
  }

  // f(i) for every i in [0, n): the "kernel launch" of the device sources.
  template <typename F> void for_each_index(int64_t n, F f) {
    if (n <= 0) return;
    thrust::for_each_n(policy(), thrust::counting_iterator<int64_t>(0), n, f);
  }

  // Scratch memory of `count` values of T for the launcher's lifetime (see Scratch).
  const Ctx& ctx() const { return ctx_; }

  // Copy `bytes` from device memory to host memory and wait for it (the small size reads
  // of data-dependent payloads), after everything issued before on the stream: a host
  // synchronization, counted (detail::sync_counter).
  void to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::sync_counter().fetch_add(1, std::memory_order_relaxed);
#if defined(HGC_TWIN)
    std::memcpy(dst, src, bytes);  // twin: device memory is host memory (after the synchronous algorithms)
#else
    const auto stream = static_cast<cudaStream_t>(ctx_.stream);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#endif
  }

  // Copy `bytes` of host memory to device memory, ordered on the stream, without waiting: the
  // bytes go through a pinned staging buffer (Ctx::host_alloc) that is reused only after the
  // stream has passed the copy, so `src` may be freed at once. No host synchronization.
  void to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
#if defined(HGC_TWIN)
    std::memcpy(dst, src, bytes);
#else
    const auto stream = static_cast<cudaStream_t>(ctx_.stream);
    if (ctx_.host_alloc == nullptr || ctx_.host_release == nullptr)
      throw std::runtime_error("hgc_dev: Exec::to_device needs the context's pinned host allocator");
    void* handle = nullptr;
    void* staging = ctx_.host_alloc(bytes, &handle);
    std::memcpy(staging, src, bytes);
    const cudaError_t err = cudaMemcpyAsync(dst, staging, bytes, cudaMemcpyHostToDevice, stream);
    ctx_.host_release(handle, ctx_.stream);  // reused once the stream is past the copy
    check(err, "cudaMemcpyAsync");
#endif
  }

 private:
#if !defined(HGC_TWIN)
  static void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
  }
#endif
  Ctx ctx_;
  TempAllocator alloc_;
};

// `count` values of T in device memory from the context's allocator, freed on destruction.
// Uninitialized; on CUDA freed memory is reused in stream order by PyTorch's allocator.
template <typename T> class Scratch {
 public:
  Scratch(const Exec& ex, int64_t count) : ctx_(ex.ctx()) {
    const std::size_t bytes = sizeof(T) * static_cast<std::size_t>(count > 0 ? count : 1);
    ptr_ = static_cast<T*>(ctx_.alloc(bytes, ctx_.alloc_state));
    if (!ptr_) throw std::bad_alloc();
  }
  ~Scratch() { ctx_.free(ptr_, ctx_.alloc_state); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return ptr_; }

 private:
  Ctx ctx_;
  T* ptr_;
};

// Calls f(T*) with T the storage type of `dtype` (half_t, bf16_t, float, double).
template <typename F> void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kHalf: f(static_cast<half_t*>(nullptr)); return;
    case DType::kBFloat16: f(static_cast<bf16_t*>(nullptr)); return;
    case DType::kFloat: f(static_cast<float*>(nullptr)); return;
    case DType::kDouble: f(static_cast<double*>(nullptr)); return;
  }
  throw std::invalid_argument("hgc_dev: unknown dtype");
}

}  // namespace hgc_dev
