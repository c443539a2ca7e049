// QSGD, device source: Thrust algorithms over the functors of qsgd_functors.h, for CUDA (nvcc)
// and the OpenMP twin (g++). Calls per op: encode fixed 2 (norms, codes), decode fixed 1,
// encode Elias 8 (norms, levels, bucket bits, their scan by group, group totals, the scan of
// group bytes, write, compose shared bytes) plus one read of the stream's size, decode Elias 3
// (zeros, groups, any-malformed) plus one read of the flag.
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>

#include <type_traits>

#include "exec.cuh"
#include "qsgd_device.h"
#include "qsgd_functors.h"

namespace hgc_dev {

using namespace qsgd;

void qsgd_encode_fixed(const Ctx& ctx, DType dtype, const void* x, int64_t n, int64_t s, int64_t bucket,
                       bool max_norm, uint64_t key, float* norms, uint8_t* packed) {
  if (n <= 0) return;
  Exec ex(ctx);
  const int w = code_width(s);
  const int64_t B = (n + bucket - 1) / bucket, nbytes = (n * w + 7) / 8;
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    ex.for_each_index(B, BucketNorm<T>{xt, n, bucket, max_norm, norms});
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
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    ex.for_each_index(B, BucketNorm<T>{xt, n, bucket, max_norm, norms});
    ex.for_each_index(n, Levels<T>{xt, bucket, s, key, norms, q.get()});
  });
  ex.for_each_index(B, BucketBits{q.get(), n, bucket, bits.get()});
  // bucket bit offsets inside their group (integer scan: any order gives the same sums)
  const auto keys = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), GroupOf{gb});
  thrust::exclusive_scan_by_key(ex.policy(), keys, keys + B, bits.get(), within.get());
  ex.for_each_index(G + 1, GroupTotals{within.get(), bits.get(), B, gb, G, nbits, gbytes.get()});
  thrust::exclusive_scan(ex.policy(), gbytes.get(), gbytes.get() + G + 1, gstart.get());
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
  const int any = thrust::reduce(ex.policy(), bad.get(), bad.get() + G, 0, AnyBad());
  return any == 0;
}

}  // namespace hgc_dev
