// Checks a decoder runs on a received payload before it reads a byte of it, on the CPU
// (csrc/cpu) and on CUDA (csrc/device/*_ops.cpp, CUDA and the twin) alike: one function per decoder, so that the
// two entry points of a decoder check the same things with the same messages.
//
// A payload arrives from another rank: its buffers' dtypes, dims, strides and lengths, its
// header fields and its indices are data, not promises. Every decoder validates them with
// these O(1) helpers (plus, where the format needs it, one cheap pass over a header or the
// indices: on the CPU a host loop, on CUDA a device check that sets a flag read back once)
// and raises a c10::Error (RuntimeError in Python) naming the decoder and the problem. Sizes
// are bounded first so that no later size computation can overflow.
#pragma once
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "checks.h"

namespace hgc {

// The largest value count (n) and column count a decoder accepts: 2^56 keeps n * 26 bits,
// n + bucket and 2 * cols inside int64 (no tensor on any machine comes close).
constexpr int64_t kMaxDecodeValues = int64_t(1) << 56;

// 0 <= n <= 2^56.
inline void check_decode_count(int64_t n, const char* op, const char* what = "the tensor size") {
  TORCH_CHECK(n >= 0 && n <= kMaxDecodeValues, op, ": ", what, " must be in [0, 2^56], got ", n);
}

// The output dtype of a decoder: fp16, bf16, fp32 or fp64.
inline void check_decode_dtype(at::ScalarType dtype, const char* op) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              op, ": the output dtype must be fp16, bf16, fp32 or fp64, got ", dtype);
}

// A buffer read by a decoder: defined, on a device of `device_type` (at::kCPU, at::kCUDA) and
// of `dtype`.
inline void check_buffer(const at::Tensor& t, at::ScalarType dtype, at::DeviceType device_type, const char* op,
                         const char* what) {
  TORCH_CHECK(t.defined(), op, ": ", what, " is undefined");
  TORCH_CHECK(t.device().type() == device_type, op, ": ", what, " must be a ", c10::DeviceTypeName(device_type),
              " tensor, got one on ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, op, ": ", what, " must be ", dtype, ", got ", t.scalar_type());
}

// K payloads' buffer stacked as [K, len]: a 2-D tensor (check_buffer) whose rows are
// contiguous (stride 1 along a row of more than one element) and whose row stride is not
// negative (rows may be strided views into one receive buffer, even overlap).
inline void check_stacked_buffer(const at::Tensor& t, at::ScalarType dtype, at::DeviceType device_type,
                                 const char* op, const char* what) {
  check_buffer(t, dtype, device_type, op, what);
  TORCH_CHECK(t.dim() == 2, op, ": ", what, " must be stacked as [K, length], got ", t.dim(), "-D");
  TORCH_CHECK((t.size(1) <= 1 || t.stride(1) == 1) && t.stride(0) >= 0, op, ": the rows of ", what,
              " must be contiguous, got strides ", t.strides());
}

// Two buffers of one payload on one device (on CUDA: the same GPU).
inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op, const char* a_name,
                              const char* b_name) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", a_name, " is on ", a.device(), ", ", b_name, " on ", b.device());
}

// K >= 1 payloads (K of the first stacked buffer) and the same K in the second.
inline int64_t check_same_k(const at::Tensor& a, const at::Tensor& b, const char* op, const char* a_name,
                            const char* b_name) {
  TORCH_CHECK(a.size(0) == b.size(0), op, ": ", a_name, " stacks ", a.size(0), " payloads, ", b_name, " ",
              b.size(0));
  TORCH_CHECK(a.size(0) >= 1, op, ": needs at least one payload");
  return a.size(0);
}

// ---- the decoders' checks (CPU and CUDA entry points) --------------------------------------

// onebit_decode_sum's bits and scales on one device, checked before their types so that a mixed
// pair is named as such.
inline void check_onebit_payload_devices(const at::Tensor& bits, const at::Tensor& scales) {
  TORCH_CHECK(bits.device() == scales.device(), "onebit_decode: bits and scales are on different devices");
}

// One onebit payload (onebit_decode, onebit_decode_columns): flat bits and scales.
inline void check_onebit_flat_payload(const at::Tensor& bits, const at::Tensor& scales, const char* op) {
  TORCH_CHECK(bits.dim() == 1 && scales.dim() == 1, op, ": expected flat bits and scales");
}

// onebit_decode_columns' out: contiguous, on a device of `device_type`.
inline void check_onebit_columns_out(const at::Tensor& out, at::DeviceType device_type, const char* op) {
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  TORCH_CHECK(out.device().type() == device_type, op, ": out must be a ", c10::DeviceTypeName(device_type),
              " tensor, got ", out.device());
}

// onebit_decode_sum: K >= 1 stacked payloads, bits uint8 [K, >= ceil(n/8)], scales float32
// [K, 2*cols], n split into columns of cols (by_rows, rows mode: into `cols` rows). Returns K.
inline int64_t check_onebit_decode_args(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                                        at::ScalarType dtype, at::DeviceType device_type, bool by_rows = false) {
  constexpr const char* op = "onebit_decode";
  check_decode_count(n, op);
  check_decode_count(cols, op, "the column count");
  check_decode_dtype(dtype, op);
  check_stacked_buffer(bits, at::kByte, device_type, op, "bits");
  check_stacked_buffer(scales, at::kFloat, device_type, op, "scales");
  check_same_device(bits, scales, op, "bits", "scales");
  const int64_t K = check_same_k(bits, scales, op, "bits", "scales");
  TORCH_CHECK(n == 0 || (cols > 0 && n % cols == 0), op, ": ", n, " values do not split into ",
              by_rows ? "" : "columns of ", cols, by_rows ? " rows" : "");
  TORCH_CHECK(bits.size(1) >= (n + 7) / 8, op, ": ", bits.size(1), " bytes of bits cannot hold ", n, " values");
  TORCH_CHECK(scales.size(1) == 2 * cols, op, ": expected ", 2 * cols, " scales, got ", scales.size(1));
  return K;
}

// onebit_decode_columns: out (contiguous, on `device_type`) whose window [col0, col1) of its
// full_cols columns receives one flat payload (bits, scales) of the window's values. Returns their
// count, rows * (col1 - col0).
inline int64_t check_onebit_decode_columns_args(const at::Tensor& bits, const at::Tensor& scales, const at::Tensor& out,
                                                int64_t full_cols, int64_t col0, int64_t col1,
                                                at::DeviceType device_type) {
  constexpr const char* op = "onebit_decode_columns";
  check_onebit_columns_out(out, device_type, op);
  check_column_window(out.numel(), full_cols, col0, col1, op);
  const int64_t n = out.numel() / full_cols * (col1 - col0);
  check_onebit_flat_payload(bits, scales, op);
  check_onebit_decode_args(bits.unsqueeze(0), scales.unsqueeze(0), n, col1 - col0, out.scalar_type(), device_type);
  return n;
}

// terngrad_decode_sum: K >= 1 stacked payloads, codes uint8 [K, >= ceil(n/4)], scales float32
// [K, >= 1]. Returns K.
inline int64_t check_terngrad_decode_args(const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                                          at::ScalarType dtype, at::DeviceType device_type) {
  constexpr const char* op = "terngrad_decode";
  check_decode_count(n, op);
  check_decode_dtype(dtype, op);
  check_stacked_buffer(codes, at::kByte, device_type, op, "codes");
  check_stacked_buffer(scales, at::kFloat, device_type, op, "scales");
  check_same_device(codes, scales, op, "codes", "scales");
  const int64_t K = check_same_k(codes, scales, op, "codes", "scales");
  TORCH_CHECK(codes.size(1) >= (n + 3) / 4, op, ": ", codes.size(1), " bytes of codes cannot hold ", n, " values");
  TORCH_CHECK(scales.size(1) >= 1, op, ": every payload needs its scale");
  return K;
}

// terngrad_sum_levels (the K payloads a two-phase owner received): codes uint8 [K, >= ceil(n/4)]
// with contiguous rows, K in [1, 32767], width 4, 8 or 16 holding 0..2K. Returns K.
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

// terngrad_sum_decode (an owner's summed levels, as every rank receives them): levels contiguous
// uint8, width 4, 8 or 16 holding 0..2K, enough bytes for n fields.
inline void check_terngrad_sum_decode_args(const at::Tensor& levels, int64_t n, int64_t k, int64_t width) {
  TORCH_CHECK(levels.dim() == 1 && levels.scalar_type() == at::kByte && levels.is_contiguous(),
              "terngrad_sum_decode: levels must be contiguous uint8 [bytes]");
  TORCH_CHECK(width == 4 || width == 8 || width == 16, "terngrad_sum_decode: width must be 4, 8 or 16, got ", width);
  TORCH_CHECK(k >= 1 && 2 * k < (int64_t(1) << width), "terngrad_sum_decode: K=", k, " does not fit ", width,
              "-bit fields");
  TORCH_CHECK(n >= 0 && levels.numel() >= (n * width + 7) / 8, "terngrad_sum_decode: ", levels.numel(),
              " bytes cannot hold ", n, " ", width, "-bit fields");
}

// QSGD decoders' output dtype (their own words).
inline void check_qsgd_decode_dtype(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "qsgd_decode: dtype must be fp16, bf16, fp32 or fp64, got ", dtype);
}

// qsgd_decode_fixed's payloads as [K, length] views (one flat payload: K = 1).
struct QsgdFixedPayloads {
  at::Tensor norms, packed;
  int64_t K, nbytes;
};

// qsgd_decode_fixed: flat norms and packed, or both stacked [K, length]; norms float32
// [K, ceil(n/bucket)], packed uint8 [K, ceil(n*w/8)]; K >= 1 unless n == 0.
inline QsgdFixedPayloads check_qsgd_fixed_decode_args(const at::Tensor& norms, const at::Tensor& packed, int64_t n,
                                                      int64_t s, int64_t bucket, at::ScalarType dtype,
                                                      at::DeviceType device_type) {
  constexpr const char* op = "qsgd_decode";
  check_decode_count(n, op);
  check_qsgd_params(s, bucket, n);
  check_qsgd_decode_dtype(dtype);
  TORCH_CHECK(norms.dim() == packed.dim() && (norms.dim() == 1 || norms.dim() == 2), op,
              ": expected flat norms and packed, or both stacked as [K, length], got ", norms.dim(), "-D and ",
              packed.dim(), "-D");
  at::Tensor nr = norms.dim() == 1 ? norms.unsqueeze(0) : norms;
  at::Tensor pk = packed.dim() == 1 ? packed.unsqueeze(0) : packed;
  check_stacked_buffer(nr, at::kFloat, device_type, op, "norms");
  check_stacked_buffer(pk, at::kByte, device_type, op, "packed");
  check_same_device(nr, pk, op, "norms", "packed");
  TORCH_CHECK(nr.size(0) == pk.size(0), op, ": norms stack ", nr.size(0), " payloads, packed ", pk.size(0));
  const int64_t nbytes = (n * qsgd_code_width(s) + 7) / 8;
  const int64_t B = (n + bucket - 1) / bucket;
  TORCH_CHECK(nr.size(1) == B, "qsgd_decode: expected ", B, " norms, got ", nr.size(1));
  TORCH_CHECK(pk.size(1) == nbytes, "qsgd_decode: expected ", nbytes, " packed bytes, got ", pk.size(1));
  const int64_t K = nr.size(0);
  TORCH_CHECK(K >= 1 || n == 0, "qsgd_decode: no payloads");
  return {nr, pk, K, nbytes};
}

// qsgd_decode_elias, the O(1) part: flat norms float32 [B], nbits int64 [G], stream uint8,
// group_buckets in [1, 2^31). Returns G; the header is checked by qsgd_elias_group_starts.
inline int64_t check_qsgd_elias_decode_args(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                            int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                            at::ScalarType dtype, at::DeviceType device_type) {
  constexpr const char* op = "qsgd_decode_elias";
  check_decode_count(n, op);
  check_qsgd_params(s, bucket, n);
  check_qsgd_decode_dtype(dtype);
  TORCH_CHECK(group_buckets >= 1 && group_buckets < (int64_t(1) << 31), op,
              ": group_buckets must be in [1, 2^31), got ", group_buckets);
  check_buffer(norms, at::kFloat, device_type, op, "norms");
  check_buffer(nbits, at::kLong, device_type, op, "nbits");
  check_buffer(stream, at::kByte, device_type, op, "stream");
  check_same_device(norms, nbits, op, "norms", "nbits");
  check_same_device(norms, stream, op, "norms", "stream");
  TORCH_CHECK(norms.dim() == 1 && nbits.dim() == 1 && stream.dim() == 1, op, ": expected flat buffers, got ",
              norms.dim(), "-D norms, ", nbits.dim(), "-D nbits, ", stream.dim(), "-D stream");
  const int64_t B = (n + bucket - 1) / bucket;
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  TORCH_CHECK(norms.numel() == B, op, ": expected ", B, " norms, got ", norms.numel());
  TORCH_CHECK(nbits.numel() == G, op, ": expected ", G, " group bit counts, got ", nbits.numel());
  return G;
}

// qsgd_decode_elias, the header (G bit counts, read on the host): every group's bit count fits
// in the stream (checked before it is summed, so that no corrupt count can overflow the
// offsets), and the byte counts add up to its length. Returns the G + 1 group byte offsets.
inline std::vector<int64_t> qsgd_elias_group_starts(const int64_t* nb, int64_t G, int64_t stream_bytes) {
  constexpr const char* op = "qsgd_decode_elias";
  const int64_t stream_bits = stream_bytes * 8;
  std::vector<int64_t> start(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    TORCH_CHECK(nb[g] >= 0 && nb[g] <= stream_bits, op, ": group ", g, " claims ", nb[g], " bits, the stream holds ",
                stream_bits);
    start[g + 1] = start[g] + (nb[g] + 7) / 8;
    TORCH_CHECK(start[g + 1] <= stream_bytes, op, ": the groups' bit counts run past the stream's ", stream_bytes,
                " bytes");
  }
  TORCH_CHECK(stream_bytes == start[G], op, ": the stream holds ", stream_bytes, " bytes, the header says ", start[G]);
  return start;
}

// What the Elias decoders raise when a group's code is malformed (found while decoding).
constexpr const char* kQsgdEliasMalformed =
    "qsgd_decode_elias: malformed Elias stream (a code runs past its group's bit count, out of its bucket or above "
    "the levels)";

// dgc_scatter_sum: K >= 1 payloads, each 1-D indices (dgc_index_type(n)) and values (dtype) of
// one length, all on one device of `device_type`. Returns the index type. The indices' order
// and range are data: checked by the caller (CPU: check_dgc_indices; CUDA: on the device).
inline at::ScalarType check_dgc_scatter_args(const std::vector<at::Tensor>& indices,
                                             const std::vector<at::Tensor>& values, int64_t n, at::ScalarType dtype,
                                             at::DeviceType device_type) {
  constexpr const char* op = "dgc_decode";
  check_decode_count(n, op);
  check_decode_dtype(dtype, op);
  TORCH_CHECK(indices.size() == values.size(), "dgc_decode: ", indices.size(), " index buffers but ", values.size(),
              " value buffers");
  TORCH_CHECK(!indices.empty(), "dgc_decode: no payloads");
  const at::ScalarType ity = dgc_index_type(n);
  for (size_t r = 0; r < indices.size(); ++r) {
    TORCH_CHECK(indices[r].defined() && values[r].defined(), op, ": payload ", r, " has an undefined buffer");
    check_device_type(indices[r], device_type, "indices[r]");
    check_device_type(values[r], device_type, "values[r]");
    TORCH_CHECK(indices[r].device() == indices[0].device() && values[r].device() == indices[0].device(), op,
                ": payload ", r, ": buffers on different devices (", indices[r].device(), ", ", values[r].device(),
                "; payload 0 on ", indices[0].device(), ")");
    TORCH_CHECK(indices[r].dim() == 1 && values[r].dim() == 1 && indices[r].numel() == values[r].numel(),
                "dgc_decode: payload ", r, ": indices and values must be 1-D of the same length");
    TORCH_CHECK(indices[r].scalar_type() == ity, "dgc_decode: payload ", r, ": indices must be ", ity, " for ", n,
                " values, got ", indices[r].scalar_type());
    TORCH_CHECK(values[r].scalar_type() == dtype, "dgc_decode: payload ", r, ": values must be ", dtype, ", got ",
                values[r].scalar_type());
  }
  return ity;
}

// DGC indices' validity (a host pass, CPU): strictly increasing and in [0, n).
template <typename I>
bool dgc_indices_valid(const I* q, int64_t c, int64_t n) {
  bool ok = true;
  for (int64_t j = 0; j < c; ++j) ok &= q[j] >= 0 && q[j] < n && (j == 0 || q[j - 1] < q[j]);
  return ok;
}

// dgc_index_decode: a 1-D uint8 code of 1, 2 or 4 (8 when indices are int64) bytes per index,
// count <= n indices. Returns the bytes per index (0 when count == 0).
inline int64_t check_dgc_index_decode_args(const at::Tensor& code, int64_t count, int64_t n,
                                           at::DeviceType device_type) {
  constexpr const char* op = "dgc_index_decode";
  check_decode_count(n, op);
  check_buffer(code, at::kByte, device_type, op, "the index code");
  TORCH_CHECK(code.dim() == 1, op, ": the index code must be 1-D uint8, got ", code.dim(), "-D");
  // Strictly increasing indices in [0, n): at most n of them (this also bounds count * 8).
  TORCH_CHECK(count >= 0 && count <= n, op, ": ", count, " indices cannot be distinct and in [0, ", n, ")");
  const int64_t abs_w = dgc_index_type(n) == at::kLong ? 8 : 4;
  const int64_t len = code.numel();
  TORCH_CHECK(len == count || len == 2 * count || len == abs_w * count, "dgc_index_decode: ", len,
              " bytes of index code for ", count, " values (1, 2 or ", abs_w, " bytes per index expected)");
  return count == 0 ? 0 : len / count;
}

// ---- the bucket decoders' lists (the `_many` ops, CPU and CUDA entry points) -----------------

// dgc_scatter_sum_many / dgc_decode_sum_many: one entry per tensor in every list, each tensor with
// the same K >= 1 payloads (as many index as value buffers). Returns K (0 for no tensors).
inline int64_t check_dgc_sum_lists(const char* op, const std::vector<std::vector<at::Tensor>>& indices,
                                   const std::vector<std::vector<at::Tensor>>& values, const std::vector<int64_t>& n,
                                   const std::vector<at::ScalarType>& dtypes,
                                   const std::vector<c10::optional<at::Tensor>>& outs) {
  const std::size_t count = indices.size();
  check_one_entry_per_tensor(op, "indices, values, n, dtypes and outs", count,
                             {values.size(), n.size(), dtypes.size(), outs.size()});
  if (count == 0) return 0;
  const int64_t K = static_cast<int64_t>(indices[0].size());
  TORCH_CHECK(K >= 1, op, ": tensor 0 has no payloads");
  for (std::size_t t = 0; t < count; ++t) {
    TORCH_CHECK(static_cast<int64_t>(indices[t].size()) == K && static_cast<int64_t>(values[t].size()) == K, op,
                ": tensor ", t, " has ", indices[t].size(), " index and ", values[t].size(),
                " value buffers, tensor 0 has ", K, " payloads (a bucket's tensors come from the same K ranks)");
  }
  return K;
}

// qsgd_decode_elias_many: one entry per tensor in every list, each tensor with the same K >= 1
// payloads (one norms, nbits and stream each). Returns K (-1 for no tensors).
inline int64_t check_qsgd_elias_many_lists(const std::vector<std::vector<at::Tensor>>& norms,
                                           const std::vector<std::vector<at::Tensor>>& nbits,
                                           const std::vector<std::vector<at::Tensor>>& streams,
                                           const std::vector<int64_t>& n, const std::vector<at::ScalarType>& dtypes,
                                           const std::vector<c10::optional<at::Tensor>>& outs) {
  constexpr const char* op = "qsgd_decode_elias_many";
  const std::size_t count = norms.size();
  check_one_entry_per_tensor(op, "norms, nbits, streams, n, dtypes and outs", count,
                             {nbits.size(), streams.size(), n.size(), dtypes.size(), outs.size()});
  int64_t K = -1;
  for (std::size_t i = 0; i < count; ++i) {
    const int64_t k = static_cast<int64_t>(norms[i].size());
    TORCH_CHECK(nbits[i].size() == norms[i].size() && streams[i].size() == norms[i].size(), op, ": tensor ", i,
                " has ", k, " norms, ", nbits[i].size(), " nbits and ", streams[i].size(),
                " streams (one of each per payload)");
    TORCH_CHECK(k >= 1, op, ": tensor ", i, " has no payloads");
    K = check_same_payload_count(op, i, k, K);
  }
  return K;
}

}  // namespace hgc
