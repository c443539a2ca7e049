// Argument checks shared by the bindings and the CPU kernels.
#pragma once
#include <torch/extension.h>

#define HGC_CHECK_CPU(x) TORCH_CHECK(!(x).is_cuda(), #x " must be a CPU tensor")
#define HGC_CHECK_CUDA(x) TORCH_CHECK((x).is_cuda(), #x " must be a CUDA tensor")
#define HGC_CHECK_CONTIGUOUS(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define HGC_CHECK_FLOATING(x)                                                                        \
  TORCH_CHECK((x).scalar_type() == at::kFloat || (x).scalar_type() == at::kDouble ||                \
                  (x).scalar_type() == at::kHalf || (x).scalar_type() == at::kBFloat16,              \
              #x " must be fp16, bf16, fp32 or fp64, got ", (x).scalar_type())
