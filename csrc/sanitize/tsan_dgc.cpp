// The TSan driver's DGC cases (see tsan_case.h): per-tensor selection and scatter-sum, and the
// bucket launchers of dgc_ops.cpp's bucket ops: dgc_select_many (dgc_threshold_many, then
// dgc_compact_many), dgc_scatter_sum_many and dgc_decode_sum_many (both dgc_scatter_sum_many:
// absolute indices, or gap codes), dgc_accumulate_many, dgc_mask_many, dgc_index_encode_many
// (dgc_index_scan_many, then dgc_index_write_many). Indices are int32 (tensors under 2^31 values).
#include "../device/dgc_device.h"
#include "tsan_case.h"

namespace hgc_tsan {

namespace {

void fail(const Case& c, const char* what) {
  std::fprintf(stderr, "%s: %s\n", c.dir.c_str(), what);
  std::exit(3);
}

template <typename V> Bytes bytes_of(const std::vector<V>& v) {
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  return Bytes(b, b + sizeof(V) * v.size());
}

// select_many: items x<t>.bin (n<t> values of dt<t>), k<t>, m<t> (samples), key<t>; every item
// with n, k >= 1. Outputs idx<t>, vals<t>, `paths` (int64) and `thresholds` (double), one per item.
void select_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count");
  std::vector<Bytes> x(count);
  std::vector<hgc_dev::DgcSelectItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    x[t] = c.in("x" + k + ".bin");
    items[t] = {c.dtype(t), x[t].data(), c.i("n" + k), c.i("k" + k), c.i("m" + k),
                static_cast<uint64_t>(c.i("key" + k))};
  }
  std::vector<hgc_dev::DgcThreshold> th(count);
  hgc_dev::dgc_threshold_many(host_ctx(), items.data(), count, th.data());
  std::vector<Bytes> idx(count), vals(count);
  std::vector<hgc_dev::DgcCompactItem> compact(count);
  std::vector<int64_t> paths(count);
  std::vector<double> thresholds(count);
  for (int64_t t = 0; t < count; ++t) {
    idx[t].assign(4 * th[t].count + 1, 0);
    vals[t].assign(esize(items[t].dtype) * th[t].count + 1, 0);
    compact[t] = {items[t].dtype, items[t].x, items[t].n, th[t].key, false, idx[t].data(), vals[t].data(),
                  th[t].count};
    paths[t] = th[t].path;
    thresholds[t] = th[t].value;
  }
  hgc_dev::dgc_compact_many(host_ctx(), compact.data(), count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    out["idx" + k] = Bytes(idx[t].begin(), idx[t].end() - 1);
    out["vals" + k] = Bytes(vals[t].begin(), vals[t].end() - 1);
  }
  out["paths"] = bytes_of(paths);
  out["thresholds"] = bytes_of(thresholds);
}

// sum_many: items n<t>, dt<t>, each with K payloads index<t>_<r>.bin (w<t>_<r> bytes per index:
// 1, 2 gap codes; 4 the int32 indices) and vals<t>_<r>.bin; K, scale. Outputs out<t>.
void sum_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count"), K = c.i("K");
  std::vector<Bytes> held(2 * count * K), o(count);
  std::vector<hgc_dev::DgcSumPayload> pays(count * K);
  std::vector<hgc_dev::DgcSumTensor> tensors(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    const int64_t n = c.i("n" + k), es = esize(c.dtype(t));
    for (int64_t r = 0; r < K; ++r) {
      const std::string kr = k + "_" + std::to_string(r);
      Bytes* h = &held[2 * (t * K + r)];
      h[0] = c.in("index" + kr + ".bin");
      h[1] = c.in("vals" + kr + ".bin");
      const int64_t cnt = static_cast<int64_t>(h[1].size()) / es;
      h[0].push_back(0);  // never empty
      h[1].push_back(0);
      pays[t * K + r] = {h[0].data(), static_cast<int>(c.i("w" + kr)), cnt, h[1].data()};
    }
    o[t].assign(es * n, 0);
    tensors[t] = {c.dtype(t), n, o[t].data()};
  }
  std::vector<int64_t> bad(count * K);
  if (!hgc_dev::dgc_scatter_sum_many(host_ctx(), tensors.data(), count, pays.data(), K, c.d("scale"), bad.data()))
    fail(c, "dgc_scatter_sum_many refused a payload");
  for (int64_t t = 0; t < count; ++t) out["out" + std::to_string(t)] = o[t];
}

// accumulate_many: items u<t>.bin, v<t>.bin, g<t>.bin (n<t> values of dt<t>); momentum,
// nesterov, coef. Outputs u<t>, v<t>.
void accumulate_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count");
  std::vector<Bytes> u(count), v(count), g(count);
  std::vector<hgc_dev::DgcAccumulateItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    u[t] = c.in("u" + k + ".bin");
    v[t] = c.in("v" + k + ".bin");
    g[t] = c.in("g" + k + ".bin");
    items[t] = {c.dtype(t), u[t].data(), v[t].data(), g[t].data(), c.i("n" + k)};
  }
  hgc_dev::dgc_accumulate_many(host_ctx(), items.data(), count, c.d("momentum"), c.flag("nesterov"), c.d("coef"));
  for (int64_t t = 0; t < count; ++t) {
    out["u" + std::to_string(t)] = u[t];
    out["v" + std::to_string(t)] = v[t];
  }
}

// mask_many: items idx<t>.bin (int32), v<t>.bin and u<t>.bin (n<t> values of dt<t>; u unless
// no_u). Outputs v<t> (and u<t>).
void mask_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count");
  const bool with_u = !c.flag("no_u");
  std::vector<Bytes> idx(count), v(count), u(count);
  std::vector<hgc_dev::DgcMaskItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    const std::string k = std::to_string(t);
    idx[t] = c.in("idx" + k + ".bin");
    const int64_t cnt = static_cast<int64_t>(idx[t].size()) / 4;
    idx[t].push_back(0);
    v[t] = c.in("v" + k + ".bin");
    if (with_u) u[t] = c.in("u" + k + ".bin");
    items[t] = {idx[t].data(), false, cnt, c.i("n" + k), static_cast<int>(esize(c.dtype(t))), v[t].data(),
                with_u ? u[t].data() : nullptr};
  }
  hgc_dev::dgc_mask_many(host_ctx(), items.data(), count);
  for (int64_t t = 0; t < count; ++t) {
    out["v" + std::to_string(t)] = v[t];
    if (with_u) out["u" + std::to_string(t)] = u[t];
  }
}

// index_encode_many: items idx<t>.bin (int32, strictly increasing in [0, n<t>)). Outputs code<t>
// (gap codes of 1 or 2 bytes, or the indices' own 4 bytes), as dgc_index_encode_many picks them.
void index_encode_many(const Case& c, Outputs& out) {
  const int64_t count = c.i("count");
  std::vector<Bytes> idx(count), code(count);
  std::vector<hgc_dev::DgcIndexItem> items(count);
  for (int64_t t = 0; t < count; ++t) {
    idx[t] = c.in("idx" + std::to_string(t) + ".bin");
    const int64_t cnt = static_cast<int64_t>(idx[t].size()) / 4;
    idx[t].push_back(0);
    items[t] = {idx[t].data(), false, cnt, c.i("n" + std::to_string(t))};
  }
  std::vector<hgc_dev::DgcIndexScan> scan(count);
  hgc_dev::dgc_index_scan_many(host_ctx(), items.data(), count, scan.data());
  std::vector<int> w(count);
  std::vector<uint8_t*> at(count);
  for (int64_t t = 0; t < count; ++t) {
    if (!scan[t].ok) fail(c, "dgc_index_scan_many: indices not strictly increasing in [0, n)");
    w[t] = scan[t].top < 256 ? 1 : scan[t].top < 65536 ? 2 : 4;
    code[t].assign(items[t].count * w[t] + 1, 0);
    at[t] = code[t].data();
  }
  hgc_dev::dgc_index_write_many(host_ctx(), items.data(), w.data(), at.data(), count);
  for (int64_t t = 0; t < count; ++t) out["code" + std::to_string(t)] = Bytes(code[t].begin(), code[t].end() - 1);
}

}  // namespace

bool run_dgc(const Case& c, Outputs& out) {
  const auto f32 = hgc_dev::DType::kFloat;
  if (c.op == "dgc_select") {
    const int64_t n = c.i("n");
    Bytes x = c.in("x.bin");
    const hgc_dev::DgcThreshold t = hgc_dev::dgc_threshold(host_ctx(), f32, x.data(), n, c.i("k"),
                                                           c.i("sample_count"), static_cast<uint64_t>(c.i("key")));
    Bytes idx(4 * t.count), vals(4 * t.count);
    hgc_dev::dgc_compact(host_ctx(), f32, x.data(), n, t.key, false, idx.data(), vals.data(), t.count);
    out["idx"] = idx;
    out["vals"] = vals;
  } else if (c.op == "dgc_scatter_sum") {
    const int64_t n = c.i("n"), K = c.i("K");
    std::vector<Bytes> idx(K), vals(K);
    std::vector<const void*> ip(K), vp(K);
    std::vector<int64_t> counts(K);
    for (int64_t r = 0; r < K; ++r) {
      idx[r] = c.in("idx" + std::to_string(r) + ".bin");
      vals[r] = c.in("vals" + std::to_string(r) + ".bin");
      ip[r] = idx[r].data();
      vp[r] = vals[r].data();
      counts[r] = static_cast<int64_t>(idx[r].size() / 4);
    }
    Bytes o(4 * n);
    hgc_dev::dgc_scatter_sum(host_ctx(), f32, ip.data(), false, vp.data(), counts.data(), K, n, c.d("scale"),
                             o.data());
    out["out"] = o;
  } else if (c.op == "dgc_select_many") {
    select_many(c, out);
  } else if (c.op == "dgc_sum_many") {
    sum_many(c, out);
  } else if (c.op == "dgc_accumulate_many") {
    accumulate_many(c, out);
  } else if (c.op == "dgc_mask_many") {
    mask_many(c, out);
  } else if (c.op == "dgc_index_encode_many") {
    index_encode_many(c, out);
  } else {
    return false;
  }
  return true;
}

}  // namespace hgc_tsan
