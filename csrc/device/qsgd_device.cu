// QSGD, device source: Thrust algorithms over the functors of qsgd_functors.h, for CUDA (nvcc)
// and the OpenMP twin (g++). Calls per op: encode fixed 3 (norm lanes, norms, codes), decode
// fixed 1, encode Elias 9 (norm lanes, norms, levels, bucket bits, their scan by group, group
// totals, the scan of group bytes, write, compose shared bytes) plus one read of the stream's
// size, decode Elias 3 (zeros, groups, any-malformed) plus one read of the flag. A bucket of
// tensors (the *_many launchers, multi_tensor.cuh): encode fixed 3 per dtype, decode fixed 1 per
// dtype, encode Elias 3 per dtype + 6 plus one read of the group offsets, decode-sum Elias 3 per
// dtype + 1 plus one read of the flag, whatever its tensor count.
// Every scan goes through scan.cuh (Thrust on CUDA, a parallel two-level scan in the twin).
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>

#include <type_traits>
#include <vector>

#include "exec.cuh"
#include "multi_tensor.cuh"
#include "qsgd_device.h"
#include "qsgd_functors.h"
#include "scan.cuh"

namespace hgc_dev {

using namespace qsgd;

namespace {
// The 8 lane partials of every bucket of a launcher's norms (LaneNorm, FinishNorm): buckets B in
// all; lane(b0), nan_at(b0): those of the buckets from bucket b0 on (nan_at: max norms only).
class NormLanes {
 public:
  NormLanes(const Exec& ex, int64_t B, bool max_norm)
      : max_norm_(max_norm), lane_(ex, 8 * B), nan_at_(ex, max_norm ? 8 * B : 0) {}
  double* lane(int64_t b0) const { return lane_.get() + 8 * b0; }
  int64_t* nan_at(int64_t b0) const { return max_norm_ ? nan_at_.get() + 8 * b0 : nullptr; }

 private:
  bool max_norm_;
  Scratch<double> lane_;
  Scratch<int64_t> nan_at_;
};
}  // namespace

void qsgd_encode_fixed(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t s, int64_t bucket,
                       bool max_norm, uint64_t key, float* norms, uint8_t* packed) {
  if (n <= 0) return;
  Exec ex(ctx);
  const int w = code_width(s);
  const int64_t B = (n + bucket - 1) / bucket, nbytes = (n * w + 7) / 8;
  NormLanes lanes(ex, B, max_norm);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    ex.for_each_index(8 * B, LaneNorm<T>{xt, n, bucket, max_norm, lanes.lane(0), lanes.nan_at(0)});
    ex.for_each_index(B, FinishNorm<T>{xt, bucket, max_norm, lanes.lane(0), lanes.nan_at(0), norms});
    ex.for_each_index((n + 7) / 8, EncodeFixed8<T>{xt, n, bucket, s, key, w, nbytes, norms, packed});
  });
}

void qsgd_decode_fixed(const Ctx& ctx, DType dtype, const float* norms, int64_t nstride, const uint8_t* packed,
                       int64_t pstride, int64_t nbytes, int64_t K, int64_t n, int64_t s, int64_t bucket,
                       double scale, void* out) {
  if (n <= 0 || K <= 0) return;
  Exec ex(ctx);
  const int w = code_width(s);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ex.for_each_index(n, DecodeFixed<T>{norms, nstride, packed, pstride, nbytes, K, bucket, s, w, scale,
                                        static_cast<T*>(out)});
  });
}

void qsgd_encode_elias(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t s, int64_t bucket,
                       bool max_norm, uint64_t key, int64_t group_buckets, float* norms, int64_t* nbits,
                       ByteAlloc alloc_stream, void* state) {
  Exec ex(ctx);
  const int64_t B = (n + bucket - 1) / bucket, gb = group_buckets;
  const int64_t G = (B + gb - 1) / gb;
  Scratch<int32_t> q(ex, n);
  Scratch<int64_t> bits(ex, B), within(ex, B), gbytes(ex, G + 1), gstart(ex, G + 1);
  NormLanes lanes(ex, B, max_norm);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    ex.for_each_index(8 * B, LaneNorm<T>{xt, n, bucket, max_norm, lanes.lane(0), lanes.nan_at(0)});
    ex.for_each_index(B, FinishNorm<T>{xt, bucket, max_norm, lanes.lane(0), lanes.nan_at(0), norms});
    ex.for_each_index(n, Levels<T>{xt, bucket, s, key, norms, q.get()});
  });
  ex.for_each_index(B, BucketBits{q.get(), n, bucket, bits.get()});
  // bucket bit offsets inside their group (integer scan: any order gives the same sums)
  const auto keys = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), GroupOf{gb});
  scan_exclusive_by_key(ex, keys, bits.get(), B, within.get(), int64_t(0), thrust::plus<int64_t>());
  ex.for_each_index(G + 1, GroupTotals{within.get(), bits.get(), B, gb, G, nbits, gbytes.get()});
  scan_exclusive(ex, gbytes.get(), G + 1, gstart.get(), int64_t(0), thrust::plus<int64_t>());
  int64_t total = 0;
  ex.to_host(&total, gstart.get() + G, sizeof(int64_t));
  uint8_t* stream = alloc_stream(total, state);
  Scratch<uint8_t> edge_first(ex, B), edge_last(ex, B);
  ex.for_each_index(B, WriteBucket{q.get(), n, bucket, gb, gstart.get(), within.get(), bits.get(), stream,
                                   edge_first.get(), edge_last.get()});
  ex.for_each_index(B, ComposeEdges{B, gb, gstart.get(), within.get(), bits.get(), edge_first.get(),
                                    edge_last.get(), stream});
}

bool qsgd_decode_elias(const Ctx& ctx, DType dtype, const float* norms, const int64_t* nbits, const int64_t* start,
                       const uint8_t* stream, int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                       void* out) {
  if (n <= 0) return true;
  Exec ex(ctx);
  const int64_t B = (n + bucket - 1) / bucket, gb = group_buckets;
  const int64_t G = (B + gb - 1) / gb;
  Scratch<int> bad(ex, G);
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* o = static_cast<T*>(out);
    ex.for_each_index(n, EliasZeros<T>{norms, bucket, s, o});
    ex.for_each_index(G, DecodeEliasGroup<T>{norms, nbits, start, stream, n, bucket, s, gb, B, o, bad.get()});
  });
  const int any = thrust::reduce(ex.policy_read(), bad.get(), bad.get() + G, 0, AnyBad());
  return any == 0;
}

// ---- a bucket of tensors at once ----------------------------------------------------------------

namespace {

template <typename T> struct FixedEncodeStages {
  Stage<LaneNorm<T>> lanes;
  Stage<FinishNorm<T>> norms;
  Stage<EncodeFixed8<T>> codes;
};

template <typename T> struct FixedDecodeStages {
  Stage<DecodeFixed<T>> decode;
};

template <typename T> struct EliasLevelStages {
  Stage<LaneNorm<T>> lanes;
  Stage<FinishNorm<T>> norms;
  Stage<Levels<T>> levels;
};

template <typename T> struct EliasDecodeStages {
  Stage<EliasZeros<T>> zeros;
  Stage<CheckedEliasGroup<T>> groups;
  Stage<SumDecoded<T>> sum;
};

// BucketBits of one tensor of a bucket, and each of its buckets' key for the bucket-wide scan of
// bit offsets inside a group: first + its group (first: the tensor's first group slot, so that
// no two tensors share a key).
struct BitsAndGroup {
  BucketBits bits;
  int64_t* key;
  int64_t gb, first;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    bits(b);
    key[b] = first + b / gb;
  }
};

// Where one tensor of an Elias bucket encode lies in the launcher's scratch: B buckets and G
// groups; its levels, buckets and G + 1 group slots (the last one 0 bytes) from q, b and g.
struct EliasSpan {
  int64_t B, G, q, b, g;
};

constexpr int64_t kScratchAlign = 16;

}  // namespace

void qsgd_encode_fixed_many(const Ctx& ctx, const QsgdEncodeItem* items, int64_t count, int64_t s, int64_t bucket,
                            bool max_norm) {
  Exec ex(ctx);
  const int w = code_width(s);
  int64_t NB = 0;  // buckets of the whole bucket op
  for (int64_t t = 0; t < count; ++t) NB += items[t].n > 0 ? (items[t].n + bucket - 1) / bucket : 0;
  if (NB == 0) return;
  NormLanes lanes(ex, NB, max_norm);
  PerDtype<FixedEncodeStages> st;
  int64_t b0 = 0;  // the tensor's first bucket
  for (int64_t t = 0; t < count; ++t) {
    const QsgdEncodeItem& it = items[t];
    if (it.n <= 0) continue;
    const int64_t B = (it.n + bucket - 1) / bucket, nbytes = (it.n * w + 7) / 8;
    with_dtype(st, it.dtype, it.x, [&](auto& set, const auto* x) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
      set.lanes.add(LaneNorm<T>{x, it.n, bucket, max_norm, lanes.lane(b0), lanes.nan_at(b0)}, 8 * B);
      set.norms.add(FinishNorm<T>{x, bucket, max_norm, lanes.lane(b0), lanes.nan_at(b0), it.norms}, B);
      set.codes.add(EncodeFixed8<T>{x, it.n, bucket, s, it.key, w, nbytes, it.norms, it.packed}, (it.n + 7) / 8);
    });
    b0 += B;
  }
  TableSet tables(ex);
  st.each([&](auto& set) {
    tables.put(set.lanes);
    tables.put(set.norms);
    tables.put(set.codes);
  });
  tables.upload();
  st.each([&](auto& set) {
    tables.run(set.lanes);
    tables.run(set.norms);
    tables.run(set.codes);
  });
}

void qsgd_decode_fixed_many(const Ctx& ctx, const QsgdFixedDecodeItem* items, int64_t count, int64_t K, int64_t s,
                            int64_t bucket, double scale) {
  if (K <= 0) return;
  Exec ex(ctx);
  const int w = code_width(s);
  PerDtype<FixedDecodeStages> st;
  bool any = false;
  for (int64_t t = 0; t < count; ++t) {
    const QsgdFixedDecodeItem& it = items[t];
    if (it.n <= 0) continue;
    any = true;
    with_dtype(st, it.dtype, it.out, [&](auto& set, const auto* tag) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
      set.decode.add(DecodeFixed<T>{it.norms, it.nstride, it.packed, it.pstride, it.nbytes, K, bucket, s, w, scale,
                                    static_cast<T*>(it.out)},
                     it.n);
    });
  }
  if (!any) return;
  TableSet tables(ex);
  st.each([&](auto& set) { tables.put(set.decode); });
  tables.upload();
  st.each([&](auto& set) { tables.run(set.decode); });
}

void qsgd_encode_elias_many(const Ctx& ctx, const QsgdEncodeItem* items, int64_t count, int64_t s, int64_t bucket,
                            bool max_norm, int64_t group_buckets, ByteAlloc alloc_stream, void* state,
                            int64_t* stream_at) {
  Exec ex(ctx);
  const int64_t gb = group_buckets;
  std::vector<EliasSpan> spans(static_cast<std::size_t>(count > 0 ? count : 0));
  int64_t Q = 0, NB = 0, NG = 0;  // levels, buckets and group slots of the whole bucket
  for (int64_t t = 0; t < count; ++t) {
    const int64_t n = items[t].n > 0 ? items[t].n : 0;
    const int64_t B = (n + bucket - 1) / bucket, G = (B + gb - 1) / gb;
    spans[static_cast<std::size_t>(t)] = {B, G, Q, NB, NG};
    Q += n;
    NB += B;
    NG += G + 1;
  }
  for (int64_t t = 0; t <= count; ++t) stream_at[t] = 0;
  if (NB == 0) {
    alloc_stream(0, state);
    return;
  }
  Scratch<int32_t> q(ex, Q);
  Scratch<int64_t> bits(ex, NB), key(ex, NB), within(ex, NB), gbytes(ex, NG), gstart(ex, NG);
  NormLanes lanes(ex, NB, max_norm);
  // Sizes: norm lanes, norms, levels, bucket bits, group totals (table 1).
  PerDtype<EliasLevelStages> lv;
  Stage<BitsAndGroup> bucket_bits;
  Stage<GroupTotals> totals;
  for (int64_t t = 0; t < count; ++t) {
    const QsgdEncodeItem& it = items[t];
    const EliasSpan& sp = spans[static_cast<std::size_t>(t)];
    // (an empty tensor's one slot: 0 bytes)
    totals.add(GroupTotals{within.get() + sp.b, bits.get() + sp.b, sp.B, gb, sp.G, it.nbits, gbytes.get() + sp.g},
               sp.G + 1);
    if (sp.B == 0) continue;
    int32_t* qt = q.get() + sp.q;
    with_dtype(lv, it.dtype, it.x, [&](auto& set, const auto* x) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
      set.lanes.add(LaneNorm<T>{x, it.n, bucket, max_norm, lanes.lane(sp.b), lanes.nan_at(sp.b)}, 8 * sp.B);
      set.norms.add(FinishNorm<T>{x, bucket, max_norm, lanes.lane(sp.b), lanes.nan_at(sp.b), it.norms}, sp.B);
      set.levels.add(Levels<T>{x, bucket, s, it.key, it.norms, qt}, it.n);
    });
    bucket_bits.add(BitsAndGroup{BucketBits{qt, it.n, bucket, bits.get() + sp.b}, key.get() + sp.b, gb, sp.g}, sp.B);
  }
  TableSet sizes(ex);
  lv.each([&](auto& set) {
    sizes.put(set.lanes);
    sizes.put(set.norms);
    sizes.put(set.levels);
  });
  sizes.put(bucket_bits);
  sizes.put(totals);
  sizes.upload();
  lv.each([&](auto& set) {
    sizes.run(set.lanes);
    sizes.run(set.norms);
    sizes.run(set.levels);
  });
  sizes.run(bucket_bits);
  // bucket bit offsets inside their group (integer scan: any order gives the same sums)
  scan_exclusive_by_key(ex, key.get(), bits.get(), NB, within.get(), int64_t(0), thrust::plus<int64_t>());
  sizes.run(totals);
  scan_exclusive(ex, gbytes.get(), NG, gstart.get(), int64_t(0), thrust::plus<int64_t>());
  // every group's stream offset: the one read of the bucket (its last slot: the total)
  std::vector<int64_t> at(static_cast<std::size_t>(NG));
  ex.to_host(at.data(), gstart.get(), sizeof(int64_t) * static_cast<std::size_t>(NG));
  for (int64_t t = 0; t < count; ++t) stream_at[t] = at[static_cast<std::size_t>(spans[static_cast<std::size_t>(t)].g)];
  stream_at[count] = at[static_cast<std::size_t>(NG - 1)];
  uint8_t* stream = alloc_stream(stream_at[count], state);
  // The streams: write, compose shared bytes (table 2).
  Scratch<uint8_t> edge_first(ex, NB), edge_last(ex, NB);
  Stage<WriteBucket> write;
  Stage<ComposeEdges> compose;
  for (int64_t t = 0; t < count; ++t) {
    const QsgdEncodeItem& it = items[t];
    const EliasSpan& sp = spans[static_cast<std::size_t>(t)];
    if (sp.B == 0) continue;
    const int64_t* gs = gstart.get() + sp.g;
    const int64_t* wi = within.get() + sp.b;
    const int64_t* bt = bits.get() + sp.b;
    uint8_t* ef = edge_first.get() + sp.b;
    uint8_t* el = edge_last.get() + sp.b;
    write.add(WriteBucket{q.get() + sp.q, it.n, bucket, gb, gs, wi, bt, stream, ef, el}, sp.B);
    compose.add(ComposeEdges{sp.B, gb, gs, wi, bt, ef, el, stream}, sp.B);
  }
  TableSet streams(ex);
  streams.put(write);
  streams.put(compose);
  streams.upload();
  streams.run(write);
  streams.run(compose);
}

bool qsgd_decode_elias_sum_many(const Ctx& ctx, const QsgdEliasDecodeItem* items, int64_t count, int64_t K,
                                int64_t s, int64_t bucket, int64_t group_buckets, double scale) {
  if (K <= 0) return true;
  Exec ex(ctx);
  const int64_t gb = group_buckets;
  // Scratch: each item's K decoded payloads (K n values of its type), each group's malformed flag,
  // each payload's header slots (its G groups + 1).
  std::vector<int64_t> dec_at(static_cast<std::size_t>(count > 0 ? count : 0), 0);
  int64_t dec_bytes = 0, flags = 0;
  for (int64_t t = 0; t < count; ++t) {
    const QsgdEliasDecodeItem& it = items[t];
    if (it.n <= 0) continue;
    const int64_t B = (it.n + bucket - 1) / bucket;
    dispatch_dtype(it.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      dec_at[static_cast<std::size_t>(t)] = dec_bytes;
      dec_bytes += (K * it.n * static_cast<int64_t>(sizeof(T)) + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    });
    flags += K * ((B + gb - 1) / gb);
  }
  if (flags == 0) return true;
  const int64_t slots = flags + K * count;  // at most: one slot more than its groups per payload
  Scratch<unsigned char> dec(ex, dec_bytes);
  Scratch<int> bad(ex, flags);
  Scratch<int64_t> head_bytes(ex, slots), head_key(ex, slots), head_start(ex, slots);
  Stage<EliasHeadBytes> heads;
  PerDtype<EliasDecodeStages> st;
  int* bad_at = bad.get();
  int64_t slot = 0, payload = 0;
  for (int64_t t = 0; t < count; ++t) {
    const QsgdEliasDecodeItem& it = items[t];
    if (it.n <= 0) continue;
    const int64_t B = (it.n + bucket - 1) / bucket, G = (B + gb - 1) / gb;
    unsigned char* mine = dec.get() + dec_at[static_cast<std::size_t>(t)];
    with_dtype(st, it.dtype, it.out, [&](auto& set, const auto* tag) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
      T* d = reinterpret_cast<T*>(mine);
      for (int64_t k = 0; k < K; ++k) {
        const QsgdEliasPayload& p = it.payloads[k];
        heads.add(EliasHeadBytes{p.nbits, G, p.stream_bytes, payload++, head_bytes.get() + slot,
                                 head_key.get() + slot},
                  G + 1);
        const DecodeEliasGroup<T> group{p.norms, p.nbits, head_start.get() + slot, p.stream, it.n, bucket, s, gb, B,
                                        d + k * it.n, bad_at};
        set.zeros.add(EliasZeros<T>{p.norms, bucket, s, d + k * it.n}, it.n);
        set.groups.add(CheckedEliasGroup<T>{group, G, p.stream_bytes}, G);
        bad_at += G;
        slot += G + 1;
      }
      set.sum.add(SumDecoded<T>{d, it.n, K, scale, static_cast<T*>(it.out)}, it.n);
    });
  }
  TableSet tables(ex);
  tables.put(heads);
  st.each([&](auto& set) {
    tables.put(set.zeros);
    tables.put(set.groups);
    tables.put(set.sum);
  });
  tables.upload();
  // every payload's group starts (an integer scan by payload: any order gives the same sums)
  tables.run(heads);
  scan_exclusive_by_key(ex, head_key.get(), head_bytes.get(), slot, head_start.get(), int64_t(0),
                        thrust::plus<int64_t>());
  st.each([&](auto& set) {
    tables.run(set.zeros);
    tables.run(set.groups);
    tables.run(set.sum);
  });
  const int any = thrust::reduce(ex.policy_read(), bad.get(), bad.get() + flags, 0, AnyBad());
  return any == 0;
}

}  // namespace hgc_dev
