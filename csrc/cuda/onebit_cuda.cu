// 1-bit codec with fused error feedback, CUDA. Same wire format and arithmetic as
// csrc/cpu/onebit_cpu.cpp: identical bits; scales equal up to the order of summation.
//
// Encode, for v = g (+ r) viewed as [rows, cols]:
//   1. stats: a 2-D block (tx column lanes x ty row lanes) walks a tile of columns over a
//      strided subset of rows, keeping double sums of the non-negative / negative values and
//      the non-negative count per thread; the row lanes are folded in shared memory and each
//      block stores one partial per column. With a single row chunk the block writes the
//      scales directly. Narrow tensors (cols <= 64, including cols == 1) have blocks spanning
//      whole rows, so loads stay contiguous and a 1-D tensor is reduced by the whole grid.
//   2. finalize (only with several row chunks): per column, fold the chunk partials in a
//      fixed order -> scales. Deterministic: no atomics anywhere.
//   3. pack: one thread per output byte turns 8 values into a byte and, in the same pass,
//      rewrites the residual with v - decoded.
// Decode-sum: one thread per output byte adds the K payloads' reconstructions in float (double
// for fp64 outputs; same order as the CPU kernel) and writes the 8 outputs once.
#include "onebit_cuda.h"

#include "common_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace hgc_cuda {
namespace {

constexpr int kThreads = 256;            // threads per block, all kernels
constexpr int64_t kTargetBlocks = 2048;  // stats blocks to aim for (a couple of waves)
constexpr int64_t kMaxGrid = 8192;       // cap for the grid-stride kernels
constexpr int64_t kNarrow = 64;          // up to this many columns a block spans whole rows

using detail::Arith;  // per-dtype compute type and conversions (common_cuda.cuh)

// 8 consecutive values as 16-byte accesses; p must be 16-byte aligned.
template <typename T> __device__ __forceinline__ void load8(const T* p, T (&v)[8]) {
  constexpr int kWords = sizeof(T) / 2;
  uint4 w[kWords];
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = reinterpret_cast<const uint4*>(p)[k];
  memcpy(v, w, sizeof(v));
}
template <typename T> __device__ __forceinline__ void store8(T* p, const T (&v)[8]) {
  constexpr int kWords = sizeof(T) / 2;
  uint4 w[kWords];
  memcpy(w, v, sizeof(v));
#pragma unroll
  for (int k = 0; k < kWords; ++k) reinterpret_cast<uint4*>(p)[k] = w[k];
}

// Fold the ty row lanes of a (tx, ty) block: afterwards row lane 0 holds the column totals.
// Pairwise tree with a fixed shape, so the result does not depend on scheduling.
__device__ __forceinline__ void fold_rows(double* s_pos, double* s_neg, unsigned long long* s_cnt, int x, int y,
                                          int tx, int ty) {
  const int t = y * tx + x;
  for (int s = 1; s < ty; s <<= 1) {
    __syncthreads();
    if ((y & (2 * s - 1)) == 0 && y + s < ty) {
      const int o = t + s * tx;
      s_pos[t] += s_pos[o];
      s_neg[t] += s_neg[o];
      s_cnt[t] += s_cnt[o];
    }
  }
}

__device__ __forceinline__ void write_scales(int64_t rows, int64_t cols, int64_t j, double p, double m,
                                             unsigned long long cnt, float* scales) {
  const unsigned long long neg = static_cast<unsigned long long>(rows) - cnt;
  scales[j] = cnt ? static_cast<float>(p / static_cast<double>(cnt)) : 0.f;
  scales[cols + j] = neg ? static_cast<float>(m / static_cast<double>(neg)) : 0.f;
}

// Pass 1. Grid: (column tiles, row chunks); block: (tx, ty). Thread (x, y) of block (bx, by)
// handles column bx*tx + x and rows by*ty + y + k*(gridDim.y*ty).
template <typename T, bool kRes>
__global__ void __launch_bounds__(kThreads)
    onebit_stats_kernel(const T* __restrict__ g, const T* __restrict__ r, int64_t rows, int64_t cols,
                        double* __restrict__ part_pos, double* __restrict__ part_neg,
                        unsigned long long* __restrict__ part_cnt, float* __restrict__ scales) {
  using acc_t = typename Arith<T>::acc;
  __shared__ double s_pos[kThreads];
  __shared__ double s_neg[kThreads];
  __shared__ unsigned long long s_cnt[kThreads];
  const int x = threadIdx.x, y = threadIdx.y, tx = blockDim.x, ty = blockDim.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * tx + x;
  double p = 0.0, m = 0.0;
  unsigned long long c = 0;
  if (j < cols) {
    const int64_t step = static_cast<int64_t>(gridDim.y) * ty;
#pragma unroll 4
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * ty + y; row < rows; row += step) {
      const int64_t i = row * cols + j;
      acc_t v = Arith<T>::load(g[i]);
      if (kRes) v += Arith<T>::load(r[i]);
      const bool nonneg = v >= acc_t(0);  // false for NaN
      const double d = static_cast<double>(v);
      p += nonneg ? d : 0.0;
      m += nonneg ? 0.0 : d;
      c += nonneg;
    }
  }
  const int t = y * tx + x;
  s_pos[t] = p;
  s_neg[t] = m;
  s_cnt[t] = c;
  fold_rows(s_pos, s_neg, s_cnt, x, y, tx, ty);
  if (y != 0 || j >= cols) return;
  if (gridDim.y == 1) {
    write_scales(rows, cols, j, s_pos[x], s_neg[x], s_cnt[x], scales);
  } else {
    const int64_t o = static_cast<int64_t>(blockIdx.y) * cols + j;
    part_pos[o] = s_pos[x];
    part_neg[o] = s_neg[x];
    part_cnt[o] = s_cnt[x];
  }
}

// Pass 2 (several row chunks only): same block shape, one column tile per block; row lane y
// sums chunks y, y+ty, ... of its column, then the lanes are folded.
__global__ void __launch_bounds__(kThreads)
    onebit_finalize_kernel(const double* __restrict__ part_pos, const double* __restrict__ part_neg,
                           const unsigned long long* __restrict__ part_cnt, int64_t chunks, int64_t rows,
                           int64_t cols, float* __restrict__ scales) {
  __shared__ double s_pos[kThreads];
  __shared__ double s_neg[kThreads];
  __shared__ unsigned long long s_cnt[kThreads];
  const int x = threadIdx.x, y = threadIdx.y, tx = blockDim.x, ty = blockDim.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * tx + x;
  double p = 0.0, m = 0.0;
  unsigned long long c = 0;
  if (j < cols) {
    for (int64_t k = y; k < chunks; k += ty) {
      p += part_pos[k * cols + j];
      m += part_neg[k * cols + j];
      c += part_cnt[k * cols + j];
    }
  }
  const int t = y * tx + x;
  s_pos[t] = p;
  s_neg[t] = m;
  s_cnt[t] = c;
  fold_rows(s_pos, s_neg, s_cnt, x, y, tx, ty);
  if (y == 0 && j < cols) write_scales(rows, cols, j, s_pos[x], s_neg[x], s_cnt[x], scales);
}

// Pass 3: thread per output byte. kVec: g (and r) are 16-byte aligned, so full bytes use
// 16-byte loads/stores.
template <typename T, bool kRes, bool kVec>
__global__ void __launch_bounds__(kThreads)
    onebit_pack_kernel(const T* __restrict__ g, T* __restrict__ r, int64_t n, int64_t cols,
                       const float* __restrict__ scales, uint8_t* __restrict__ bits) {
  using acc_t = typename Arith<T>::acc;
  const int64_t nbytes = (n + 7) / 8;
  const int64_t full = n / 8;
  const float* __restrict__ a_pos = scales;
  const float* __restrict__ a_neg = scales + cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nbytes; b += stride) {
    const int64_t i0 = b * 8;
    const int cnt = b < full ? 8 : static_cast<int>(n - i0);
    T gv[8], rv[8];
    if (kVec && cnt == 8) {
      load8(g + i0, gv);
      if (kRes) load8(r + i0, rv);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < cnt) {
          gv[e] = g[i0 + e];
          if (kRes) rv[e] = r[i0 + e];
        }
      }
    }
    int64_t j = (kRes && cols > 1) ? i0 % cols : 0;
    unsigned byte = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < cnt) {
        acc_t v = Arith<T>::load(gv[e]);
        if (kRes) v += Arith<T>::load(rv[e]);
        const bool nonneg = v >= acc_t(0);
        byte |= static_cast<unsigned>(nonneg) << e;
        if (kRes) {
          const acc_t q = static_cast<acc_t>(__ldg((nonneg ? a_pos : a_neg) + j));
          rv[e] = Arith<T>::store(v - q);
          if (++j == cols) j = 0;
        }
      }
    }
    bits[b] = static_cast<uint8_t>(byte);
    if (kRes) {
      if (kVec && cnt == 8) {
        store8(r + i0, rv);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (e < cnt) r[i0 + e] = rv[e];
      }
    }
  }
}

// Decode-sum: thread per output byte; K payloads summed in payload order, in float (in double
// with a double scale for double outputs, as the CPU kernel does).
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    onebit_decode_sum_kernel(const uint8_t* __restrict__ bits, int64_t bits_stride,
                             const float* __restrict__ scales, int64_t scales_stride, int64_t K, int64_t n,
                             int64_t cols, typename Arith<T>::acc scale, T* __restrict__ out) {
  using acc_t = typename Arith<T>::acc;
  const int64_t nbytes = (n + 7) / 8;
  const int64_t full = n / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nbytes; b += stride) {
    const int64_t i0 = b * 8;
    const int cnt = b < full ? 8 : static_cast<int>(n - i0);
    // Columns of the 8 values (always valid indices, also past n in the tail byte).
    int64_t jj[8];
    {
      int64_t j = cols > 1 ? i0 % cols : 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        jj[e] = j;
        if (++j == cols) j = 0;
      }
    }
    acc_t acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = acc_t(0);
    for (int64_t k = 0; k < K; ++k) {
      const unsigned byte = __ldg(bits + k * bits_stride + b);
      const float* ap = scales + k * scales_stride;
      const float* an = ap + cols;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += static_cast<acc_t>(__ldg((((byte >> e) & 1u) ? ap : an) + jj[e]));
    }
    T ov[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const acc_t y = acc[e] * scale;
      ov[e] = Arith<T>::store(y);
    }
    if (kVec && cnt == 8) {
      store8(out + i0, ov);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < cnt) out[i0 + e] = ov[e];
    }
  }
}

// ---- host side -----------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxGrid)));
}

// Row chunks the workspace is sized for: a function of cols alone.
int64_t max_chunks(int64_t cols) {
  const int64_t tiles = cols <= kNarrow ? 1 : (cols + 31) / 32;
  return std::max<int64_t>(1, kTargetBlocks / tiles);
}

struct StatsShape {
  int tx, ty;      // block: column lanes x row lanes
  int64_t tiles;   // grid.x
  int64_t chunks;  // grid.y
};

StatsShape stats_shape(int64_t rows, int64_t cols) {
  StatsShape s;
  if (cols <= kNarrow) {
    // The block spans ty whole rows: thread y*cols + x reads a contiguous run.
    s.tx = static_cast<int>(cols);
    s.ty = kThreads / s.tx;
  } else {
    // 32-column tiles with 8 row lanes; with fewer rows than lanes, trade lanes for columns.
    s.tx = 32;
    s.ty = 8;
    while (s.ty > 1 && s.ty > rows) {
      s.ty /= 2;
      s.tx *= 2;
    }
  }
  s.tiles = (cols + s.tx - 1) / s.tx;
  s.chunks = std::max<int64_t>(1, std::min<int64_t>(max_chunks(cols), (rows + s.ty - 1) / s.ty));
  return s;
}

template <typename T, bool kRes>
cudaError_t encode_typed(const T* g, T* r, int64_t n, int64_t cols, uint8_t* bits, float* scales, void* workspace,
                         cudaStream_t stream) {
  const int64_t rows = n / cols;
  const StatsShape s = stats_shape(rows, cols);
  if (s.tiles > INT_MAX) return cudaErrorInvalidConfiguration;
  double* part_pos = nullptr;
  double* part_neg = nullptr;
  unsigned long long* part_cnt = nullptr;
  if (s.chunks > 1) {
    part_pos = static_cast<double*>(workspace);
    part_neg = part_pos + s.chunks * cols;
    part_cnt = reinterpret_cast<unsigned long long*>(part_neg + s.chunks * cols);
  }
  const dim3 block(s.tx, s.ty);
  onebit_stats_kernel<T, kRes><<<dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.chunks)), block, 0,
                                 stream>>>(g, r, rows, cols, part_pos, part_neg, part_cnt, scales);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (s.chunks > 1) {
    onebit_finalize_kernel<<<static_cast<unsigned>(s.tiles), block, 0, stream>>>(part_pos, part_neg, part_cnt,
                                                                                  s.chunks, rows, cols, scales);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const unsigned grid = grid_for((n + 7) / 8);
  if (aligned16(g) && (!kRes || aligned16(r))) {
    onebit_pack_kernel<T, kRes, true><<<grid, kThreads, 0, stream>>>(g, r, n, cols, scales, bits);
  } else {
    onebit_pack_kernel<T, kRes, false><<<grid, kThreads, 0, stream>>>(g, r, n, cols, scales, bits);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t encode_dispatch(const void* grad, void* residual, int64_t n, int64_t cols, uint8_t* bits, float* scales,
                            void* workspace, cudaStream_t stream) {
  const T* g = static_cast<const T*>(grad);
  T* r = static_cast<T*>(residual);
  return r ? encode_typed<T, true>(g, r, n, cols, bits, scales, workspace, stream)
           : encode_typed<T, false>(g, nullptr, n, cols, bits, scales, workspace, stream);
}

template <typename T>
cudaError_t decode_dispatch(const uint8_t* bits, int64_t bits_stride, const float* scales, int64_t scales_stride,
                            int64_t K, int64_t n, int64_t cols, double scale, void* out, cudaStream_t stream) {
  T* o = static_cast<T*>(out);
  const auto sc = static_cast<typename Arith<T>::acc>(scale);
  const unsigned grid = grid_for((n + 7) / 8);
  if (aligned16(o)) {
    onebit_decode_sum_kernel<T, true>
        <<<grid, kThreads, 0, stream>>>(bits, bits_stride, scales, scales_stride, K, n, cols, sc, o);
  } else {
    onebit_decode_sum_kernel<T, false>
        <<<grid, kThreads, 0, stream>>>(bits, bits_stride, scales, scales_stride, K, n, cols, sc, o);
  }
  return cudaGetLastError();
}

bool bad_shape(int64_t n, int64_t cols) { return n < 0 || cols < 0 || (n > 0 && (cols == 0 || n % cols != 0)); }

}  // namespace

size_t onebit_encode_workspace_bytes(int64_t cols) {
  if (cols <= 0) return 0;
  const int64_t chunks = max_chunks(cols);
  // With one chunk the stats kernel writes the scales itself and needs no scratch.
  if (chunks == 1) return 0;
  // [chunks*cols] double positive sums, [chunks*cols] double negative sums,
  // [chunks*cols] uint64 non-negative counts.
  return static_cast<size_t>(chunks * cols) * (2 * sizeof(double) + sizeof(unsigned long long));
}

cudaError_t onebit_encode(DType dtype, const void* grad, void* residual, int64_t n, int64_t cols, uint8_t* bits,
                          float* scales, void* workspace, cudaStream_t stream) {
  if (bad_shape(n, cols)) return cudaErrorInvalidValue;
  if (n == 0) {
    // No values: every column is empty on both sides, so all scales are 0.
    return cols > 0 ? cudaMemsetAsync(scales, 0, static_cast<size_t>(2 * cols) * sizeof(float), stream)
                    : cudaSuccess;
  }
  switch (dtype) {
    case DType::kHalf: return encode_dispatch<__half>(grad, residual, n, cols, bits, scales, workspace, stream);
    case DType::kBFloat16:
      return encode_dispatch<__nv_bfloat16>(grad, residual, n, cols, bits, scales, workspace, stream);
    case DType::kFloat: return encode_dispatch<float>(grad, residual, n, cols, bits, scales, workspace, stream);
    case DType::kDouble: return encode_dispatch<double>(grad, residual, n, cols, bits, scales, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t onebit_decode_sum(DType dtype, const uint8_t* bits, int64_t bits_stride, const float* scales,
                              int64_t scales_stride, int64_t K, int64_t n, int64_t cols, double scale, void* out,
                              cudaStream_t stream) {
  if (bad_shape(n, cols) || K < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kHalf:
      return decode_dispatch<__half>(bits, bits_stride, scales, scales_stride, K, n, cols, scale, out, stream);
    case DType::kBFloat16:
      return decode_dispatch<__nv_bfloat16>(bits, bits_stride, scales, scales_stride, K, n, cols, scale, out,
                                            stream);
    case DType::kFloat:
      return decode_dispatch<float>(bits, bits_stride, scales, scales_stride, K, n, cols, scale, out, stream);
    case DType::kDouble:
      return decode_dispatch<double>(bits, bits_stride, scales, scales_stride, K, n, cols, scale, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace hgc_cuda
