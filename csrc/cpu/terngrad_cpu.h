// TernGrad codec, CPU kernels (see horovod_gradcomp/codecs/terngrad.py for the wire format
// and the counter-based random stream, which the pure-torch reference reproduces bit for bit).
#pragma once
#include <torch/extension.h>
#include <tuple>
#include <vector>

// The population standard deviation of grad's values in double: mean = sum / n, then
// sqrt(sum((g - mean)^2) / n), both sums in the fixed order of csrc/device/terngrad_functors.h
// (lanes, then blocks: the same bits at any thread count and on the device path). 0 when empty.
double terngrad_sigma_cpu(const at::Tensor& grad);

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

// The exact sums of K payloads that share one scale (a two-phase owner's payload): field i =
// sum_k v_k(i) + K, `width` bits (4: two per byte, low nibble first; 8; 16 little-endian).
// codes: uint8 [K, >= ceil(n/4)] (rows may be strided). Returns uint8[ceil(n * width / 8)].
at::Tensor terngrad_sum_levels_cpu(const at::Tensor& codes, int64_t n, int64_t width);

// out[i] = (field_i - K) * mult (in float, double for fp64), fields as terngrad_sum_levels writes
// them; mult = s * scale is rounded once to the arithmetic type, as in terngrad_decode_sum.
at::Tensor terngrad_sum_decode_cpu(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                                   at::ScalarType dtype, const c10::optional<at::Tensor>& out);

// ---- the bucket ops (terngrad_many_cpu.cpp) --------------------------------------------------
// The ops above applied to a bucket's tensors one after the other: the same results as the
// device's bucket ops (csrc/device/terngrad_ops.h). Each checks that every per-tensor list has
// one entry per tensor.

// A float64 [2, count] table: row 0 every gradient's max |g|, row 1 its sigma (with_sigma; else 0).
at::Tensor terngrad_scale_stats_many_cpu(const std::vector<at::Tensor>& grads, bool with_sigma);

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> terngrad_encode_many_cpu(
    const std::vector<at::Tensor>& grads, const std::vector<double>& scales, const std::vector<double>& clips,
    const std::vector<int64_t>& key0s, const std::vector<int64_t>& key1s);

std::vector<at::Tensor> terngrad_decode_sum_many_cpu(const std::vector<at::Tensor>& codes,
                                                     const std::vector<at::Tensor>& scales,
                                                     const std::vector<int64_t>& n,
                                                     const std::vector<at::ScalarType>& dtypes, double scale,
                                                     const std::vector<c10::optional<at::Tensor>>& outs);
