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

// The output of a decode: `out` when given (checked: on `device`, contiguous, n values of
// `dtype`), else a new tensor on `device`. `op` names the caller in errors.
inline at::Tensor hgc_decode_output(const c10::optional<at::Tensor>& out, int64_t n, at::ScalarType dtype,
                                    const at::Device& device, const char* op) {
  if (out.has_value() && out->defined()) {
    TORCH_CHECK(out->device() == device, op, ": out is on ", out->device(), ", the payload on ", device);
    TORCH_CHECK(out->is_contiguous(), op, ": out must be contiguous");
    TORCH_CHECK(out->scalar_type() == dtype && out->numel() == n, op, ": out must hold ", n, " values of ", dtype,
                ", got ", out->numel(), " of ", out->scalar_type());
    return *out;
  }
  return at::empty({n}, at::TensorOptions().dtype(dtype).device(device));
}
