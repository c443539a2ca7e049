// QSGD's functors, shared by the device source (qsgd_device.cu: CUDA and the OpenMP twin).
// Plain C++ over raw pointers: no Thrust, no PyTorch. The quantizer, random stream, norms (their
// summation order included) and both wire formats are csrc/cpu/qsgd_cpu.cpp's, computed in
// Elem<T>::acc (float; double for fp64): the same bytes and values.
//
// Each functor owns the output words of its index (a bucket's norm, bit count and the bytes only
// it covers; a group of 8 codes = w whole bytes; an element; an Elias group): no two indices
// write one word. Bytes of the Elias stream that two buckets share are composed by one functor
// (ComposeEdges) from the parts each bucket leaves in its own edge slots.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../elias_bit_reader.h"
#include "../host_device.h"
#include "../splitmix64.h"
#include "half_bits.h"

namespace hgc_dev {
namespace qsgd {

HGC_HOST_DEVICE inline float abs_bits(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }
HGC_HOST_DEVICE inline double abs_bits(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  u &= 0x7FFFFFFFFFFFFFFFull;
  memcpy(&x, &u, 8);
  return x;
}

HGC_HOST_DEVICE inline int code_width(int64_t s) {  // 1 + bit_length(s)
  int w = 1;
  while (s) {
    ++w;
    s >>= 1;
  }
  return w;
}

// u of element i: value 2j takes bits 8..31 of mix64(key + (j + 1) golden), value 2j+1 bits
// 40..63, as float((w >> 8)) * 2^-24.
HGC_HOST_DEVICE inline float uniform_of(uint64_t key, int64_t i) {
  const uint64_t h = hgc::mix64(key + static_cast<uint64_t>((i >> 1) + 1) * hgc::kGolden);
  const uint32_t w = (i & 1) ? static_cast<uint32_t>(h >> 32) : static_cast<uint32_t>(h);
  return static_cast<float>(static_cast<int32_t>(w >> 8)) * 0x1p-24f;
}

// A bucket's norm (values [b d, min(n, (b + 1) d))), rounded to float32, as csrc/cpu/qsgd_cpu.cpp's
// bucket_norm: l2 = squares in double, lane k % 8 summed in order, lanes combined
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), sqrt; max = max |v| (a bucket with a NaN: its first NaN's
// |.|). A segmented reduction over all values in two stages with that very order: LaneNorm, the
// 8 lanes of every bucket in parallel (each lane's sum is a serial chain in the CPU's order, so
// it cannot be split further without changing the bytes); then FinishNorm, one bucket each, the
// fixed combine. 8 lanes x buckets threads instead of one thread per bucket, and a lane reads
// every 8th value, so a bucket's 8 lanes read 8 consecutive values together.

// Lane j = q % 8 of bucket b = q / 8: l2: the sum in order of the squares of the bucket's values
// j, j + 8, ... (its CPU lane l[j]); max: the largest |v| of those values (as double: exact) and
// the position in the bucket of the first NaN among them (d when none).
template <typename T> struct LaneNorm {
  using A = typename Elem<T>::acc;
  const T* x;
  int64_t n, d;
  bool max_norm;
  double* lane;     // 8 per bucket
  int64_t* nan_at;  // 8 per bucket (max only)
  HGC_HOST_DEVICE void operator()(int64_t q) const {
    const int64_t b = q >> 3, j = q & 7;
    const int64_t i0 = b * d, len = d < n - i0 ? d : n - i0;
    const T* v = x + i0;
    if (max_norm) {
      A m = 0;
      int64_t at = d;
      for (int64_t k = j; k < len; k += 8) {
        const A a = abs_bits(Elem<T>::load(v[k]));
        if (a != a) {
          at = k;
          break;
        }
        m = a > m ? a : m;
      }
      lane[q] = static_cast<double>(m);
      nan_at[q] = at;
      return;
    }
    double l = 0;
    for (int64_t k = j; k < len; k += 8) {
      const double a = static_cast<double>(Elem<T>::load(v[k]));
      l = l + a * a;
    }
    lane[q] = l;
  }
};

// Bucket b's norm from its 8 lanes (LaneNorm): l2: the fixed combine and sqrt; max: the first
// NaN's |.| read again from x when a lane saw one (its bits as they are), else the largest lane.
template <typename T> struct FinishNorm {
  using A = typename Elem<T>::acc;
  const T* x;
  int64_t d;
  bool max_norm;
  const double* lane;
  const int64_t* nan_at;
  float* norms;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    const double* l = lane + 8 * b;
    if (max_norm) {
      const int64_t* at = nan_at + 8 * b;
      int64_t first = d;
      for (int j = 0; j < 8; ++j) first = at[j] < first ? at[j] : first;
      A m = 0;
      if (first < d) {
        m = abs_bits(Elem<T>::load(x[b * d + first]));
      } else {
        for (int j = 0; j < 8; ++j) {
          const A a = static_cast<A>(l[j]);
          m = a > m ? a : m;
        }
      }
      norms[b] = static_cast<float>(m);
      return;
    }
    const double total = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    norms[b] = static_cast<float>(sqrt(total));
  }
};

// The signed level in [-s, s] of element i with its bucket's norm (csrc/cpu/qsgd_cpu.cpp's
// quantize()).
template <typename T>
HGC_HOST_DEVICE inline int32_t level_of(const T* x, int64_t i, float nrm, int64_t s, uint64_t key) {
  using A = typename Elem<T>::acc;
  const A S = static_cast<A>(s);
  const A inv = S / static_cast<A>(nrm);
  const A top = static_cast<A>(s - 1);
  const A v = Elem<T>::load(x[i]);
  A r = abs_bits(v) * inv;
  r = r >= A(0) ? r : A(0);  // NaN (0 * inf, NaN input) -> 0
  r = r <= S ? r : S;
  A fl = static_cast<A>(static_cast<int32_t>(r));
  fl = fl <= top ? fl : top;
  const A p = r - fl;
  const int32_t lvl = static_cast<int32_t>(fl) + (static_cast<A>(uniform_of(key, i)) < p ? 1 : 0);
  return v < A(0) ? -lvl : lvl;
}

HGC_HOST_DEVICE inline uint32_t code_of_level(int32_t q) {
  return (q < 0 ? 1u : 0u) | (static_cast<uint32_t>(q < 0 ? -q : q) << 1);
}

// ---- fixed-width coding -----------------------------------------------------------------------

// Codes of elements 8g..8g+7 (w bits each, LSB first): exactly the w bytes w g .. w g + w - 1
// (those below nbytes; codes past n are 0).
template <typename T> struct EncodeFixed8 {
  const T* x;
  int64_t n, d, s;
  uint64_t key;
  int w;
  int64_t nbytes;
  const float* norms;
  uint8_t* packed;
  HGC_HOST_DEVICE void operator()(int64_t g) const {
    uint64_t acc = 0;
    int nacc = 0;
    int64_t byte = g * w;
    for (int t = 0; t < 8; ++t) {
      const int64_t i = 8 * g + t;
      const uint32_t c = i < n ? code_of_level(level_of(x, i, norms[i / d], s, key)) : 0u;
      acc |= static_cast<uint64_t>(c) << nacc;
      nacc += w;
      while (nacc >= 8) {
        if (byte < nbytes) packed[byte] = static_cast<uint8_t>(acc);
        ++byte;
        acc >>= 8;
        nacc -= 8;
      }
    }
  }
};

// The w-bit code of element i of one payload (bits past nbytes read as 0).
HGC_HOST_DEVICE inline uint32_t read_code(const uint8_t* pk, int64_t nbytes, int w, int64_t i) {
  const int64_t bit = i * w, byte = bit >> 3;
  uint64_t word = 0;
  for (int t = 0; t < 5 && byte + t < nbytes; ++t) word |= static_cast<uint64_t>(pk[byte + t]) << (8 * t);
  return static_cast<uint32_t>((word >> (bit & 7)) & ((uint64_t(1) << w) - 1));
}

// out[i] = (scale *) sum_k value_k(i), value(c) = float(c >> 1) * (norm_k / s), negated where c & 1;
// the first payload assigns, the later ones add in order; K == 1 with scale 1 is not scaled.
template <typename T> struct DecodeFixed {
  using A = typename Elem<T>::acc;
  const float* norms;
  int64_t nstride;
  const uint8_t* packed;
  int64_t pstride, nbytes, K, d, s;
  int w;
  double scale;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t b = i / d;
    A a = 0;
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t c = read_code(packed + k * pstride, nbytes, w, i);
      const A bscale = static_cast<A>(norms[k * nstride + b]) / static_cast<A>(s);
      A v = static_cast<A>(c >> 1) * bscale;
      v = (c & 1u) ? -v : v;
      a = k == 0 ? v : a + v;
    }
    const bool plain = K == 1 && scale == 1.0;
    out[i] = Elem<T>::store(plain ? a : a * static_cast<A>(scale));
  }
};

// ---- Elias coding -------------------------------------------------------------------------------
//
// Bucket b's code: gamma(nnz + 1), then per nonzero level (in index order) gamma(gap) (gap = its
// index minus the previous nonzero's, the first from -1), a sign bit, gamma(|level|); gamma(x) =
// N zero bits, a one, the N low bits of x (N = floor(log2 x)), LSB first. A group of gb buckets
// is their codes back to back, padded to a byte; the stream is the groups in order.

HGC_HOST_DEVICE inline int floor_log2(uint64_t x) {
  int r = -1;
  while (x) {
    ++r;
    x >>= 1;
  }
  return r;
}

HGC_HOST_DEVICE inline int64_t gamma_bits(uint64_t x) { return 2 * floor_log2(x) + 1; }

template <typename T> struct Levels {
  const T* x;
  int64_t d, s;
  uint64_t key;
  const float* norms;
  int32_t* q;
  HGC_HOST_DEVICE void operator()(int64_t i) const { q[i] = level_of(x, i, norms[i / d], s, key); }
};

// bits[b] = the length of bucket b's code.
struct BucketBits {
  const int32_t* q;
  int64_t n, d;
  int64_t* bits;
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    const int64_t i0 = b * d, len = d < n - i0 ? d : n - i0;
    int64_t nnz = 0, body = 0, prev = -1;
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = q[i0 + j];
      if (v == 0) continue;
      ++nnz;
      body += gamma_bits(static_cast<uint64_t>(j - prev)) + 1 + gamma_bits(static_cast<uint64_t>(v < 0 ? -v : v));
      prev = j;
    }
    bits[b] = gamma_bits(static_cast<uint64_t>(nnz) + 1) + body;
  }
};

// The key of bucket b for the scan of bit offsets inside a group: its group.
struct GroupOf {
  int64_t gb;
  HGC_HOST_DEVICE int64_t operator()(int64_t b) const { return b / gb; }
};

// Group g < G: nbits[g] (its last bucket's offset plus length) and gbytes[g]; gbytes[G] = 0 (so
// that an exclusive scan of G + 1 values ends with the stream's length).
struct GroupTotals {
  const int64_t* within;
  const int64_t* bits;
  int64_t B, gb, G;
  int64_t* nbits;
  int64_t* gbytes;
  HGC_HOST_DEVICE void operator()(int64_t g) const {
    if (g == G) {
      gbytes[g] = 0;
      return;
    }
    const int64_t last = ((g + 1) * gb < B ? (g + 1) * gb : B) - 1;
    const int64_t nb = within[last] + bits[last];
    nbits[g] = nb;
    gbytes[g] = (nb + 7) / 8;
  }
};

// Where bucket b's code lies in the stream: bits [o, o + len), bytes first..last; a byte is
// "partial" for b when b covers only some of its bits.
struct BucketSpan {
  int64_t o, len, first, last;
  bool first_partial, last_partial;
  HGC_HOST_DEVICE BucketSpan(int64_t start_bit, int64_t bits)
      : o(start_bit), len(bits), first(start_bit >> 3), last((start_bit + bits - 1) >> 3) {
    const bool end_partial = ((o + len) & 7) != 0;
    first_partial = (o & 7) != 0 || (first == last && end_partial);
    last_partial = last != first && end_partial;
  }
};

// Writes bucket b's code: the bytes only b covers into the stream, its partial first and last
// bytes (b's bits only) into edge_first[b] / edge_last[b] for ComposeEdges.
struct WriteBucket {
  const int32_t* q;
  int64_t n, d, gb;
  const int64_t* gstart;  // group byte offsets
  const int64_t* within;  // bucket bit offsets inside the group
  const int64_t* bits;
  uint8_t* stream;
  uint8_t* edge_first;
  uint8_t* edge_last;

  struct Writer {
    const WriteBucket* self;
    int64_t b;
    BucketSpan span;
    uint64_t acc;
    int nacc;
    int64_t byte;
    HGC_HOST_DEVICE void emit(uint8_t v) {
      if (byte == span.first && span.first_partial) {
        self->edge_first[b] = v;
      } else if (byte == span.last && span.last_partial) {
        self->edge_last[b] = v;
      } else {
        self->stream[byte] = v;
      }
      ++byte;
    }
    HGC_HOST_DEVICE void put(uint64_t v, int len) {  // len <= 32
      acc |= v << nacc;
      nacc += len;
      while (nacc >= 8) {
        emit(static_cast<uint8_t>(acc));
        acc >>= 8;
        nacc -= 8;
      }
    }
    HGC_HOST_DEVICE void put_gamma(uint64_t x) {
      const int N = floor_log2(x);
      put(uint64_t(1) << N, N + 1);
      if (N) put(x ^ (uint64_t(1) << N), N);
    }
    HGC_HOST_DEVICE void flush() {
      if (nacc > 0) emit(static_cast<uint8_t>(acc));
    }
  };

  HGC_HOST_DEVICE void operator()(int64_t b) const {
    const int64_t o = 8 * gstart[b / gb] + within[b];
    Writer wr{this, b, BucketSpan(o, bits[b]), 0, static_cast<int>(o & 7), o >> 3};
    const int64_t i0 = b * d, len = d < n - i0 ? d : n - i0;
    int64_t nnz = 0;
    for (int64_t j = 0; j < len; ++j) nnz += q[i0 + j] != 0;
    wr.put_gamma(static_cast<uint64_t>(nnz) + 1);
    int64_t prev = -1;
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = q[i0 + j];
      if (v == 0) continue;
      wr.put_gamma(static_cast<uint64_t>(j - prev));
      wr.put(v < 0 ? 1u : 0u, 1);
      wr.put_gamma(static_cast<uint64_t>(v < 0 ? -v : v));
      prev = j;
    }
    wr.flush();
  }
};

// The stream bytes that buckets share: each is written by the lowest bucket covering it (the one
// that covers its bit 0), as its own part OR the first-byte parts of the later buckets of the
// group that start inside it (at most 7: every code has a bit or more).
struct ComposeEdges {
  int64_t B, gb;
  const int64_t* gstart;
  const int64_t* within;
  const int64_t* bits;
  const uint8_t* edge_first;
  const uint8_t* edge_last;
  uint8_t* stream;
  HGC_HOST_DEVICE void compose(int64_t b, int64_t byte, uint32_t v) const {
    const int64_t g = b / gb, be = (g + 1) * gb < B ? (g + 1) * gb : B;
    for (int64_t c = b + 1; c < be && 8 * gstart[g] + within[c] < 8 * (byte + 1); ++c) v |= edge_first[c];
    stream[byte] = static_cast<uint8_t>(v);
  }
  HGC_HOST_DEVICE void operator()(int64_t b) const {
    const BucketSpan span(8 * gstart[b / gb] + within[b], bits[b]);
    if (span.first_partial && (span.o & 7) == 0) compose(b, span.first, edge_first[b]);
    if (span.last_partial) compose(b, span.last, edge_last[b]);
  }
};

// out[i] = its bucket's zero, T(0 * norm / s) (the value of the levels the stream leaves out).
template <typename T> struct EliasZeros {
  using A = typename Elem<T>::acc;
  const float* norms;
  int64_t d, s;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    const A bscale = static_cast<A>(norms[i / d]) / static_cast<A>(s);
    out[i] = Elem<T>::store(A(0) * bscale);
  }
};

// Decodes group g's nonzero levels into out (after EliasZeros); bad[g] = 1 when its code is
// malformed (runs past the group's bit count, out of its bucket or above s), else 0.
template <typename T> struct DecodeEliasGroup {
  using A = typename Elem<T>::acc;
  const float* norms;
  const int64_t* nbits;
  const int64_t* start;  // G + 1 byte offsets
  const uint8_t* stream;
  int64_t n, d, s, gb, B;
  T* out;
  int* bad;
  HGC_HOST_DEVICE bool group(int64_t g) const {
    hgc::EliasBitReader br{stream + start[g], start[g + 1] - start[g]};
    const int64_t limit = nbits[g];
    const int64_t be = (g + 1) * gb < B ? (g + 1) * gb : B;
    for (int64_t b = g * gb; b < be; ++b) {
      const int64_t i0 = b * d, len = d < n - i0 ? d : n - i0;
      const A bscale = static_cast<A>(norms[b]) / static_cast<A>(s);
      const uint64_t h = br.gamma();
      if (h == 0 || h - 1 > static_cast<uint64_t>(len) || br.pos > limit) return false;
      int64_t pos = -1;
      for (uint64_t t = 0; t + 1 < h; ++t) {
        const uint64_t gap = br.gamma();
        if (gap == 0 || br.pos >= limit) return false;
        pos += static_cast<int64_t>(gap);
        const uint32_t neg = br.bit();
        const uint64_t lvl = br.gamma();
        if (pos >= len || lvl == 0 || lvl > static_cast<uint64_t>(s) || br.pos > limit) return false;
        const A v = static_cast<A>(lvl) * bscale;
        out[i0 + pos] = Elem<T>::store(neg ? -v : v);
      }
    }
    return br.pos == limit;
  }
  HGC_HOST_DEVICE void operator()(int64_t g) const { bad[g] = group(g) ? 0 : 1; }
};

// One payload's header as byte counts, for the scan of its group starts by payload (slot g < G:
// group g's bytes; slot G: 0, so that its start is the header's total). A count out of
// [0, 8 stream_bytes] (qsgd_elias_group_starts refuses it) counts stream_bytes + 1 bytes: the
// total then differs from stream_bytes, which is what CheckedEliasGroup tests.
struct EliasHeadBytes {
  const int64_t* nbits;
  int64_t G, stream_bytes, payload;
  int64_t* bytes;
  int64_t* key;
  HGC_HOST_DEVICE void operator()(int64_t g) const {
    key[g] = payload;
    if (g == G) {
      bytes[g] = 0;
      return;
    }
    const int64_t nb = nbits[g];
    bytes[g] = nb >= 0 && nb <= 8 * stream_bytes ? (nb + 7) / 8 : stream_bytes + 1;
  }
};

// DecodeEliasGroup of a payload whose group starts were scanned on the device (start: its G + 1
// byte offsets): its groups are read only when the header adds up to the stream's bytes (then
// every count is in range and every group inside the stream); else each group is flagged bad.
template <typename T> struct CheckedEliasGroup {
  DecodeEliasGroup<T> dec;
  int64_t G, stream_bytes;
  HGC_HOST_DEVICE void operator()(int64_t g) const {
    if (dec.start[G] != stream_bytes) {
      dec.bad[g] = 1;
      return;
    }
    dec(g);
  }
};

struct AnyBad {
  HGC_HOST_DEVICE int operator()(int a, int b) const { return a > b ? a : b; }
};

// out[i] = T(((0 + A(dec_0[i])) + A(dec_1[i]) + ...) * A(scale)) over K decoded payloads (dec_k at
// dec + k n, in T; A = Elem<T>::acc): Codec.decode_mean_list's arithmetic, in its order (a zero
// accumulator of A, add_ of each decoded payload, mul_ by the scale, cast back to T).
template <typename T> struct SumDecoded {
  using A = typename Elem<T>::acc;
  const T* dec;
  int64_t n, K;
  double scale;
  T* out;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    A a = 0;
    for (int64_t k = 0; k < K; ++k) a = a + Elem<T>::load(dec[k * n + i]);
    out[i] = Elem<T>::store(a * static_cast<A>(scale));
  }
};

}  // namespace qsgd
}  // namespace hgc_dev
