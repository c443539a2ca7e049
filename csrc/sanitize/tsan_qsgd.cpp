// The TSan driver's QSGD cases (see tsan_case.h): per-tensor fixed-width encode, Elias encode
// and decode, and the bucket launchers of qsgd_ops.cpp's bucket ops: qsgd_encode_fixed_many,
// qsgd_decode_fixed_many, qsgd_encode_elias_many, qsgd_decode_elias_many (qsgd_decode_elias_sum_many).
// Items may mix dtypes (dt<t>), as the launchers take them.
#include <algorithm>

#include "../device/qsgd_device.h"
#include "tsan_case.h"

namespace hgc_tsan {

namespace {

int code_width(int64_t s) { return 1 + (64 - __builtin_clzll(static_cast<uint64_t>(s))); }

// The Elias stream's buffer (ByteAlloc's state: a Bytes), one byte more so that it is never empty.
uint8_t* alloc_stream(int64_t bytes, void* state) {
  Bytes& b = *static_cast<Bytes*>(state);
  b.assign(static_cast<std::size_t>(bytes) + 1, 0);
  return b.data();
}

Bytes head(const Bytes& b, int64_t bytes) { return Bytes(b.begin(), b.begin() + bytes); }

int64_t groups(int64_t n, int64_t d, int64_t gb) {
  const int64_t B = (n + d - 1) / d;
  return std::max<int64_t>(1, (B + gb - 1) / gb);
}

// A payload's G + 1 group byte offsets from its header, as hgc::qsgd_elias_group_starts makes
// them on the host for the per-tensor decode.
std::vector<int64_t> group_starts(const Bytes& nbits) {
  std::vector<int64_t> nb(nbits.size() / 8), start(nbits.size() / 8 + 1, 0);
  std::memcpy(nb.data(), nbits.data(), nbits.size());
  for (std::size_t g = 0; g < nb.size(); ++g) start[g + 1] = start[g] + (nb[g] + 7) / 8;
  return start;
}

void fail(const Case& c, const char* what) {
  std::fprintf(stderr, "%s: %s\n", c.dir.c_str(), what);
  std::exit(3);
}

// encode_fixed_many / encode_elias_many: items x<t>.bin (n<t> values of dt<t>, key<t>); s, d,
// max_norm (and gb for Elias). Outputs norms<t>, packed<t> (fixed) or norms<t>, nbits<t>, stream<t>.
void encode_many(const Case& c, Outputs& out, bool elias) {
  const int64_t count = c.i("count"), s = c.i("s"), d = c.i("d"), gb = c.i("gb", 1);
  const int w = code_width(s);
  std::vector<Bytes> x(count), norms(count), packed(count), nbits(count);
  std::vector<hgc_dev::QsgdEncodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k);
    x[t] = c.in("x" + k + ".bin");
    norms[t].assign(4 * ((n + d - 1) / d) + 4, 0);
    packed[t].assign((n * w + 7) / 8 + 1, 0);
    nbits[t].assign(8 * groups(n, d, gb), 0);
    items[t] = {c.dtype(t), x[t].data(), n, static_cast<uint64_t>(c.i("key" + k)),
                reinterpret_cast<float*>(norms[t].data()), packed[t].data(),
                reinterpret_cast<int64_t*>(nbits[t].data())};
  }
  Bytes stream;
  std::vector<int64_t> at(count + 1, 0);
  if (elias)
    hgc_dev::qsgd_encode_elias_many(host_ctx(), items.data(), count, s, d, c.flag("max_norm"), gb, &alloc_stream,
                                    &stream, at.data());
  else
    hgc_dev::qsgd_encode_fixed_many(host_ctx(), items.data(), count, s, d, c.flag("max_norm"));
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k);
    out["norms" + k] = head(norms[t], 4 * ((n + d - 1) / d));
    if (elias) {
      out["nbits" + k] = nbits[t];
      out["stream" + k] = Bytes(stream.begin() + at[t], stream.begin() + at[t + 1]);
    } else {
      out["packed" + k] = head(packed[t], (n * w + 7) / 8);
    }
  }
}

// decode_fixed_many: items norms<t>.bin (K rows of ceil(n/d) floats), packed<t>.bin (K rows of
// ceil(n w / 8) bytes), n<t>, dt<t>; K, s, d, scale. Outputs out<t>.
void decode_fixed_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count"), K = c.i("K"), s = c.i("s"), d = c.i("d");
  const int w = code_width(s);
  std::vector<Bytes> norms(count), packed(count), o(count);
  std::vector<hgc_dev::QsgdFixedDecodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k), nbytes = (n * w + 7) / 8;
    norms[t] = c.in("norms" + k + ".bin");
    packed[t] = c.in("packed" + k + ".bin");
    o[t].assign(esize(c.dtype(t)) * n, 0);
    items[t] = {c.dtype(t), reinterpret_cast<const float*>(norms[t].data()), (n + d - 1) / d, packed[t].data(), nbytes,
                nbytes, n, o[t].data()};
  }
  hgc_dev::qsgd_decode_fixed_many(host_ctx(), items.data(), count, K, s, d, c.d("scale"));
  for (int64_t t = 0; t < count; ++t) out["out" + std::to_string(t)] = o[t];
}

// decode_elias_many: items n<t>, dt<t>, each with K payloads norms<t>_<k>.bin, nbits<t>_<k>.bin,
// stream<t>_<k>.bin; K, s, d, gb, scale. Outputs out<t>.
void decode_elias_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count"), K = c.i("K");
  std::vector<Bytes> held(3 * count * K), o(count);
  std::vector<hgc_dev::QsgdEliasPayload> pays(count * K);
  std::vector<hgc_dev::QsgdEliasDecodeItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    for (int64_t r = 0; r < K; ++r) {
      const std::string kr = k + "_" + std::to_string(r);
      Bytes* h = &held[3 * (t * K + r)];
      h[0] = c.in("norms" + kr + ".bin");
      h[1] = c.in("nbits" + kr + ".bin");
      h[2] = c.in("stream" + kr + ".bin");
      const int64_t bytes = static_cast<int64_t>(h[2].size());
      h[2].push_back(0);  // never empty
      pays[t * K + r] = {reinterpret_cast<const float*>(h[0].data()), reinterpret_cast<const int64_t*>(h[1].data()),
                         h[2].data(), bytes};
    }
    o[t].assign(esize(c.dtype(t)) * c.i("n" + k), 0);
    items[t] = {c.dtype(t), c.i("n" + k), pays.data() + t * K, o[t].data()};
  }
  if (!hgc_dev::qsgd_decode_elias_sum_many(host_ctx(), items.data(), count, K, c.i("s"), c.i("d"), c.i("gb"),
                                           c.d("scale")))
    fail(c, "qsgd_decode_elias_sum_many refused a payload");
  for (int64_t t = 0; t < count; ++t) out["out" + std::to_string(t)] = o[t];
}

}  // namespace

bool run_qsgd(const Case& c, Outputs& out) {
  const auto f32 = hgc_dev::DType::kFloat;
  if (c.op == "qsgd_encode_fixed") {
    const int64_t n = c.i("n"), s = c.i("s"), d = c.i("d");
    Bytes x = c.in("x.bin"), norms(4 * ((n + d - 1) / d)), packed((n * code_width(s) + 7) / 8);
    hgc_dev::qsgd_encode_fixed(host_ctx(), f32, x.data(), n, s, d, c.flag("max_norm"),
                               static_cast<uint64_t>(c.i("key")), reinterpret_cast<float*>(norms.data()),
                               packed.data());
    out["norms"] = norms;
    out["packed"] = packed;
  } else if (c.op == "qsgd_encode_elias") {
    const int64_t n = c.i("n"), d = c.i("d"), gb = c.i("gb");
    Bytes x = c.in("x.bin"), norms(4 * ((n + d - 1) / d)), nbits(8 * groups(n, d, gb), 0), stream;
    hgc_dev::qsgd_encode_elias(host_ctx(), f32, x.data(), n, c.i("s"), d, c.flag("max_norm"),
                               static_cast<uint64_t>(c.i("key")), gb, reinterpret_cast<float*>(norms.data()),
                               reinterpret_cast<int64_t*>(nbits.data()), &alloc_stream, &stream);
    out["norms"] = norms;
    out["nbits"] = nbits;
    out["stream"] = head(stream, static_cast<int64_t>(stream.size()) - 1);
  } else if (c.op == "qsgd_decode_elias") {
    const int64_t n = c.i("n");
    Bytes norms = c.in("norms.bin"), nbits = c.in("nbits.bin"), stream = c.in("stream.bin"), o(4 * n);
    const std::vector<int64_t> start = group_starts(nbits);
    stream.push_back(0);
    if (!hgc_dev::qsgd_decode_elias(host_ctx(), f32, reinterpret_cast<const float*>(norms.data()),
                                    reinterpret_cast<const int64_t*>(nbits.data()), start.data(), stream.data(), n,
                                    c.i("s"), c.i("d"), c.i("gb"), o.data()))
      fail(c, "qsgd_decode_elias refused the payload");
    out["out"] = o;
  } else if (c.op == "qsgd_encode_fixed_many") {
    encode_many(c, out, false);
  } else if (c.op == "qsgd_encode_elias_many") {
    encode_many(c, out, true);
  } else if (c.op == "qsgd_decode_fixed_many") {
    decode_fixed_many(c, out);
  } else if (c.op == "qsgd_decode_elias_many") {
    decode_elias_many(c, out);
  } else {
    return false;
  }
  return true;
}

}  // namespace hgc_tsan
