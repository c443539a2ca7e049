// The TSan driver's onebit cases (see tsan_case.h): per-tensor encode and decode-sum, and the
// bucket launchers as onebit_ops.cpp calls them for every bucket op: onebit_encode_many (both
// passes; the scales alone: onebit_scales_many; the pack alone with given scales), over whole
// tensors or column windows (onebit_encode_columns_many: ld > cols, from element col0), and
// onebit_decode_sum_many (K payloads; a column window of a full output: onebit_decode_columns_many).
#include "../device/onebit_device.h"
#include "tsan_case.h"

namespace hgc_tsan {

namespace {

// onebit_encode_many: count items; per item t: n<t>, cols<t>, ld<t> (default cols), off<t> (the
// window's first element, default 0), by_rows<t>; inputs grad<t>.bin (the whole matrix),
// residual<t>.bin (unless no_residual), scales<t>.bin (passes=2: the pack alone).
void encode_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count"), passes_code = c.i("passes", 0);
  const bool with_residual = !c.flag("no_residual");
  const auto passes = passes_code == 1 ? hgc_dev::OnebitPasses::kScales
                      : passes_code == 2 ? hgc_dev::OnebitPasses::kPack
                                         : hgc_dev::OnebitPasses::kBoth;
  std::vector<Bytes> g(count), r(count), bits(count), scales(count);
  std::vector<hgc_dev::OnebitEncodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k), cols = c.i("cols" + k), ld = c.i("ld" + k, cols), off = 4 * c.i("off" + k, 0);
    g[t] = c.in("grad" + k + ".bin");
    if (with_residual) r[t] = c.in("residual" + k + ".bin");
    bits[t].assign((n + 7) / 8 + 1, 0);
    scales[t] = passes_code == 2 ? c.in("scales" + k + ".bin") : Bytes(8 * cols + 1, 0);
    items[t] = {g[t].data() + off, with_residual ? r[t].data() + off : nullptr, n, cols, ld, bits[t].data(),
                reinterpret_cast<float*>(scales[t].data()), c.flag("by_rows" + k)};
  }
  hgc_dev::onebit_encode_many(host_ctx(), hgc_dev::DType::kFloat, items.data(), count, with_residual, passes);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k), cols = c.i("cols" + k);
    if (passes_code != 1) out["bits" + k] = Bytes(bits[t].begin(), bits[t].begin() + (n + 7) / 8);
    if (passes_code != 2) out["scales" + k] = Bytes(scales[t].begin(), scales[t].begin() + 8 * cols);
    if (with_residual) out["residual" + k] = r[t];
  }
}

// onebit_decode_sum_many: count items, K payloads each (bits<t>.bin: K rows of ceil(n/8) bytes,
// scales<t>.bin: K rows of 2 cols floats), K, scale; per item n, cols, ld, off, by_rows as above,
// and out<t>.bin when the output starts from given values (a window of a full tensor).
void decode_sum_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count"), K = c.i("K");
  std::vector<Bytes> bits(count), scales(count), o(count);
  std::vector<hgc_dev::OnebitDecodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k), cols = c.i("cols" + k), ld = c.i("ld" + k, cols), off = 4 * c.i("off" + k, 0);
    bits[t] = c.in("bits" + k + ".bin");
    scales[t] = c.in("scales" + k + ".bin");
    o[t] = c.flag("out_given" + k) ? c.in("out" + k + ".bin") : Bytes(4 * n, 0);
    items[t] = {bits[t].data(), (n + 7) / 8, reinterpret_cast<const float*>(scales[t].data()), 2 * cols, n, cols, ld,
                o[t].data() + off, c.flag("by_rows" + k)};
  }
  hgc_dev::onebit_decode_sum_many(host_ctx(), hgc_dev::DType::kFloat, items.data(), count, K, c.d("scale"));
  for (int64_t t = 0; t < count; ++t) out["out" + std::to_string(t)] = o[t];
}

}  // namespace

bool run_onebit(const Case& c, Outputs& out) {
  const auto f32 = hgc_dev::DType::kFloat;
  if (c.op == "onebit_encode") {
    const int64_t n = c.i("n"), cols = c.i("cols");
    Bytes g = c.in("grad.bin"), r = c.in("residual.bin");
    Bytes bits((n + 7) / 8), scales(8 * cols, 0);
    hgc_dev::onebit_encode(host_ctx(), f32, g.data(), r.data(), n, cols, cols, bits.data(),
                           reinterpret_cast<float*>(scales.data()), hgc_dev::OnebitPasses::kBoth, c.flag("by_rows"));
    out["bits"] = bits;
    out["scales"] = scales;
    out["residual"] = r;
  } else if (c.op == "onebit_decode_sum") {
    const int64_t n = c.i("n"), cols = c.i("cols"), K = c.i("K");
    Bytes bits = c.in("bits.bin"), scales = c.in("scales.bin"), o(4 * n);
    hgc_dev::onebit_decode_sum(host_ctx(), f32, bits.data(), (n + 7) / 8,
                               reinterpret_cast<const float*>(scales.data()), 2 * cols, K, n, cols, cols, c.d("scale"),
                               o.data(), c.flag("by_rows"));
    out["out"] = o;
  } else if (c.op == "onebit_encode_many") {
    encode_many(c, out);
  } else if (c.op == "onebit_decode_sum_many") {
    decode_sum_many(c, out);
  } else {
    return false;
  }
  return true;
}

}  // namespace hgc_tsan
