// DGC codec, CUDA.
//
// Magnitudes are compared as integer keys (the value's bits, sign cleared), as on the CPU.
// The threshold is a function of the data and the sampling key alone (the sampled t0, or
// the exact k-th largest key), so any parallel schedule finds the CPU's threshold: the
// sampled keys are gathered by a kernel and sorted (CUB radix sort), the count above t0
// is one pass, and the exact k-th largest key comes from a radix sort of all keys (taken
// only when the sample's estimate is off by more than 2x, or there is nothing to sample).
// Compaction: CUB DeviceSelect (stable: ascending indices), then a gather of the values.
// Scatter-sum: one launch per payload in payload order, so every output value is
// accumulated in the CPU's order (a payload's indices are distinct: no atomics needed).
#include "dgc_cuda.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "../dgc_accumulate_step.h"
#include "common_cuda.cuh"

namespace hgc_cuda {
namespace {

using namespace detail;

template <typename U> __host__ __device__ constexpr U abs_mask() { return static_cast<U>(~U(0) >> 1); }

template <typename U> struct KeyOf {
  const U* p;
  __device__ U operator()(int64_t i) const { return static_cast<U>(p[i] & abs_mask<U>()); }
};

template <typename U>
__global__ void sample_kernel(const U* __restrict__ p, int64_t n, int64_t m, uint64_t key, U* __restrict__ s) {
  for (int64_t j = global_thread(); j < m; j += grid_stride()) {
    s[j] = static_cast<U>(p[hgc::dgc_sample_place(key, j, n)] & abs_mask<U>());
  }
}

template <typename U>
__global__ void keys_kernel(const U* __restrict__ p, int64_t n, U* __restrict__ k) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) k[i] = static_cast<U>(p[i] & abs_mask<U>());
}

template <typename U>
__global__ void __launch_bounds__(kThreads) count_kernel(const U* __restrict__ p, int64_t n, U t,
                                                         unsigned long long* __restrict__ count) {
  unsigned long long c = 0;
  for (int64_t i = global_thread(); i < n; i += grid_stride()) c += static_cast<U>(p[i] & abs_mask<U>()) >= t;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xFFFFFFFFu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

template <typename U> struct AtLeast {
  const U* p;
  U t;
  __host__ __device__ bool operator()(int64_t i) const { return static_cast<U>(p[i] & abs_mask<U>()) >= t; }
};

template <typename U, typename I>
__global__ void gather_kernel(const U* __restrict__ p, const I* __restrict__ idx, int64_t c, U* __restrict__ vals) {
  for (int64_t j = global_thread(); j < c; j += grid_stride()) vals[j] = p[idx[j]];
}

// Stream-ordered scratch memory.
struct Scratch {
  void* ptr = nullptr;
  cudaStream_t stream;
  explicit Scratch(cudaStream_t s) : stream(s) {}
  cudaError_t get(size_t bytes) { return cudaMallocAsync(&ptr, bytes ? bytes : 1, stream); }
  ~Scratch() {
    if (ptr) cudaFreeAsync(ptr, stream);
  }
};

// The r-th largest (1-based) of the `len` keys at d_keys (device; reordered), to the host.
template <typename U>
cudaError_t kth_largest(U* d_keys, int64_t len, int64_t r, U* out, cudaStream_t stream) {
  Scratch sorted(stream), temp(stream);
  cudaError_t err = sorted.get(sizeof(U) * len);
  if (err != cudaSuccess) return err;
  size_t bytes = 0;
  err = cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, d_keys, static_cast<U*>(sorted.ptr), len, 0,
                                                 static_cast<int>(sizeof(U) * 8), stream);
  if (err != cudaSuccess) return err;
  if ((err = temp.get(bytes)) != cudaSuccess) return err;
  err = cub::DeviceRadixSort::SortKeysDescending(temp.ptr, bytes, d_keys, static_cast<U*>(sorted.ptr), len, 0,
                                                 static_cast<int>(sizeof(U) * 8), stream);
  if (err != cudaSuccess) return err;
  err = cudaMemcpyAsync(out, static_cast<U*>(sorted.ptr) + (r - 1), sizeof(U), cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return err;
  return cudaStreamSynchronize(stream);
}

template <typename U>
cudaError_t count_at(const U* p, int64_t n, U t, int64_t* count, cudaStream_t stream) {
  Scratch cell(stream);
  cudaError_t err = cell.get(sizeof(unsigned long long));
  if (err != cudaSuccess) return err;
  auto* c = static_cast<unsigned long long*>(cell.ptr);
  if ((err = cudaMemsetAsync(c, 0, sizeof(*c), stream)) != cudaSuccess) return err;
  count_kernel<U><<<grid_for(n), kThreads, 0, stream>>>(p, n, t, c);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  unsigned long long h = 0;
  if ((err = cudaMemcpyAsync(&h, c, sizeof(h), cudaMemcpyDeviceToHost, stream)) != cudaSuccess) return err;
  err = cudaStreamSynchronize(stream);
  *count = static_cast<int64_t>(h);
  return err;
}

// The CPU's exact threshold: 1 when at most k keys are nonzero, else the k-th largest key.
template <typename U>
cudaError_t exact_threshold(const U* p, int64_t n, int64_t k, U* t, cudaStream_t stream) {
  int64_t nonzero = 0;
  cudaError_t err = count_at<U>(p, n, U(1), &nonzero, stream);
  if (err != cudaSuccess) return err;
  if (nonzero <= k) {
    *t = U(1);
    return cudaSuccess;
  }
  Scratch keys(stream);
  err = keys.get(sizeof(U) * n);
  if (err != cudaSuccess) return err;
  keys_kernel<U><<<grid_for(n), kThreads, 0, stream>>>(p, n, static_cast<U*>(keys.ptr));
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  U kth = 0;
  if ((err = kth_largest<U>(static_cast<U*>(keys.ptr), n, k, &kth, stream)) != cudaSuccess) return err;
  *t = kth > U(1) ? kth : U(1);
  return cudaSuccess;
}

double key_value(uint64_t t, DType dtype) {
  switch (dtype) {
    case DType::kHalf: {
      __half_raw r;
      r.x = static_cast<unsigned short>(t);
      return static_cast<double>(__half2float(__half(r)));
    }
    case DType::kBFloat16: {
      const uint32_t b = static_cast<uint32_t>(t) << 16;
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    case DType::kFloat: {
      const uint32_t b = static_cast<uint32_t>(t);
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    case DType::kDouble: {
      double d;
      std::memcpy(&d, &t, 8);
      return d;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

template <typename U>
cudaError_t threshold_typed(const U* p, int64_t n, int64_t k, int64_t m, uint64_t key, U* t, int64_t* path,
                            int64_t* count, cudaStream_t stream) {
  if (k >= n) {
    *t = U(1);
    *path = 2;
    return count_at<U>(p, n, *t, count, stream);
  }
  if (m > 0) {
    Scratch samples(stream);
    cudaError_t err = samples.get(sizeof(U) * m);
    if (err != cudaSuccess) return err;
    sample_kernel<U><<<grid_for(m), kThreads, 0, stream>>>(p, n, m, key, static_cast<U*>(samples.ptr));
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    int64_t r = static_cast<int64_t>(std::ceil(static_cast<double>(k) * static_cast<double>(m) / n));
    r = std::min(std::max<int64_t>(r, 1), m);
    U s = 0;
    if ((err = kth_largest<U>(static_cast<U*>(samples.ptr), m, r, &s, stream)) != cudaSuccess) return err;
    const U t0 = s > U(1) ? s : U(1);
    int64_t c0 = 0;
    if ((err = count_at<U>(p, n, t0, &c0, stream)) != cudaSuccess) return err;
    if (2 * c0 >= k && c0 <= 2 * k) {
      *t = t0;
      *path = 0;
      *count = c0;
      return cudaSuccess;
    }
    *path = c0 > 2 * k ? 1 : 2;
  } else {
    *path = 2;
  }
  cudaError_t err = exact_threshold<U>(p, n, k, t, stream);
  if (err != cudaSuccess) return err;
  return count_at<U>(p, n, *t, count, stream);
}

template <typename U, typename I>
cudaError_t compact_typed(const U* p, int64_t n, U t, I* idx, U* vals, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  Scratch num(stream), temp(stream);
  cudaError_t err = num.get(sizeof(int64_t));
  if (err != cudaSuccess) return err;
  thrust::counting_iterator<I> in(0);
  const AtLeast<U> pred{p, t};
  size_t bytes = 0;
  err = cub::DeviceSelect::If(nullptr, bytes, in, idx, static_cast<int64_t*>(num.ptr), static_cast<I>(n), pred,
                              stream);
  if (err != cudaSuccess) return err;
  if ((err = temp.get(bytes)) != cudaSuccess) return err;
  err = cub::DeviceSelect::If(temp.ptr, bytes, in, idx, static_cast<int64_t*>(num.ptr), static_cast<I>(n), pred,
                              stream);
  if (err != cudaSuccess) return err;
  gather_kernel<U, I><<<grid_for(count), kThreads, 0, stream>>>(p, idx, count, vals);
  return cudaGetLastError();
}

template <typename I>
__global__ void check_kernel(const I* __restrict__ idx, int64_t c, int64_t n, int* bad) {
  for (int64_t j = global_thread(); j < c; j += grid_stride()) {
    const int64_t v = idx[j];
    if (v < 0 || v >= n || (j > 0 && static_cast<int64_t>(idx[j - 1]) >= v)) atomicExch(bad, 1);
  }
}

template <typename T, typename A, typename I>
__global__ void scatter_add_kernel(const I* __restrict__ idx, const T* __restrict__ vals, int64_t c, int64_t n,
                                   A* __restrict__ acc) {
  for (int64_t j = global_thread(); j < c; j += grid_stride()) {
    const int64_t i = idx[j];
    if (i >= 0 && i < n) acc[i] = acc[i] + static_cast<A>(Arith<T>::load(vals[j]));
  }
}

template <typename T, typename A>
__global__ void finish_kernel(const A* __restrict__ acc, int64_t n, A sc, T* __restrict__ out) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) out[i] = Arith<T>::store(acc[i] * sc);
}

template <typename T>
__global__ void accumulate_kernel(T* __restrict__ u, T* __restrict__ v, const T* __restrict__ g, int64_t n, T m,
                                  T c, bool clip, bool nesterov) {
  for (int64_t i = global_thread(); i < n; i += grid_stride())
    hgc::dgc_accumulate_step(u[i], v[i], g[i], m, c, clip, nesterov);
}

template <typename I>
__global__ void __launch_bounds__(kThreads)
    index_scan_kernel(const I* __restrict__ idx, int64_t c, int64_t n, unsigned long long* top, int* bad) {
  unsigned long long m = 0;
  int b = 0;
  for (int64_t j = global_thread(); j < c; j += grid_stride()) {
    const int64_t v = idx[j];
    const int64_t prev = j > 0 ? static_cast<int64_t>(idx[j - 1]) : -1;
    b |= v < 0 || v >= n || prev >= v;
    const int64_t g = v - prev - 1;
    if (g > 0 && static_cast<unsigned long long>(g) > m) m = static_cast<unsigned long long>(g);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_down_sync(0xFFFFFFFFu, m, o);
    m = other > m ? other : m;
    b |= __shfl_down_sync(0xFFFFFFFFu, b, o);
  }
  if ((threadIdx.x & 31) == 0) {
    if (m) atomicMax(top, m);
    if (b) atomicExch(bad, 1);
  }
}

template <typename I>
__global__ void write_gaps_kernel(const I* __restrict__ idx, int64_t c, int w, uint8_t* __restrict__ code) {
  for (int64_t j = global_thread(); j < c; j += grid_stride()) {
    const int64_t prev = j > 0 ? static_cast<int64_t>(idx[j - 1]) : -1;
    const int64_t g = static_cast<int64_t>(idx[j]) - prev - 1;
    code[j * w] = static_cast<uint8_t>(g);
    if (w == 2) code[j * w + 1] = static_cast<uint8_t>(g >> 8);
  }
}

struct GapPlusOne {
  const uint8_t* code;
  int w;
  __host__ __device__ int64_t operator()(int64_t j) const {
    const int64_t g = w == 1 ? code[j] : (static_cast<int64_t>(code[2 * j]) | (static_cast<int64_t>(code[2 * j + 1]) << 8));
    return g + 1;
  }
};

template <typename I>
__global__ void store_indices_kernel(const int64_t* __restrict__ sums, int64_t c, int64_t n, I* __restrict__ idx) {
  for (int64_t j = global_thread(); j < c; j += grid_stride()) {
    const int64_t v = sums[j] - 1;
    idx[j] = static_cast<I>(sizeof(I) == 4 && v > n ? n : v);
  }
}

template <typename F>
cudaError_t dispatch_key(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kHalf:
    case DType::kBFloat16: return f(static_cast<uint16_t*>(nullptr));
    case DType::kFloat: return f(static_cast<uint32_t*>(nullptr));
    case DType::kDouble: return f(static_cast<uint64_t*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

cudaError_t read_flag(const int* d_flag, bool* ok, cudaStream_t stream) {
  int h = 0;
  cudaError_t err = cudaMemcpyAsync(&h, d_flag, sizeof(int), cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return err;
  err = cudaStreamSynchronize(stream);
  *ok = h == 0;
  return err;
}

}  // namespace

cudaError_t dgc_threshold(DType dtype, const void* x, int64_t n, int64_t k, int64_t sample_count, uint64_t key,
                          uint64_t* t_key, double* t_value, int64_t* path, int64_t* count, cudaStream_t stream) {
  if (n <= 0 || k <= 0 || sample_count < 0) return cudaErrorInvalidValue;
  return dispatch_key(dtype, [&](auto* tag) {
    using U = std::remove_pointer_t<decltype(tag)>;
    U t = 1;
    const cudaError_t err = threshold_typed<U>(static_cast<const U*>(x), n, k, sample_count, key, &t, path, count,
                                               stream);
    *t_key = t;
    *t_value = key_value(t, dtype);
    return err;
  });
}

cudaError_t dgc_compact(DType dtype, const void* x, int64_t n, uint64_t t_key, bool wide, void* idx, void* vals,
                        int64_t count, cudaStream_t stream) {
  return dispatch_key(dtype, [&](auto* tag) {
    using U = std::remove_pointer_t<decltype(tag)>;
    const U* p = static_cast<const U*>(x);
    if (wide) return compact_typed<U, int64_t>(p, n, static_cast<U>(t_key), static_cast<int64_t*>(idx),
                                               static_cast<U*>(vals), count, stream);
    return compact_typed<U, int32_t>(p, n, static_cast<U>(t_key), static_cast<int32_t*>(idx), static_cast<U*>(vals),
                                     count, stream);
  });
}

cudaError_t dgc_check_indices(const void* const* idx, bool wide, const int64_t* counts, int64_t K, int64_t n, int* bad,
                              cudaStream_t stream) {
  if (n < 0 || K < 1) return cudaErrorInvalidValue;
  for (int64_t r = 0; r < K; ++r) {
    if (counts[r] == 0) continue;
    if (wide)
      check_kernel<int64_t><<<grid_for(counts[r]), kThreads, 0, stream>>>(static_cast<const int64_t*>(idx[r]),
                                                                          counts[r], n, bad + r);
    else
      check_kernel<int32_t><<<grid_for(counts[r]), kThreads, 0, stream>>>(static_cast<const int32_t*>(idx[r]),
                                                                          counts[r], n, bad + r);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t dgc_scatter_sum(DType dtype, const void* const* idx, bool wide, const void* const* vals,
                            const int64_t* counts, int64_t K, int64_t n, double scale, void* out, void* acc, int* bad,
                            cudaStream_t stream) {
  if (n < 0 || K < 1) return cudaErrorInvalidValue;
  if (bad != nullptr) {
    const cudaError_t err = dgc_check_indices(idx, wide, counts, K, n, bad, stream);
    if (err != cudaSuccess) return err;
  }
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename Arith<T>::acc;
    A* a = static_cast<A*>(acc);
    cudaError_t err;
    if (n == 0) return cudaSuccess;
    if ((err = cudaMemsetAsync(a, 0, sizeof(A) * n, stream)) != cudaSuccess) return err;
    for (int64_t r = 0; r < K; ++r) {
      if (counts[r] == 0) continue;
      const T* v = static_cast<const T*>(vals[r]);
      if (wide)
        scatter_add_kernel<T, A, int64_t><<<grid_for(counts[r]), kThreads, 0, stream>>>(
            static_cast<const int64_t*>(idx[r]), v, counts[r], n, a);
      else
        scatter_add_kernel<T, A, int32_t><<<grid_for(counts[r]), kThreads, 0, stream>>>(
            static_cast<const int32_t*>(idx[r]), v, counts[r], n, a);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    finish_kernel<T, A><<<grid_for(n), kThreads, 0, stream>>>(a, n, static_cast<A>(scale), static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t dgc_accumulate(DType dtype, void* u, void* v, const void* g, int64_t n, double momentum, bool nesterov,
                           double coef, cudaStream_t stream) {
  if (n <= 0) return n < 0 ? cudaErrorInvalidValue : cudaSuccess;
  if (dtype == DType::kFloat) {
    accumulate_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<float*>(u), static_cast<float*>(v), static_cast<const float*>(g), n, static_cast<float>(momentum),
        static_cast<float>(coef), coef != 1.0, nesterov);
  } else if (dtype == DType::kDouble) {
    accumulate_kernel<double><<<grid_for(n), kThreads, 0, stream>>>(static_cast<double*>(u), static_cast<double*>(v),
                                                                    static_cast<const double*>(g), n, momentum, coef,
                                                                    coef != 1.0, nesterov);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t dgc_index_scan(const void* idx, bool wide, int64_t count, int64_t n, int64_t* top, bool* ok,
                           cudaStream_t stream) {
  *top = 0;
  *ok = true;
  if (count <= 0) return cudaSuccess;
  Scratch cells(stream);
  cudaError_t err = cells.get(2 * sizeof(unsigned long long));
  if (err != cudaSuccess) return err;
  auto* c = static_cast<unsigned long long*>(cells.ptr);
  if ((err = cudaMemsetAsync(c, 0, 2 * sizeof(*c), stream)) != cudaSuccess) return err;
  int* bad = reinterpret_cast<int*>(c + 1);
  if (wide)
    index_scan_kernel<int64_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int64_t*>(idx), count, n,
                                                                         c, bad);
  else
    index_scan_kernel<int32_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int32_t*>(idx), count, n,
                                                                         c, bad);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  unsigned long long h[2] = {0, 0};
  if ((err = cudaMemcpyAsync(h, c, sizeof(h), cudaMemcpyDeviceToHost, stream)) != cudaSuccess) return err;
  err = cudaStreamSynchronize(stream);
  *top = static_cast<int64_t>(h[0]);
  int b = 0;
  std::memcpy(&b, &h[1], sizeof(int));
  *ok = b == 0;
  return err;
}

cudaError_t dgc_index_write_gaps(const void* idx, bool wide, int64_t count, int w, uint8_t* code,
                                 cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (w != 1 && w != 2) return cudaErrorInvalidValue;
  if (wide)
    write_gaps_kernel<int64_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int64_t*>(idx), count, w,
                                                                         code);
  else
    write_gaps_kernel<int32_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int32_t*>(idx), count, w,
                                                                         code);
  return cudaGetLastError();
}

cudaError_t dgc_index_read_gaps(const uint8_t* code, int w, int64_t count, int64_t n, bool wide, void* idx, bool* ok,
                                cudaStream_t stream) {
  *ok = true;
  if (count <= 0) return cudaSuccess;
  if (w != 1 && w != 2) return cudaErrorInvalidValue;
  Scratch sums(stream), temp(stream), flag(stream);
  cudaError_t err = sums.get(sizeof(int64_t) * count);
  if (err != cudaSuccess) return err;
  thrust::transform_iterator<GapPlusOne, thrust::counting_iterator<int64_t>> in(
      thrust::counting_iterator<int64_t>(0), GapPlusOne{code, w});
  int64_t* s = static_cast<int64_t*>(sums.ptr);
  size_t bytes = 0;
  if ((err = cub::DeviceScan::InclusiveSum(nullptr, bytes, in, s, count, stream)) != cudaSuccess) return err;
  if ((err = temp.get(bytes)) != cudaSuccess) return err;
  if ((err = cub::DeviceScan::InclusiveSum(temp.ptr, bytes, in, s, count, stream)) != cudaSuccess) return err;
  if ((err = flag.get(sizeof(int))) != cudaSuccess) return err;
  int* bad = static_cast<int*>(flag.ptr);
  if ((err = cudaMemsetAsync(bad, 0, sizeof(int), stream)) != cudaSuccess) return err;
  if (wide) {
    store_indices_kernel<int64_t><<<grid_for(count), kThreads, 0, stream>>>(s, count, n, static_cast<int64_t*>(idx));
    check_kernel<int64_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int64_t*>(idx), count, n, bad);
  } else {
    store_indices_kernel<int32_t><<<grid_for(count), kThreads, 0, stream>>>(s, count, n, static_cast<int32_t*>(idx));
    check_kernel<int32_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int32_t*>(idx), count, n, bad);
  }
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  return read_flag(bad, ok, stream);
}

}  // namespace hgc_cuda
