// 1-bit codec, CUDA launchers. Plain C++ interface (raw pointers, sizes, a stream) so the
// .cu file needs no PyTorch headers. Same wire format as the CPU kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "dtype_cuda.h"

namespace hgc_cuda {

// Bytes of device scratch memory onebit_encode needs for `cols` columns.
size_t onebit_encode_workspace_bytes(int64_t cols);

// grad (n values of `dtype`, viewed [n/cols, cols]) + residual (nullable, same dtype, updated
// in place to the new quantization error) -> bits[ceil(n/8)], scales[2*cols] (a+ then a-).
// `workspace` holds onebit_encode_workspace_bytes(cols) bytes. Returns the launch error.
cudaError_t onebit_encode(DType dtype, const void* grad, void* residual, int64_t n, int64_t cols,
                          uint8_t* bits, float* scales, void* workspace, cudaStream_t stream);

// out[i] = scale * sum_{k<K} (bit_k(i) ? a+_k[col(i)] : a-_k[col(i)]); payload k's bits start at
// bits + k*bits_stride, its scales at scales + k*scales_stride. `out` has n values of `dtype`.
// Summed in float and scaled by float(scale); in double with the double scale for kDouble.
cudaError_t onebit_decode_sum(DType dtype, const uint8_t* bits, int64_t bits_stride, const float* scales,
                              int64_t scales_stride, int64_t K, int64_t n, int64_t cols, double scale, void* out,
                              cudaStream_t stream);

}  // namespace hgc_cuda
