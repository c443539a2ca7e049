// HGC_HOST_DEVICE: a function compiled for the CPU and, under nvcc, for the GPU too (headers
// shared by csrc/cpu and csrc/device; no PyTorch headers).
#pragma once

#if defined(__CUDACC__)
#define HGC_HOST_DEVICE __host__ __device__
#else
#define HGC_HOST_DEVICE
#endif
