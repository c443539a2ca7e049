// QSGD codec, CUDA.
//
// Norms: thread per (bucket, lane): lane j sums the squares (double) of values j, j+8, ...
// of its bucket in order, as the CPU kernel's 8 lanes do, and lane 0 combines the 8 lane
// sums in the documented order: bit-identical norms. (The max norm: lanes keep a NaN-free
// max and the first NaN; the bucket's norm is |first NaN| when there is one, as on the CPU.)
// Fixed coding: thread per output byte computes the codes of the values overlapping it
// (a value straddling two bytes is quantized by both threads, identically).
// Decode: thread per value; K payloads in order (first assigns, later add).
// Elias: levels (thread per value), code lengths (thread per bucket), offsets by the
// caller's scans, writes (thread per bucket, atomicOr on shared 32-bit words), decode
// (thread per group, sequential like the CPU's, with the same validity checks).
#include "qsgd_cuda.h"

#include "../elias_bit_reader.h"
#include "common_cuda.cuh"

namespace hgc_cuda {
namespace {

using namespace detail;

__host__ __device__ inline int code_width(int64_t s) {
  int b = 0;
  while ((s >> b) != 0) ++b;
  return 1 + b;
}

__device__ __forceinline__ int floor_log2(uint64_t x) { return 63 - __clzll(static_cast<long long>(x)); }

template <typename T>
__global__ void __launch_bounds__(kThreads)
    norms_kernel(const T* __restrict__ x, int64_t n, int64_t d, int64_t B, bool max_norm, float* __restrict__ norms) {
  using acc_t = typename Arith<T>::acc;
  // 8 consecutive threads (one aligned group of a warp) work on one bucket.
  const int64_t t = global_thread();
  const int64_t b = t >> 3;
  const int lane = static_cast<int>(t & 7);
  const unsigned mask = 0xFFu << (threadIdx.x & 24);  // the 8 lanes of this group
  double l = 0.0;
  acc_t m = 0;
  int64_t first_nan = INT64_MAX;
  if (b < B) {
    const int64_t i0 = b * d, len = min(d, n - i0);
    const T* p = x + i0;
    if (max_norm) {
      for (int64_t k = lane; k < len; k += 8) {
        const acc_t a = fabs(Arith<T>::load(p[k]));
        if (a != a) {
          if (k < first_nan) first_nan = k;
        } else {
          m = a > m ? a : m;
        }
      }
    } else {
      for (int64_t k = lane; k < len; k += 8) {
        const double a = static_cast<double>(Arith<T>::load(p[k]));
        const double sq = a * a;
        l = l + sq;
      }
    }
  }
  // All 32 threads of a warp reach the shuffles (B rounds up to whole groups of 8).
  double lanes[8];
  if (max_norm) {
    for (int j = 0; j < 8; ++j) {
      const int64_t fn = __shfl_sync(mask, first_nan, (threadIdx.x & ~7) + j);
      const acc_t mj = __shfl_sync(mask, m, (threadIdx.x & ~7) + j);
      if (fn < first_nan) first_nan = fn;
      m = mj > m ? mj : m;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) lanes[j] = __shfl_sync(mask, l, (threadIdx.x & ~7) + j);
  }
  if (lane != 0 || b >= B) return;
  if (max_norm) {
    norms[b] = first_nan != INT64_MAX ? static_cast<float>(fabs(Arith<T>::load(x[b * d + first_nan])))
                                      : static_cast<float>(m);
  } else {
    const double total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    norms[b] = static_cast<float>(sqrt(total));
  }
}

// Signed level of value i (the CPU's quantize(), same operations).
template <typename T>
__device__ __forceinline__ int32_t level_of(const T* __restrict__ x, const float* __restrict__ norms, int64_t i,
                                            int64_t d, int64_t s, uint64_t key) {
  using acc_t = typename Arith<T>::acc;
  const uint64_t h = mix64(key + static_cast<uint64_t>((i >> 1) + 1) * kGolden);
  const uint32_t word = (i & 1) ? static_cast<uint32_t>(h >> 32) : static_cast<uint32_t>(h);
  const float u = static_cast<float>(static_cast<int32_t>(word >> 8)) * 0x1p-24f;
  const acc_t S = static_cast<acc_t>(s);
  const acc_t inv = S / static_cast<acc_t>(__ldg(norms + i / d));
  const acc_t top = static_cast<acc_t>(s - 1);
  const acc_t v = Arith<T>::load(x[i]);
  acc_t r = fabs(v) * inv;
  r = r >= acc_t(0) ? r : acc_t(0);
  r = r <= S ? r : S;
  acc_t fl = static_cast<acc_t>(static_cast<int32_t>(r));
  fl = fl <= top ? fl : top;
  const acc_t p = r - fl;
  const int32_t lvl = static_cast<int32_t>(fl) + (static_cast<acc_t>(u) < p ? 1 : 0);
  return v < acc_t(0) ? -lvl : lvl;
}

__device__ __forceinline__ uint32_t code_of_level(int32_t q) {
  return (q < 0 ? 1u : 0u) | (static_cast<uint32_t>(q < 0 ? -q : q) << 1);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    pack_fixed_kernel(const T* __restrict__ x, int64_t n, int64_t d, int64_t s, int w, uint64_t key,
                      const float* __restrict__ norms, uint8_t* __restrict__ packed) {
  const int64_t nbytes = (n * w + 7) / 8;
  for (int64_t b = global_thread(); b < nbytes; b += grid_stride()) {
    const int64_t bit0 = b * 8;
    const int64_t i_lo = bit0 / w, i_hi = min(n - 1, (bit0 + 7) / w);
    uint64_t byte = 0;
    for (int64_t i = i_lo; i <= i_hi; ++i) {
      const uint64_t c = code_of_level(level_of<T>(x, norms, i, d, s, key));
      const int64_t off = i * w - bit0;  // may be negative: the value started in an earlier byte
      byte |= off >= 0 ? (c << off) : (c >> (-off));
    }
    packed[b] = static_cast<uint8_t>(byte);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_fixed_kernel(const float* __restrict__ norms, int64_t nstride, const uint8_t* __restrict__ packed,
                        int64_t pstride, int64_t K, int64_t n, int64_t s, int64_t d, int w,
                        typename Arith<T>::acc sc, bool plain, T* __restrict__ out) {
  using acc_t = typename Arith<T>::acc;
  const int64_t nbytes = (n * w + 7) / 8;
  const uint32_t mask = (uint32_t(1) << w) - 1;
  const acc_t S = static_cast<acc_t>(s);
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    const int64_t bit = i * w, byte = bit >> 3, b = i / d;
    acc_t a = 0;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t* pk = packed + k * pstride;
      uint64_t word = 0;
#pragma unroll
      for (int t = 0; t < 5; ++t)
        if (byte + t < nbytes) word |= static_cast<uint64_t>(__ldg(pk + byte + t)) << (8 * t);
      const uint32_t c = static_cast<uint32_t>(word >> (bit & 7)) & mask;
      const acc_t bscale = static_cast<acc_t>(__ldg(norms + k * nstride + b)) / S;
      const acc_t mag = static_cast<acc_t>(c >> 1) * bscale;
      const acc_t v = (c & 1u) ? -mag : mag;
      a = k == 0 ? v : a + v;
    }
    out[i] = Arith<T>::store(plain ? a : a * sc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    levels_kernel(const T* __restrict__ x, int64_t n, int64_t d, int64_t s, uint64_t key,
                  const float* __restrict__ norms, int32_t* __restrict__ q) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) q[i] = level_of<T>(x, norms, i, d, s, key);
}

__device__ __forceinline__ int64_t gamma_len(uint64_t x) { return 2 * floor_log2(x) + 1; }

__global__ void __launch_bounds__(kThreads)
    elias_bits_kernel(const int32_t* __restrict__ q, int64_t n, int64_t d, int64_t B, int64_t* __restrict__ bits) {
  for (int64_t b = global_thread(); b < B; b += grid_stride()) {
    const int64_t i0 = b * d, len = min(d, n - i0);
    int64_t total = 0, nnz = 0, prev = -1;
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = q[i0 + j];
      if (v == 0) continue;
      total += gamma_len(static_cast<uint64_t>(j - prev)) + 1 + gamma_len(static_cast<uint64_t>(v < 0 ? -v : v));
      prev = j;
      ++nnz;
    }
    bits[b] = total + gamma_len(static_cast<uint64_t>(nnz) + 1);
  }
}

// LSB-first writer of one bucket's code into zeroed 32-bit words (atomicOr: the first and
// last words may be shared with the neighbouring buckets).
struct WordWriter {
  uint32_t* words;
  int64_t pos;    // absolute bit position
  int64_t word;   // index of the word `acc` starts at
  uint64_t acc = 0;
  __device__ WordWriter(uint32_t* w, int64_t p) : words(w), pos(p), word(p >> 5) {}
  __device__ void put(uint64_t v, int len) {  // len <= 32
    acc |= v << (pos - word * 32);
    pos += len;
    while (pos - word * 32 >= 32) {
      if (static_cast<uint32_t>(acc)) atomicOr(words + word, static_cast<uint32_t>(acc));
      acc >>= 32;
      ++word;
    }
  }
  __device__ void put_gamma(uint64_t x) {  // 1 <= x < 2^32
    const int N = floor_log2(x);
    put(uint64_t(1) << N, N + 1);
    if (N) put(x ^ (uint64_t(1) << N), N);
  }
  __device__ void flush() {
    if (pos > word * 32 && static_cast<uint32_t>(acc)) atomicOr(words + word, static_cast<uint32_t>(acc));
  }
};

__global__ void __launch_bounds__(kThreads)
    elias_write_kernel(const int32_t* __restrict__ q, int64_t n, int64_t d, int64_t B,
                       const int64_t* __restrict__ off, uint32_t* __restrict__ words) {
  for (int64_t b = global_thread(); b < B; b += grid_stride()) {
    const int64_t i0 = b * d, len = min(d, n - i0);
    int64_t nnz = 0;
    for (int64_t j = 0; j < len; ++j) nnz += q[i0 + j] != 0;
    WordWriter bw(words, off[b]);
    bw.put_gamma(static_cast<uint64_t>(nnz) + 1);
    int64_t prev = -1;
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = q[i0 + j];
      if (v == 0) continue;
      bw.put_gamma(static_cast<uint64_t>(j - prev));
      bw.put(v < 0 ? 1u : 0u, 1);
      bw.put_gamma(static_cast<uint64_t>(v < 0 ? -v : v));
      prev = j;
    }
    bw.flush();
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    elias_decode_kernel(const float* __restrict__ norms, const int64_t* __restrict__ nbits,
                        const int64_t* __restrict__ gstart, const uint8_t* __restrict__ stream, int64_t stream_bytes,
                        int64_t n, int64_t s, int64_t d, int64_t gb, int64_t G, T* __restrict__ out, int* bad) {
  using acc_t = typename Arith<T>::acc;
  const int64_t B = (n + d - 1) / d;
  for (int64_t g = global_thread(); g < G; g += grid_stride()) {
    const int64_t start = gstart[g];
    const int64_t end = g + 1 < G ? gstart[g + 1] : stream_bytes;
    hgc::EliasBitReader br{stream + start, end - start};
    const int64_t limit = nbits[g];
    bool ok = true;
    for (int64_t b = g * gb, be = min(B, (g + 1) * gb); b < be && ok; ++b) {
      const int64_t i0 = b * d, len = min(d, n - i0);
      const acc_t bscale = static_cast<acc_t>(norms[b]) / static_cast<acc_t>(s);
      const T zero = Arith<T>::store(acc_t(0) * bscale);
      T* o = out + i0;
      for (int64_t j = 0; j < len; ++j) o[j] = zero;
      const uint64_t h = br.gamma();
      if (h == 0 || h - 1 > static_cast<uint64_t>(len) || br.pos > limit) { ok = false; break; }
      int64_t pos = -1;
      for (uint64_t t = 0; t + 1 < h; ++t) {
        const uint64_t gap = br.gamma();
        if (gap == 0 || br.pos >= limit) { ok = false; break; }
        pos += static_cast<int64_t>(gap);
        const uint32_t neg = br.bit();
        const uint64_t lvl = br.gamma();
        if (pos >= len || lvl == 0 || lvl > static_cast<uint64_t>(s) || br.pos > limit) { ok = false; break; }
        const acc_t v = static_cast<acc_t>(lvl) * bscale;
        o[pos] = Arith<T>::store(neg ? -v : v);
      }
    }
    if (!ok || br.pos != limit) atomicExch(bad, 1);
  }
}

}  // namespace

cudaError_t qsgd_encode_fixed(DType dtype, const void* x, int64_t n, int64_t s, int64_t d, bool max_norm,
                              uint64_t key, float* norms, uint8_t* packed, cudaStream_t stream) {
  if (n < 0 || s < 1 || d < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t B = (n + d - 1) / d;
  const int w = code_width(s);
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    const int64_t threads = B * 8;
    norms_kernel<T><<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        xt, n, d, B, max_norm, norms);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t nbytes = (n * w + 7) / 8;
    pack_fixed_kernel<T><<<grid_for(nbytes), kThreads, 0, stream>>>(xt, n, d, s, w, key, norms, packed);
    return cudaGetLastError();
  });
}

cudaError_t qsgd_decode_fixed(DType dtype, const float* norms, int64_t nstride, const uint8_t* packed,
                              int64_t pstride, int64_t K, int64_t n, int64_t s, int64_t d, double scale, void* out,
                              cudaStream_t stream) {
  if (n < 0 || s < 1 || d < 1 || K < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool plain = K == 1 && scale == 1.0;
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using acc_t = typename Arith<T>::acc;
    decode_fixed_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(norms, nstride, packed, pstride, K, n, s, d,
                                                                  code_width(s), static_cast<acc_t>(scale), plain,
                                                                  static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t qsgd_levels(DType dtype, const void* x, int64_t n, int64_t s, int64_t d, bool max_norm, uint64_t key,
                        float* norms, int32_t* q, cudaStream_t stream) {
  if (n < 0 || s < 1 || d < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t B = (n + d - 1) / d;
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    norms_kernel<T><<<static_cast<unsigned>((B * 8 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        xt, n, d, B, max_norm, norms);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    levels_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(xt, n, d, s, key, norms, q);
    return cudaGetLastError();
  });
}

cudaError_t qsgd_elias_bucket_bits(const int32_t* q, int64_t n, int64_t d, int64_t* bucket_bits,
                                   cudaStream_t stream) {
  if (n < 0 || d < 1) return cudaErrorInvalidValue;
  const int64_t B = (n + d - 1) / d;
  if (B == 0) return cudaSuccess;
  elias_bits_kernel<<<grid_for(B), kThreads, 0, stream>>>(q, n, d, B, bucket_bits);
  return cudaGetLastError();
}

cudaError_t qsgd_elias_write(const int32_t* q, int64_t n, int64_t d, const int64_t* bucket_off, uint8_t* out,
                             cudaStream_t stream) {
  if (n < 0 || d < 1) return cudaErrorInvalidValue;
  const int64_t B = (n + d - 1) / d;
  if (B == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(out) & 3u) return cudaErrorMisalignedAddress;
  elias_write_kernel<<<grid_for(B), kThreads, 0, stream>>>(q, n, d, B, bucket_off, reinterpret_cast<uint32_t*>(out));
  return cudaGetLastError();
}

cudaError_t qsgd_elias_decode(DType dtype, const float* norms, const int64_t* nbits, const int64_t* gstart,
                              const uint8_t* stream, int64_t stream_bytes, int64_t n, int64_t s, int64_t d,
                              int64_t gb, int64_t G, void* out, int* bad, cudaStream_t stream_) {
  if (n < 0 || s < 1 || d < 1 || gb < 1 || G < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    elias_decode_kernel<T><<<grid_for(G, 64), 64, 0, stream_>>>(norms, nbits, gstart, stream, stream_bytes, n, s,
                                                                 d, gb, G, static_cast<T*>(out), bad);
    return cudaGetLastError();
  });
}

}  // namespace hgc_cuda
