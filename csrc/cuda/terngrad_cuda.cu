// TernGrad codec, CUDA. Thread per code byte (4 values) for encode and decode; max |g| by
// an atomic max on the bits of non-negative doubles (their integer order is their order,
// and every NaN's bits sort above +inf's, so a NaN anywhere gives a NaN).
#include "terngrad_cuda.h"

#include "common_cuda.cuh"

namespace hgc_cuda {
namespace {

using namespace detail;

constexpr int64_t kMaxIntK = 32767;  // the CPU kernel's integer path limit

template <typename T>
__global__ void __launch_bounds__(kThreads) max_abs_kernel(const T* __restrict__ g, int64_t n,
                                                           unsigned long long* __restrict__ out) {
  using acc_t = typename Arith<T>::acc;
  acc_t m = 0;
  bool nan = false;
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    const acc_t a = fabs(Arith<T>::load(g[i]));
    m = a > m ? a : m;
    nan |= a != a;
  }
  double d = static_cast<double>(m);
  if (nan) d = __longlong_as_double(0x7FF8000000000000ll);
  unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(d));
  // Warp max first, then one atomic per warp.
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_down_sync(0xFFFFFFFFu, bits, o);
    bits = other > bits ? other : bits;
  }
  if ((threadIdx.x & 31) == 0 && bits) atomicMax(out, bits);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    encode_kernel(const T* __restrict__ g, int64_t n, typename Arith<T>::acc s, typename Arith<T>::acc clip,
                  uint32_t k0, uint32_t k1, uint8_t* __restrict__ codes) {
  using acc_t = typename Arith<T>::acc;
  const int64_t nbytes = (n + 3) / 4;
  for (int64_t b = global_thread(); b < nbytes; b += grid_stride()) {
    unsigned byte = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int64_t i = b * 4 + t;
      if (i < n) {
        const acc_t v = Arith<T>::load(g[i]);
        acc_t a = fabs(v);
        a = clip < a ? clip : a;
        const uint32_t h = mix32(mix32(static_cast<uint32_t>(i) + k0) ^ k1);
        const acc_t u = static_cast<acc_t>(static_cast<int32_t>(h >> 8)) * static_cast<acc_t>(0x1p-24);
        const acc_t us = u * s;
        if (us < a) byte |= (v < acc_t(0) ? 2u : 1u) << (2 * t);
      }
    }
    codes[b] = static_cast<uint8_t>(byte);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_sum_kernel(const uint8_t* __restrict__ codes, int64_t cstride, const float* __restrict__ scales,
                      int64_t sstride, int64_t K, int64_t n, double scale, T* __restrict__ out) {
  using acc_t = typename Arith<T>::acc;
  // The path, as the CPU kernel picks it (every thread reads the K scales: K is small).
  const float s0 = __ldg(scales);
  bool shared = K <= kMaxIntK && s0 == s0;
  for (int64_t k = 1; k < K && shared; ++k) shared = __ldg(scales + k * sstride) == s0;
  const acc_t mult = shared ? static_cast<acc_t>(static_cast<double>(s0) * scale) : static_cast<acc_t>(scale);
  const int64_t nbytes = (n + 3) / 4;
  for (int64_t b = global_thread(); b < nbytes; b += grid_stride()) {
    acc_t r[4];
    if (shared) {
      int32_t sum[4] = {0, 0, 0, 0};
      for (int64_t k = 0; k < K; ++k) {
        const unsigned c = __ldg(codes + k * cstride + b);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const unsigned q = (c >> (2 * t)) & 3u;
          sum[t] += static_cast<int32_t>(q & 1u) - static_cast<int32_t>(q >> 1);
        }
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) r[t] = static_cast<acc_t>(sum[t]) * mult;
    } else {
      acc_t acc[4] = {0, 0, 0, 0};
      for (int64_t k = 0; k < K; ++k) {
        const unsigned c = __ldg(codes + k * cstride + b);
        const acc_t w = static_cast<acc_t>(__ldg(scales + k * sstride));
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const unsigned q = (c >> (2 * t)) & 3u;
          const float v = static_cast<float>(static_cast<int>(q & 1u) - static_cast<int>(q >> 1));
          const acc_t wv = w * static_cast<acc_t>(v);
          acc[t] = acc[t] + wv;
        }
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) r[t] = acc[t] * mult;
    }
#pragma unroll
    for (int t = 0; t < 4; ++t)
      if (b * 4 + t < n) out[b * 4 + t] = Arith<T>::store(r[t]);
  }
}

}  // namespace

cudaError_t terngrad_max_abs(DType dtype, const void* g, int64_t n, double* out, cudaStream_t stream) {
  // The double result doubles as the atomic's 64-bit cell: zero bits are +0.0.
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(double), stream);
  if (err != cudaSuccess || n <= 0) return err;
  auto* cell = reinterpret_cast<unsigned long long*>(out);
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    max_abs_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const T*>(g), n, cell);
    return cudaGetLastError();
  });
}

cudaError_t terngrad_encode(DType dtype, const void* g, int64_t n, double scale, double clip, uint32_t key0,
                            uint32_t key1, uint8_t* codes, cudaStream_t stream) {
  if (n < 0 || n > (int64_t(1) << 32)) return cudaErrorInvalidValue;
  const int64_t nbytes = (n + 3) / 4;
  if (nbytes == 0) return cudaSuccess;
  if (scale == 0.0) return cudaMemsetAsync(codes, 0, static_cast<size_t>(nbytes), stream);
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using acc_t = typename Arith<T>::acc;
    encode_kernel<T><<<grid_for(nbytes), kThreads, 0, stream>>>(static_cast<const T*>(g), n,
                                                                  static_cast<acc_t>(scale),
                                                                  static_cast<acc_t>(clip), key0, key1, codes);
    return cudaGetLastError();
  });
}

cudaError_t terngrad_decode_sum(DType dtype, const uint8_t* codes, int64_t cstride, const float* scales,
                                int64_t sstride, int64_t K, int64_t n, double scale, void* out, cudaStream_t stream) {
  if (n < 0 || K < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    decode_sum_kernel<T><<<grid_for((n + 3) / 4), kThreads, 0, stream>>>(codes, cstride, scales, sstride, K, n,
                                                                          scale, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

}  // namespace hgc_cuda
