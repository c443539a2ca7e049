// The TSan driver's TernGrad cases (see tsan_case.h): per-tensor encode and decode-sum, and the
// bucket launchers of terngrad_ops.cpp's bucket ops: terngrad_scale_stats_many (max |g| and the
// clip's sigma), terngrad_encode_many, terngrad_decode_sum_many.
#include "../device/terngrad_device.h"
#include "tsan_case.h"

namespace hgc_tsan {

namespace {

// scale_stats_many: count items grad<t>.bin (n<t> values); output `stats`: every max |g|, then
// every sigma (doubles), as terngrad_scale_stats_many's [2, count] tensor.
void stats_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count");
  std::vector<Bytes> g(count);
  std::vector<double> stats(2 * count, 0.0);
  std::vector<hgc_dev::TerngradStatsItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    g[t] = c.in("grad" + std::to_string(t) + ".bin");
    items[t] = {g[t].data(), c.i("n" + std::to_string(t)), &stats[t], &stats[count + t]};
  }
  hgc_dev::terngrad_scale_stats_many(host_ctx(), hgc_dev::DType::kFloat, items.data(), count);
  const auto* b = reinterpret_cast<const uint8_t*>(stats.data());
  out["stats"] = Bytes(b, b + 8 * stats.size());
}

// encode_many: count items grad<t>.bin with n, scale, clip, key0, key1 each; outputs codes<t>.
void encode_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count");
  std::vector<Bytes> g(count), codes(count);
  std::vector<hgc_dev::TerngradEncodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k);
    g[t] = c.in("grad" + k + ".bin");
    codes[t].assign((n + 3) / 4 + 1, 0);
    items[t] = {g[t].data(), n, c.d("scale" + k), c.d("clip" + k), static_cast<uint32_t>(c.i("key0" + k)),
                static_cast<uint32_t>(c.i("key1" + k)), codes[t].data()};
  }
  hgc_dev::terngrad_encode_many(host_ctx(), hgc_dev::DType::kFloat, items.data(), count);
  for (int64_t t = 0; t < count; ++t)
    out["codes" + std::to_string(t)] = Bytes(codes[t].begin(), codes[t].begin() + (c.i("n" + std::to_string(t)) + 3) / 4);
}

// decode_sum_many: count items, K payloads each (codes<t>.bin: K rows of ceil(n/4) bytes,
// scales<t>.bin: K floats), K, scale; outputs out<t>.
void decode_sum_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count"), K = c.i("K");
  std::vector<Bytes> codes(count), scales(count), o(count);
  std::vector<hgc_dev::TerngradDecodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k);
    codes[t] = c.in("codes" + k + ".bin");
    scales[t] = c.in("scales" + k + ".bin");
    o[t].assign(4 * n, 0);
    items[t] = {codes[t].data(), (n + 3) / 4, reinterpret_cast<const float*>(scales[t].data()), 1, n, o[t].data()};
  }
  hgc_dev::terngrad_decode_sum_many(host_ctx(), hgc_dev::DType::kFloat, items.data(), count, K, c.d("scale"));
  for (int64_t t = 0; t < count; ++t) out["out" + std::to_string(t)] = o[t];
}

}  // namespace

bool run_terngrad(const Case& c, Outputs& out) {
  const auto f32 = hgc_dev::DType::kFloat;
  if (c.op == "terngrad_encode") {
    const int64_t n = c.i("n");
    Bytes g = c.in("grad.bin"), codes((n + 3) / 4);
    hgc_dev::terngrad_encode(host_ctx(), f32, g.data(), n, c.d("scale"), c.d("clip"),
                             static_cast<uint32_t>(c.i("key0")), static_cast<uint32_t>(c.i("key1")), codes.data());
    out["codes"] = codes;
  } else if (c.op == "terngrad_decode_sum") {
    const int64_t n = c.i("n"), K = c.i("K");
    Bytes codes = c.in("codes.bin"), scales = c.in("scales.bin"), o(4 * n);
    hgc_dev::terngrad_decode_sum(host_ctx(), f32, codes.data(), (n + 3) / 4,
                                 reinterpret_cast<const float*>(scales.data()), 1, K, n, c.d("scale"), o.data());
    out["out"] = o;
  } else if (c.op == "terngrad_scale_stats_many") {
    stats_many(c, out);
  } else if (c.op == "terngrad_encode_many") {
    encode_many(c, out);
  } else if (c.op == "terngrad_decode_sum_many") {
    decode_sum_many(c, out);
  } else {
    return false;
  }
  return true;
}

}  // namespace hgc_tsan
