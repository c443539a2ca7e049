// DGC index coding, CPU: fixed-width gaps (1 or 2 bytes) when every gap fits, else the
// absolute indices. Gaps are what makes the code small: at density d they average 1/d, so
// below d = 1/256 most tensors need 2 bytes per index instead of 4, and during the density
// warm-up (d >= 1/256) 1 byte.
#include "dgc_index_cpu.h"

#include <cstring>

#include "../checks.h"
#include "../payload_checks.h"

namespace {

template <typename I>
int64_t largest_gap_code(const I* q, int64_t c) {
  int64_t prev = -1, top = 0;
  for (int64_t j = 0; j < c; ++j) {
    const int64_t g = static_cast<int64_t>(q[j]) - prev - 1;
    top = g > top ? g : top;
    prev = q[j];
  }
  return top;
}

template <typename I>
void write_gaps(const I* q, int64_t c, int w, uint8_t* out) {
  int64_t prev = -1;
  for (int64_t j = 0; j < c; ++j) {
    const int64_t g = static_cast<int64_t>(q[j]) - prev - 1;
    out[j * w] = static_cast<uint8_t>(g);
    if (w == 2) out[j * w + 1] = static_cast<uint8_t>(g >> 8);
    prev = q[j];
  }
}

template <typename I>
void check_indices(const I* q, int64_t c, int64_t n, const char* op) {
  TORCH_CHECK(hgc::dgc_indices_valid(q, c, n), op, ": indices must be strictly increasing and in [0, ", n, ")");
}

}  // namespace

at::Tensor dgc_index_encode_cpu(const at::Tensor& idx, int64_t n) {
  const at::ScalarType ity = hgc::check_dgc_index_encode_args(idx, n, at::kCPU);
  const at::Tensor ix = idx.contiguous();
  const int64_t c = ix.numel();
  const auto bytes = at::TensorOptions().dtype(at::kByte);
  if (c == 0) return at::empty({0}, bytes);
  int64_t top;
  if (ity == at::kInt) {
    check_indices(ix.data_ptr<int32_t>(), c, n, "dgc_index_encode");
    top = largest_gap_code(ix.data_ptr<int32_t>(), c);
  } else {
    check_indices(ix.data_ptr<int64_t>(), c, n, "dgc_index_encode");
    top = largest_gap_code(ix.data_ptr<int64_t>(), c);
  }
  const int w = top < 256 ? 1 : top < 65536 ? 2 : 0;
  if (w == 0) {  // a gap too wide: the absolute indices, as they are
    const int64_t size = ix.element_size();
    at::Tensor out = at::empty({c * size}, bytes);
    std::memcpy(out.data_ptr<uint8_t>(), ix.data_ptr(), c * size);
    return out;
  }
  at::Tensor out = at::empty({c * w}, bytes);
  if (ity == at::kInt)
    write_gaps(ix.data_ptr<int32_t>(), c, w, out.data_ptr<uint8_t>());
  else
    write_gaps(ix.data_ptr<int64_t>(), c, w, out.data_ptr<uint8_t>());
  return out;
}

at::Tensor dgc_index_decode_cpu(const at::Tensor& code, int64_t count, int64_t n) {
  const int64_t w = hgc::check_dgc_index_decode_args(code, count, n, at::kCPU);
  const bool wide = hgc::dgc_index_type(n) == at::kLong;
  const int64_t abs_w = wide ? 8 : 4;
  const int64_t len = code.numel();
  at::Tensor out = at::empty({count}, at::TensorOptions().dtype(wide ? at::kLong : at::kInt));
  if (count == 0) return out;
  const at::Tensor cx = code.contiguous();
  const uint8_t* p = cx.data_ptr<uint8_t>();
  if (w == abs_w) {
    std::memcpy(out.data_ptr(), p, len);
  } else {
    int64_t idx = -1;
    auto next = [&](int64_t j) {
      const int64_t g = w == 1 ? p[j] : (static_cast<int64_t>(p[2 * j]) | (static_cast<int64_t>(p[2 * j + 1]) << 8));
      idx += g + 1;
      return idx;
    };
    if (wide) {
      int64_t* o = out.data_ptr<int64_t>();
      for (int64_t j = 0; j < count; ++j) o[j] = next(j);
    } else {
      int32_t* o = out.data_ptr<int32_t>();
      for (int64_t j = 0; j < count; ++j) {
        const int64_t v = next(j);
        o[j] = static_cast<int32_t>(v < n ? v : n);  // out of range: caught below
      }
    }
  }
  if (wide)
    check_indices(out.data_ptr<int64_t>(), count, n, "dgc_index_decode");
  else
    check_indices(out.data_ptr<int32_t>(), count, n, "dgc_index_decode");
  return out;
}
