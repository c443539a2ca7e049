// Device helpers shared by the CUDA kernels (no PyTorch headers): per-dtype arithmetic
// types, the counter-based hashes of the CPU kernels, grid sizing.
// The kernels are compiled with --fmad=false (setup.py): every product and sum rounds
// separately, as the CPU kernels (-ffp-contract=off) and the torch references do.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../splitmix64.h"
#include "dtype_cuda.h"

namespace hgc_cuda {
namespace detail {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 8192;

// Arithmetic type of a gradient dtype (float for fp16/bf16/fp32, double for fp64) and the
// conversions to and from it (round to nearest even).
template <typename T> struct Arith;
template <> struct Arith<__half> {
  using acc = float;
  static __device__ __forceinline__ float load(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half store(float x) { return __float2half_rn(x); }
};
template <> struct Arith<__nv_bfloat16> {
  using acc = float;
  static __device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Arith<float> {
  using acc = float;
  static __device__ __forceinline__ float load(float x) { return x; }
  static __device__ __forceinline__ float store(float x) { return x; }
};
template <> struct Arith<double> {
  using acc = double;
  static __device__ __forceinline__ double load(double x) { return x; }
  static __device__ __forceinline__ double store(double x) { return x; }
};

// splitmix64 (QSGD's and DGC's streams): the definition the CPU kernels use too.
using hgc::kGolden;
using hgc::mix64;

// lowbias32 (TernGrad's stream).
__host__ __device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

inline unsigned grid_for(int64_t work, int threads = kThreads) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, kMaxGrid)));
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Calls f.template operator()<T>() with T the element type of `dtype`; returns its error.
template <typename F>
cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kHalf: return f(static_cast<__half*>(nullptr));
    case DType::kBFloat16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::kFloat: return f(static_cast<float*>(nullptr));
    case DType::kDouble: return f(static_cast<double*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail
}  // namespace hgc_cuda
