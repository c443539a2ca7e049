// Torch ops of QSGD's device path (see ops_common.h): the CPU ops' checks and messages, outputs
// on the input's device, the launchers of qsgd_device.cu on the current stream. Host round
// trips: the Elias encode reads its stream's size back; the Elias decode copies the G group bit
// counts to the host (checked there with the CPU's messages) and reads one malformed flag back.
// The bucket ops (*_many) make those reads once per bucket, not per tensor.
#include "qsgd_ops.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "../checks.h"
#include "../payload_checks.h"
#include "ops_common.h"
#include "qsgd_device.h"
#include "registry.h"

namespace {

struct StreamOut {
  at::TensorOptions options;
  at::Tensor stream;
};

uint8_t* alloc_stream(int64_t bytes, void* state) {
  auto* so = static_cast<StreamOut*>(state);
  so->stream = at::empty({bytes}, so->options);
  return so->stream.data_ptr<uint8_t>();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_device(const at::Tensor& x, int64_t s, int64_t bucket,
                                                            bool max_norm, int64_t key) {
  hgc::check_values_input(x, hgc_dev::kDeviceType, "x");
  const int64_t n = x.numel();
  hgc::check_qsgd_params(s, bucket, n);
  const hgc_dev::DeviceGuard guard(x.device());
  const int w = hgc::qsgd_code_width(s);
  auto norms = at::empty({(n + bucket - 1) / bucket}, x.options().dtype(at::kFloat));
  auto packed = at::empty({(n * w + 7) / 8}, x.options().dtype(at::kByte));
  hgc_dev::qsgd_encode_fixed(hgc_dev::current_ctx(), hgc_dev::dev_dtype(x.scalar_type()), x.data_ptr(), n, s, bucket,
                             max_norm, static_cast<uint64_t>(key), norms.data_ptr<float>(),
                             packed.data_ptr<uint8_t>());
  return {norms, packed};
}

at::Tensor qsgd_decode_fixed_device(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                    int64_t bucket, at::ScalarType dtype, double scale,
                                    const c10::optional<at::Tensor>& out_opt) {
  // One payload as flat buffers, or K stacked as [K, length].
  const hgc::QsgdFixedPayloads p =
      hgc::check_qsgd_fixed_decode_args(norms, packed, n, s, bucket, dtype, hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(norms.device());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  hgc_dev::qsgd_decode_fixed(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), p.norms.data_ptr<float>(),
                             p.norms.stride(0), p.packed.data_ptr<uint8_t>(), p.packed.stride(0), p.nbytes, p.K, n, s,
                             bucket, scale, out.data_ptr());
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_device(const at::Tensor& x, int64_t s,
                                                                        int64_t bucket, bool max_norm, int64_t key,
                                                                        int64_t group_buckets) {
  hgc::check_values_input(x, hgc_dev::kDeviceType, "x");
  const int64_t n = x.numel();
  hgc::check_qsgd_elias_encode_args(s, bucket, n, group_buckets);
  const hgc_dev::DeviceGuard guard(x.device());
  const int64_t B = (n + bucket - 1) / bucket;
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  const auto opts = x.options();
  auto norms = at::empty({B}, opts.dtype(at::kFloat));
  auto nbits = at::zeros({G}, opts.dtype(at::kLong));
  if (B == 0) return {norms, nbits, at::empty({0}, opts.dtype(at::kByte))};
  StreamOut so{opts.dtype(at::kByte), at::Tensor()};
  hgc_dev::qsgd_encode_elias(hgc_dev::current_ctx(), hgc_dev::dev_dtype(x.scalar_type()), x.data_ptr(), n, s, bucket,
                             max_norm, static_cast<uint64_t>(key), group_buckets, norms.data_ptr<float>(),
                             nbits.data_ptr<int64_t>(), &alloc_stream, &so);
  return {norms, nbits, so.stream};
}

at::Tensor qsgd_decode_elias_device(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                    int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                    at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  const int64_t G = hgc::check_qsgd_elias_decode_args(norms, nbits, stream, n, s, bucket, group_buckets, dtype,
                                                      hgc_dev::kDeviceType);
  const hgc_dev::DeviceGuard guard(norms.device());
  // The header decides the stream's layout: its G bit counts are checked on the host (one copy),
  // with the CPU's messages, before anything reads the stream.
  const at::Tensor nb = nbits.contiguous();
  const at::Tensor nb_host = hgc_dev::read_back(nb);
  const std::vector<int64_t> start = hgc::qsgd_elias_group_starts(nb_host.data_ptr<int64_t>(), G, stream.numel());
  at::Tensor out = hgc_decode_output(out_opt, n, dtype, norms.device(), "qsgd_decode");
  if (n == 0) return out;
  const at::Tensor start_dev =
      hgc_dev::upload(at::tensor(at::ArrayRef<int64_t>(start), at::TensorOptions().dtype(at::kLong)), norms.device());
  const at::Tensor nr = norms.contiguous(), st = stream.contiguous();
  const bool ok = hgc_dev::qsgd_decode_elias(hgc_dev::current_ctx(), hgc_dev::dev_dtype(dtype), nr.data_ptr<float>(),
                                             nb.data_ptr<int64_t>(), start_dev.data_ptr<int64_t>(),
                                             st.data_ptr<uint8_t>(), n, s, bucket, group_buckets, out.data_ptr());
  TORCH_CHECK(ok, hgc::kQsgdEliasMalformed);
  return out;
}

// ---- a bucket at once ----------------------------------------------------------------------------

namespace {

// tensors[i].narrow(0, at[i], len[i]) for each i: the per-tensor views of one bucket buffer.
std::vector<at::Tensor> views(const at::Tensor& buffer, const std::vector<int64_t>& len) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const int64_t l : len) {
    out.push_back(buffer.narrow(0, offset, l));
    offset += l;
  }
  return out;
}

// The checks of a bucket encode (one key per tensor, one device, each tensor as the per-tensor
// op checks it); returns the bucket's device.
at::Device check_encode_many(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& keys, int64_t s,
                             int64_t bucket, const char* op) {
  TORCH_CHECK(keys.size() == xs.size(), op, ": ", xs.size(), " tensors but ", keys.size(), " keys");
  const at::Device device = hgc_dev::bucket_device(xs, op, "tensor");
  for (const at::Tensor& x : xs) {
    hgc::check_values_input(x, hgc_dev::kDeviceType, "x");
    hgc::check_qsgd_params(s, bucket, x.numel());
  }
  return device;
}

// The bucket encode's items (payload pointers filled in by the caller).
std::vector<hgc_dev::QsgdEncodeItem> encode_items(const std::vector<at::Tensor>& xs, const std::vector<int64_t>& keys) {
  std::vector<hgc_dev::QsgdEncodeItem> items(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    items[i] = {hgc_dev::dev_dtype(xs[i].scalar_type()), xs[i].data_ptr(), xs[i].numel(),
                static_cast<uint64_t>(keys[i]), nullptr, nullptr, nullptr};
  }
  return items;
}

// Each tensor's number of norms, ceil(n / bucket).
std::vector<int64_t> norm_counts(const std::vector<at::Tensor>& xs, int64_t bucket) {
  std::vector<int64_t> B;
  for (const at::Tensor& x : xs) B.push_back((x.numel() + bucket - 1) / bucket);
  return B;
}

}  // namespace

QsgdFixedBucket qsgd_encode_fixed_many_device(const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket,
                                              bool max_norm, const std::vector<int64_t>& keys) {
  constexpr const char* op = "qsgd_encode_fixed_many";
  if (xs.empty() && keys.empty()) return {{}, {}};
  const at::Device device = check_encode_many(xs, keys, s, bucket, op);
  const hgc_dev::DeviceGuard guard(device);
  const int w = hgc::qsgd_code_width(s);
  const std::vector<int64_t> B = norm_counts(xs, bucket);
  std::vector<int64_t> nbytes;
  for (const at::Tensor& x : xs) nbytes.push_back((x.numel() * w + 7) / 8);
  const auto opts = xs[0].options();
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); };
  const std::vector<at::Tensor> norms = views(at::empty({sum(B)}, opts.dtype(at::kFloat)), B);
  const std::vector<at::Tensor> packed = views(at::empty({sum(nbytes)}, opts.dtype(at::kByte)), nbytes);
  std::vector<hgc_dev::QsgdEncodeItem> items = encode_items(xs, keys);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    items[i].norms = norms[i].data_ptr<float>();
    items[i].packed = packed[i].data_ptr<uint8_t>();
  }
  hgc_dev::qsgd_encode_fixed_many(hgc_dev::current_ctx(), items.data(), static_cast<int64_t>(items.size()), s,
                                  bucket, max_norm);
  return {norms, packed};
}

std::vector<at::Tensor> qsgd_decode_fixed_many_device(const std::vector<at::Tensor>& norms,
                                                      const std::vector<at::Tensor>& packed,
                                                      const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                      const std::vector<at::ScalarType>& dtypes, double scale,
                                                      const std::vector<c10::optional<at::Tensor>>& outs) {
  constexpr const char* op = "qsgd_decode_fixed_many";
  const std::size_t count = norms.size();
  hgc::check_one_entry_per_tensor(op, "norms, packed, n, dtypes and outs", count,
                                  {packed.size(), n.size(), dtypes.size(), outs.size()});
  std::vector<at::Tensor> results;
  if (count == 0) return results;
  const at::Device device = hgc_dev::bucket_device(norms, op, "norms");
  const hgc_dev::DeviceGuard guard(device);
  int64_t K = -1;
  std::vector<hgc_dev::QsgdFixedDecodeItem> items(count);
  for (std::size_t i = 0; i < count; ++i) {
    const hgc::QsgdFixedPayloads p =
        hgc::check_qsgd_fixed_decode_args(norms[i], packed[i], n[i], s, bucket, dtypes[i], hgc_dev::kDeviceType);
    K = hgc::check_same_payload_count(op, i, p.K, K);
    results.push_back(hgc_decode_output(outs[i], n[i], dtypes[i], device, "qsgd_decode"));
    items[i] = {hgc_dev::dev_dtype(dtypes[i]), p.norms.data_ptr<float>(), p.norms.stride(0),
                p.packed.data_ptr<uint8_t>(), p.packed.stride(0), p.nbytes, n[i], results[i].data_ptr()};
  }
  hgc_dev::qsgd_decode_fixed_many(hgc_dev::current_ctx(), items.data(), static_cast<int64_t>(count), K, s, bucket,
                                  scale);
  return results;
}

QsgdEliasBucket qsgd_encode_elias_many_device(const std::vector<at::Tensor>& xs, int64_t s, int64_t bucket,
                                              bool max_norm, const std::vector<int64_t>& keys,
                                              int64_t group_buckets) {
  constexpr const char* op = "qsgd_encode_elias_many";
  if (xs.empty() && keys.empty()) return {{}, {}, {}};
  const at::Device device = check_encode_many(xs, keys, s, bucket, op);
  for (const at::Tensor& x : xs) hgc::check_qsgd_elias_encode_args(s, bucket, x.numel(), group_buckets);
  const hgc_dev::DeviceGuard guard(device);
  const std::vector<int64_t> B = norm_counts(xs, bucket);
  std::vector<int64_t> G;  // a tensor's group bit counts: at least one (0 for an empty tensor)
  for (const int64_t b : B) G.push_back(std::max<int64_t>(1, (b + group_buckets - 1) / group_buckets));
  const auto opts = xs[0].options();
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); };
  const std::vector<at::Tensor> norms = views(at::empty({sum(B)}, opts.dtype(at::kFloat)), B);
  const std::vector<at::Tensor> nbits = views(at::zeros({sum(G)}, opts.dtype(at::kLong)), G);
  std::vector<hgc_dev::QsgdEncodeItem> items = encode_items(xs, keys);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    items[i].norms = norms[i].data_ptr<float>();
    items[i].nbits = nbits[i].data_ptr<int64_t>();
  }
  StreamOut so{opts.dtype(at::kByte), at::Tensor()};
  std::vector<int64_t> stream_at(xs.size() + 1, 0);
  hgc_dev::qsgd_encode_elias_many(hgc_dev::current_ctx(), items.data(), static_cast<int64_t>(items.size()), s, bucket,
                                  max_norm, group_buckets, &alloc_stream, &so, stream_at.data());
  std::vector<at::Tensor> streams;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    streams.push_back(so.stream.narrow(0, stream_at[i], stream_at[i + 1] - stream_at[i]));
  }
  return {norms, nbits, streams};
}

std::vector<at::Tensor> qsgd_decode_elias_many_device(const std::vector<std::vector<at::Tensor>>& norms,
                                                      const std::vector<std::vector<at::Tensor>>& nbits,
                                                      const std::vector<std::vector<at::Tensor>>& streams,
                                                      const std::vector<int64_t>& n, int64_t s, int64_t bucket,
                                                      int64_t group_buckets, const std::vector<at::ScalarType>& dtypes,
                                                      double scale,
                                                      const std::vector<c10::optional<at::Tensor>>& outs) {
  constexpr const char* op = "qsgd_decode_elias_many";
  const int64_t K = hgc::check_qsgd_elias_many_lists(norms, nbits, streams, n, dtypes, outs);
  const std::size_t count = norms.size();
  std::vector<at::Tensor> results;
  if (count == 0) return results;
  const at::Device device = norms[0][0].device();
  // Every payload as qsgd_decode_elias checks it (its header's values are data: checked on the
  // device by the launcher, and here only when the launcher reports a refusal).
  std::vector<int64_t> G;
  std::vector<at::Tensor> held;  // the contiguous buffers the launcher reads
  bool empty_refused = false;    // a payload without groups whose stream is not empty
  for (std::size_t i = 0; i < count; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      G.push_back(hgc::check_qsgd_elias_decode_args(norms[i][k], nbits[i][k], streams[i][k], n[i], s, bucket,
                                                    group_buckets, dtypes[i], hgc_dev::kDeviceType));
      TORCH_CHECK(norms[i][k].device() == device, op, ": payload ", k, " of tensor ", i, " is on ",
                  norms[i][k].device(), ", tensor 0's on ", device, " (a bucket is on one device)");
      empty_refused = empty_refused || (G.back() == 0 && streams[i][k].numel() != 0);
      held.push_back(norms[i][k].contiguous());
      held.push_back(nbits[i][k].contiguous());
      held.push_back(streams[i][k].contiguous());
    }
  }
  const hgc_dev::DeviceGuard guard(device);
  bool ok = !empty_refused;
  if (ok) {
    for (std::size_t i = 0; i < count; ++i) {
      results.push_back(hgc_decode_output(outs[i], n[i], dtypes[i], device, "qsgd_decode"));
    }
    std::vector<hgc_dev::QsgdEliasPayload> payloads(G.size());
    for (std::size_t j = 0; j < G.size(); ++j) {
      payloads[j] = {held[3 * j].data_ptr<float>(), held[3 * j + 1].data_ptr<int64_t>(),
                     held[3 * j + 2].data_ptr<uint8_t>(), held[3 * j + 2].numel()};
    }
    std::vector<hgc_dev::QsgdEliasDecodeItem> items(count);
    for (std::size_t i = 0; i < count; ++i) {
      items[i] = {hgc_dev::dev_dtype(dtypes[i]), n[i], payloads.data() + i * static_cast<std::size_t>(K),
                  results[i].data_ptr()};
    }
    ok = hgc_dev::qsgd_decode_elias_sum_many(hgc_dev::current_ctx(), items.data(), static_cast<int64_t>(count), K, s,
                                             bucket, group_buckets, scale);
  }
  if (!ok) {
    // Refused: the headers on the host (one copy), checked in bucket order with the per-tensor
    // op's messages; when they all pass, a group's code is malformed.
    std::vector<at::Tensor> heads;
    for (std::size_t j = 0; j < G.size(); ++j) heads.push_back(held[3 * j + 1]);
    const at::Tensor head_host = hgc_dev::read_back(at::cat(heads));
    const int64_t* nb = head_host.data_ptr<int64_t>();
    for (std::size_t j = 0; j < G.size(); ++j) {
      hgc::qsgd_elias_group_starts(nb, G[j], held[3 * j + 2].numel());
      nb += G[j];
    }
  }
  TORCH_CHECK(ok, hgc::kQsgdEliasMalformed);
  return results;
}

HGC_DEVICE_OPS(qsgd, HGC_QSGD_OPS, HGC_QSGD_INTO_OPS)
