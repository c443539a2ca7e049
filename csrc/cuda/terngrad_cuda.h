// TernGrad codec, CUDA launchers (raw pointers, sizes, a stream; no PyTorch headers).
// Same wire format, random stream and arithmetic as csrc/cpu/terngrad_cpu.cpp: identical codes.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "dtype_cuda.h"

namespace hgc_cuda {

// *out (device double) = max |g_i| over n values (computed in the arithmetic type, exact:
// max does not round); a NaN when g holds one; 0 when n == 0.
cudaError_t terngrad_max_abs(DType dtype, const void* g, int64_t n, double* out, cudaStream_t stream);

// codes[ceil(n/4)] of g (n < 2^32 values): code_i = (u_i * s < min(|g_i|, clip)) ? (g_i < 0 ? 2 : 1) : 0,
// u_i = (mix32(mix32(i + key0) ^ key1) >> 8) * 2^-24, in float (double for kDouble); s == 0: all 0.
cudaError_t terngrad_encode(DType dtype, const void* g, int64_t n, double scale, double clip, uint32_t key0,
                            uint32_t key1, uint8_t* codes, cudaStream_t stream);

// out[i] = scale * sum_k s_k v_k(i) of K payloads (codes row k at codes + k*cstride, its float
// scale at scales[k*sstride]). When K <= 32767 and all s_k are equal (not NaN): the integer
// sum times float(s_0 * scale); otherwise float sums of s_k * v_k times float(scale) (double
// for kDouble), as the CPU kernel decides (here on the device: no host round trip).
cudaError_t terngrad_decode_sum(DType dtype, const uint8_t* codes, int64_t cstride, const float* scales,
                                int64_t sstride, int64_t K, int64_t n, double scale, void* out, cudaStream_t stream);

}  // namespace hgc_cuda
