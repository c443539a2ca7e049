// TernGrad codec, CPU kernels (see horovod_gradcomp/codecs/terngrad.py for the wire format
// and the counter-based random stream, which the pure-torch reference reproduces bit for bit).
#pragma once
#include <torch/extension.h>
#include <tuple>

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

namespace hgc {

// terngrad_sum_levels' arguments (CPU and device ops): codes uint8 [K, >= ceil(n/4)] with
// contiguous rows, K in [1, 32767], width 4, 8 or 16 holding 0..2K. Returns K.
inline int64_t check_terngrad_sum_levels_args(const at::Tensor& codes, int64_t n, int64_t width) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte && codes.stride(1) == 1,
              "terngrad_sum_levels: codes must be uint8 [K, bytes] with contiguous rows");
  const int64_t K = codes.size(0);
  TORCH_CHECK(K >= 1 && K <= 32767, "terngrad_sum_levels: K must be in [1, ", 32767, "], got ", K);
  TORCH_CHECK(width == 4 || width == 8 || width == 16, "terngrad_sum_levels: width must be 4, 8 or 16, got ", width);
  TORCH_CHECK(2 * K < (int64_t(1) << width), "terngrad_sum_levels: ", width, "-bit fields cannot hold sums of K=", K);
  TORCH_CHECK(n >= 0 && codes.size(1) >= (n + 3) / 4, "terngrad_sum_levels: ", codes.size(1),
              " bytes of codes cannot hold ", n, " values");
  return K;
}

// terngrad_sum_decode's arguments (CPU and device ops): levels contiguous uint8, width 4, 8 or
// 16 holding 0..2K, enough bytes for n fields.
inline void check_terngrad_sum_decode_args(const at::Tensor& levels, int64_t n, int64_t k, int64_t width) {
  TORCH_CHECK(levels.dim() == 1 && levels.scalar_type() == at::kByte && levels.is_contiguous(),
              "terngrad_sum_decode: levels must be contiguous uint8 [bytes]");
  TORCH_CHECK(width == 4 || width == 8 || width == 16, "terngrad_sum_decode: width must be 4, 8 or 16, got ", width);
  TORCH_CHECK(k >= 1 && 2 * k < (int64_t(1) << width), "terngrad_sum_decode: K=", k, " does not fit ", width,
              "-bit fields");
  TORCH_CHECK(n >= 0 && levels.numel() >= (n * width + 7) / 8, "terngrad_sum_decode: ", levels.numel(),
              " bytes cannot hold ", n, " ", width, "-bit fields");
}

}  // namespace hgc
