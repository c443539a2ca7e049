// TernGrad codec, CPU kernels (see horovod_gradcomp/codecs/terngrad.py for the wire format
// and the counter-based random stream, which the pure-torch reference reproduces bit for bit).
#pragma once
#include <torch/extension.h>
#include <tuple>

// max |grad| in double (NaN when grad holds a NaN, 0 for an empty tensor). grad: contiguous
// CPU fp16/bf16/fp32/fp64.
double terngrad_max_abs_cpu(const at::Tensor& grad);

// Stochastic ternarization of a contiguous CPU gradient of n < 2^32 values:
//   a_i = min(|g_i|, clip)              (clip = +inf: no clipping)
//   u_i = (hash(i, key0, key1) >> 8) * 2^-24
//   code_i = (u_i * s < a_i) ? (g_i < 0 ? 2 : 1) : 0
// in float (double for fp64 gradients), s = scale (already a float32 value), 4 codes per byte,
// element i at bits 2*(i%4) of byte i/4. s == 0 gives all-zero codes.
// Returns (codes uint8[ceil(n/4)], scale float32[1]).
std::tuple<at::Tensor, at::Tensor> terngrad_encode_cpu(const at::Tensor& grad, double scale, double clip,
                                                       int64_t key0, int64_t key1);

// out[i] = scale * sum_k s_k * v_k(i), v in {-1, 0, +1} from code {2, 0, 1} (3 reads as 0), as a
// flat tensor of n values of `dtype`. codes: uint8 [K, >= ceil(n/4)], scales: float32 [K, >= 1],
// rows may be strided (last dim contiguous). When all s_k are equal the integer sums are
// scaled once by s * scale; otherwise each payload is weighted by its own s_k.
// Written into `out` (contiguous CPU, n values of dtype) when given.
at::Tensor terngrad_decode_sum_cpu(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                   at::ScalarType dtype, double scale, const c10::optional<at::Tensor>& out);
