// Shared by the torch ops of the device path (<codec>_ops.cpp), which are compiled twice:
//   in _C with WITH_CUDA  -> ops on CUDA tensors, launchers built by nvcc (Thrust on CUDA);
//   in _C_twin (HGC_TWIN) -> the same ops on CPU tensors, launchers built by g++ (Thrust on
//                            OpenMP): the twin that runs the device sources in CI.
// Each op checks its arguments with the CPU ops' own checks (csrc/checks.h,
// csrc/payload_checks.h, against kDeviceType), allocates its outputs on the input's device and
// calls the launchers with ctx_for(device).
#pragma once
#include <torch/extension.h>

#include "context.h"

#include <vector>

#if defined(HGC_TWIN)
#include <c10/core/CPUAllocator.h>
namespace hgc_dev {
constexpr at::DeviceType kDeviceType = at::kCPU;
// The twin's device is the CPU: nothing to select.
struct DeviceGuard {
  explicit DeviceGuard(const at::Device&) {}
};
}  // namespace hgc_dev
#else
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
namespace hgc_dev {
constexpr at::DeviceType kDeviceType = at::kCUDA;
using DeviceGuard = c10::cuda::CUDAGuard;
}  // namespace hgc_dev
#endif

namespace hgc_dev {

inline DType dev_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return DType::kHalf;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat;
    case at::kDouble: return DType::kDouble;
    default: TORCH_CHECK(false, "horovod_gradcomp: unsupported dtype ", t);
  }
}

namespace detail {
#if defined(HGC_TWIN)
inline void* alloc_bytes(std::size_t bytes, void*) { return c10::GetCPUAllocator()->raw_allocate(bytes); }
inline void free_bytes(void* p, void*) { c10::GetCPUAllocator()->raw_deallocate(p); }
#else
// PyTorch's caching allocator, on the stream the launcher runs on (memory freed here is
// reused by work ordered after it on that stream).
inline void* alloc_bytes(std::size_t bytes, void* stream) {
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
}
inline void free_bytes(void* p, void*) { c10::cuda::CUDACachingAllocator::raw_delete(p); }
// Pinned staging memory of Exec::to_device from PyTorch's caching host allocator: the handle
// owns the block; releasing it records an event on the stream, so the block is reused only
// after the copy that reads it.
inline void* pinned_alloc(std::size_t bytes, void** handle) {
  auto* block = new at::DataPtr(at::getHostAllocator(at::kCUDA)->allocate(bytes));
  *handle = block;
  return block->get();
}
inline void pinned_release(void* handle, void* stream) {
  auto* block = static_cast<at::DataPtr*>(handle);
  const auto cuda_stream = c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream),
                                                            c10::cuda::current_device());
  at::getHostAllocator(at::kCUDA)->record_event(block->get(), block->get_context(), cuda_stream.unwrap());
  delete block;
}
#endif
}  // namespace detail

// The launch context on the current device: the current CUDA stream (CUDA) or nothing (twin).
inline Ctx current_ctx() {
  Ctx c;
#if !defined(HGC_TWIN)
  c.stream = at::cuda::getCurrentCUDAStream().stream();
  c.alloc_state = c.stream;
  c.host_alloc = &detail::pinned_alloc;
  c.host_release = &detail::pinned_release;
#endif
  c.alloc = &detail::alloc_bytes;
  c.free = &detail::free_bytes;
  return c;
}

// A device tensor's values on the host: a host synchronization, counted (host_syncs()).
inline at::Tensor read_back(const at::Tensor& t) {
  count_host_sync();
  return t.to(at::kCPU);
}

// Host values (a CPU tensor) as a tensor on `device`, without waiting for the copy (CUDA:
// through pinned memory, whose block PyTorch reuses only after the copy).
inline at::Tensor upload(const at::Tensor& host, const at::Device& device) {
#if defined(HGC_TWIN)
  return host.to(device);
#else
  return host.pin_memory().to(device, /*non_blocking=*/true);
#endif
}

// The dtypes present among a bucket's `dtypes`, in DType order: a bucket op runs one launch
// sequence per dtype present.
inline std::vector<at::ScalarType> dtype_groups(const std::vector<at::ScalarType>& dtypes) {
  std::vector<at::ScalarType> present;
  for (const at::ScalarType t : {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble}) {
    for (const at::ScalarType d : dtypes) {
      if (d == t) {
        present.push_back(t);
        break;
      }
    }
  }
  return present;
}

// launch(dtype, items of that dtype, in bucket order) once for every dtype among `dtypes`
// (dtypes[i] is items[i]'s): a bucket launcher takes tensors of one dtype.
template <typename Item, typename Launch>
void launch_by_dtype(const std::vector<at::ScalarType>& dtypes, const std::vector<Item>& items, Launch launch) {
  for (const at::ScalarType t : dtype_groups(dtypes)) {
    std::vector<Item> group;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (dtypes[i] == t) group.push_back(items[i]);
    }
    launch(dev_dtype(t), group.data(), static_cast<int64_t>(group.size()));
  }
}

// The one device of a bucket's tensors (checked: a bucket is on one device); `what` names them.
inline at::Device bucket_device(const std::vector<at::Tensor>& tensors, const char* op, const char* what) {
  TORCH_CHECK(!tensors.empty(), op, ": no tensors");
  const at::Device device = tensors[0].device();
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].device() == device, op, ": ", what, " ", i, " is on ", tensors[i].device(), ", ", what,
                " 0 on ", device, " (a bucket is on one device)");
  }
  return device;
}

}  // namespace hgc_dev
