// QSGD codec, CPU.
//
// Encode (fixed width): buckets of d values; each bucket's norm (l2 in a fixed 8-lane
// float64 summation order, or max|v|) is computed and the bucket quantized while it is
// still in L1. Work is split into chunks of whole buckets that also start on byte
// boundaries of the packed stream (multiples of lcm(d, 8) values), or, for buckets larger
// than kFuseMax values, norms come first and chunks of 8k values follow.
// Encode (Elias): buckets are grouped (group_buckets per group, each group byte-aligned in
// the stream); every group is coded into its own worst-case region in parallel, the bit
// lengths give the offsets, the regions are then copied together.
// Decode: fixed width in parallel chunks (per-bucket lookup table for w <= 8), Elias in
// parallel over groups.
// The random stream (counter-based splitmix64) and the float operations are exactly those
// of the pure-torch reference, so both produce identical integers and values.
#include "qsgd_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "../checks.h"

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the bit streams are written as little-endian words");

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr int64_t kBlock = 2048;          // values quantized / decoded at once
constexpr int64_t kFuseMax = 1 << 16;     // largest bucket whose norm is fused with its quantization
constexpr int64_t kGrainValues = 1 << 15; // values per task below which threads do not pay off
constexpr int64_t kMaxLevels = (1 << 24) - 1;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t pair_hash(uint64_t key, int64_t i) {
  return mix64(key + static_cast<uint64_t>((i >> 1) + 1) * kGolden);
}

// u[k] for global indices i0 + k: value 2j takes bits 8..31 of hash(pair j), value 2j+1
// bits 40..63, as a multiple of 2^-24 in [0, 1).
inline void uniforms(uint64_t key, int64_t i0, int64_t len, float* u) {
  int64_t k = 0;
  if (len > 0 && (i0 & 1)) {
    u[0] = static_cast<float>(pair_hash(key, i0) >> 40) * 0x1p-24f;
    k = 1;
  }
  for (; k + 1 < len; k += 2) {
    const uint64_t h = pair_hash(key, i0 + k);
    u[k] = static_cast<float>((h >> 8) & 0xFFFFFF) * 0x1p-24f;
    u[k + 1] = static_cast<float>(h >> 40) * 0x1p-24f;
  }
  if (k < len) u[k] = static_cast<float>((pair_hash(key, i0 + k) >> 8) & 0xFFFFFF) * 0x1p-24f;
}

// Bucket norm, rounded to float32. l2: squares in float64, lane k%8 summed in order,
// lanes combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). max: max |v| (NaN sticks).
template <typename T>
float bucket_norm(const T* x, int64_t len, bool max_norm) {
  using acc_t = typename Acc<T>::type;
  if (max_norm) {
    acc_t m = 0;
    for (int64_t k = 0; k < len; ++k) {
      const acc_t a = std::abs(static_cast<acc_t>(x[k]));
      m = (a > m || a != a) ? a : m;
      if (m != m) break;
    }
    return static_cast<float>(m);
  }
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    for (int j = 0; j < 8; ++j) {
      const double a = static_cast<double>(static_cast<acc_t>(x[k + j]));
      l[j] += a * a;
    }
  }
  for (int j = 0; k + j < len; ++j) {
    const double a = static_cast<double>(static_cast<acc_t>(x[k + j]));
    l[j] += a * a;
  }
  const double total = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  return static_cast<float>(std::sqrt(total));
}

// Signed levels q[k] in [-s, s] of x[0..len) (global index i0 of x[0]) with bucket norm nrm.
template <typename T>
void quantize(const T* x, int64_t len, int64_t i0, float nrm, int64_t s, uint64_t key, float* u, int32_t* q) {
  using acc_t = typename Acc<T>::type;
  uniforms(key, i0, len, u);
  const acc_t S = static_cast<acc_t>(s);
  const acc_t inv = S / static_cast<acc_t>(nrm);
  const acc_t top = static_cast<acc_t>(s - 1);
  for (int64_t k = 0; k < len; ++k) {
    const acc_t v = static_cast<acc_t>(x[k]);
    acc_t r = std::abs(v) * inv;
    r = r >= acc_t(0) ? r : acc_t(0);  // NaN (0 * inf, NaN input) -> 0
    r = r <= S ? r : S;
    acc_t fl = static_cast<acc_t>(static_cast<int32_t>(r));
    fl = fl <= top ? fl : top;
    const acc_t p = r - fl;
    const int32_t lvl = static_cast<int32_t>(fl) + (static_cast<acc_t>(u[k]) < p ? 1 : 0);
    q[k] = v < acc_t(0) ? -lvl : lvl;
  }
}

// LSB-first bit writer; put() takes up to 32 bits.
struct BitWriter {
  uint8_t* base;
  uint8_t* p;
  uint64_t acc = 0;
  int n = 0;
  explicit BitWriter(uint8_t* dst) : base(dst), p(dst) {}
  inline void put(uint64_t v, int len) {
    acc |= v << n;
    n += len;
    if (n >= 32) {
      const uint32_t lo = static_cast<uint32_t>(acc);
      std::memcpy(p, &lo, 4);
      p += 4;
      acc >>= 32;
      n -= 32;
    }
  }
  inline void put_gamma(uint64_t x) {  // x >= 1, x < 2^32
    const int N = 63 - __builtin_clzll(x);
    put(uint64_t(1) << N, N + 1);
    if (N) put(x ^ (uint64_t(1) << N), N);
  }
  int64_t bits() const { return static_cast<int64_t>(p - base) * 8 + n; }
  void flush() {
    while (n > 0) {
      *p++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      n -= 8;
    }
    n = 0;
  }
};

// LSB-first bit reader over [data, data + size); reads past the end see zero bits.
struct BitReader {
  const uint8_t* data;
  int64_t size;
  int64_t pos = 0;
  inline uint64_t peek() const {
    const int64_t byte = pos >> 3;
    uint64_t w = 0;
    if (byte + 8 <= size) {
      std::memcpy(&w, data + byte, 8);
    } else {
      for (int64_t b = byte; b < size; ++b) w |= static_cast<uint64_t>(data[b]) << (8 * (b - byte));
    }
    return w >> (pos & 7);  // >= 57 valid bits
  }
  // Elias gamma; returns 0 on a malformed code.
  inline uint64_t gamma() {
    const uint64_t w = peek();
    if (w == 0) return 0;
    const int N = __builtin_ctzll(w);
    if (N > 31) return 0;
    if (2 * N + 1 <= 57) {
      pos += 2 * N + 1;
      return (uint64_t(1) << N) | ((w >> (N + 1)) & ((uint64_t(1) << N) - 1));
    }
    pos += N + 1;
    const uint64_t m = peek() & ((uint64_t(1) << N) - 1);
    pos += N;
    return (uint64_t(1) << N) | m;
  }
  inline uint32_t bit() {
    const uint32_t b = (data[pos >> 3] >> (pos & 7)) & 1;  // caller keeps pos < 8 * size
    ++pos;
    return b;
  }
};

int code_width(int64_t s) { return 1 + (64 - __builtin_clzll(static_cast<uint64_t>(s))); }

void check_common(int64_t s, int64_t bucket, int64_t n) {
  TORCH_CHECK(s >= 1 && s <= kMaxLevels, "qsgd: levels must be in [1, 2^24 - 1], got ", s);
  TORCH_CHECK(bucket >= 1 && bucket < (int64_t(1) << 31), "qsgd: bucket must be in [1, 2^31), got ", bucket);
  TORCH_CHECK(n >= 0, "qsgd: negative size");
}

int64_t num_buckets(int64_t n, int64_t d) { return (n + d - 1) / d; }

template <typename T>
void encode_fixed_impl(const T* x, int64_t n, int64_t d, int64_t s, bool max_norm, uint64_t key, float* norms,
                       uint8_t* packed) {
  const int w = code_width(s);
  const bool fused = d <= kFuseMax;
  if (!fused) {
    at::parallel_for(0, num_buckets(n, d), 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) norms[b] = bucket_norm(x + b * d, std::min(d, n - b * d), max_norm);
    });
  }
  const int64_t unit = fused ? d / std::gcd(d, int64_t(8)) * 8 : 8 * kBlock;
  const int64_t units = (n + unit - 1) / unit;
  at::parallel_for(0, units, std::max<int64_t>(1, kGrainValues / unit), [&](int64_t u0, int64_t u1) {
    std::vector<float> u(kBlock);
    std::vector<int32_t> q(kBlock);
    const int64_t i0 = u0 * unit, i1 = std::min(n, u1 * unit);
    BitWriter bw(packed + i0 * w / 8);
    for (int64_t i = i0; i < i1;) {
      const int64_t b = i / d, bend = std::min((b + 1) * d, n);
      if (fused) norms[b] = bucket_norm(x + i, bend - i, max_norm);  // i is the bucket's start
      const int64_t end = std::min(bend, i1);
      for (int64_t j = i; j < end; j += kBlock) {
        const int64_t len = std::min(kBlock, end - j);
        quantize(x + j, len, j, norms[b], s, key, u.data(), q.data());
        int64_t k = 0;
        if (w == 4) {
          for (; k + 8 <= len; k += 8) {
            uint32_t word = 0;
            for (int t = 0; t < 8; ++t) {
              const int32_t v = q[k + t];
              const uint32_t c = (v < 0 ? 1u : 0u) | (static_cast<uint32_t>(v < 0 ? -v : v) << 1);
              word |= c << (4 * t);
            }
            bw.put(word, 32);
          }
        }
        for (; k < len; ++k) {
          const int32_t v = q[k];
          bw.put((v < 0 ? 1u : 0u) | (static_cast<uint64_t>(v < 0 ? -v : v) << 1), w);
        }
      }
      i = end;
    }
    bw.flush();
  });
}

template <typename T>
void decode_fixed_impl(const float* norms, int64_t norm_stride, const uint8_t* packed, int64_t packed_stride,
                       int64_t nbytes, int64_t K, int64_t n, int64_t d, int64_t s, double scale, T* out) {
  using acc_t = typename Acc<T>::type;
  const int w = code_width(s);
  const uint64_t mask = (uint64_t(1) << w) - 1;
  const bool plain = K == 1 && scale == 1.0;
  const acc_t sc = static_cast<acc_t>(scale);
  const int64_t units = (n + kBlock - 1) / kBlock;
  at::parallel_for(0, units, std::max<int64_t>(1, kGrainValues / kBlock), [&](int64_t u0, int64_t u1) {
    std::vector<acc_t> acc(kBlock);
    std::vector<acc_t> lut(w <= 8 ? (size_t(1) << w) : 0);
    for (int64_t i = u0 * kBlock, i1 = std::min(n, u1 * kBlock); i < i1;) {
      const int64_t b = i / d;
      const int64_t len = std::min({kBlock, (b + 1) * d - i, i1 - i});
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t* pk = packed + k * packed_stride;
        const acc_t bscale = static_cast<acc_t>(norms[k * norm_stride + b]) / static_cast<acc_t>(s);
        acc_t* a = acc.data();
        auto value = [&](uint64_t c) -> acc_t {
          const acc_t v = static_cast<acc_t>(c >> 1) * bscale;
          return (c & 1) ? -v : v;
        };
        auto emit = [&](int64_t j, acc_t v) {
          if (k == 0) a[j] = v; else a[j] += v;
        };
        if (w <= 8) {
          for (uint64_t c = 0; c <= mask; ++c) lut[c] = value(c);
          int64_t j = 0;
          if (w == 4) {
            if ((i & 1) && len > 0) { emit(0, lut[pk[i >> 1] >> 4]); j = 1; }
            for (; j + 2 <= len; j += 2) {
              const uint8_t byte = pk[(i + j) >> 1];
              emit(j, lut[byte & 15]);
              emit(j + 1, lut[byte >> 4]);
            }
            if (j < len) emit(j, lut[pk[(i + j) >> 1] & 15]);
          } else if (w == 8) {
            for (; j < len; ++j) emit(j, lut[pk[i + j]]);
          } else {
            for (; j < len; ++j) {
              const int64_t bit = (i + j) * w;
              const int64_t byte = bit >> 3;
              uint32_t word = pk[byte];
              if (byte + 1 < nbytes) word |= static_cast<uint32_t>(pk[byte + 1]) << 8;
              emit(j, lut[(word >> (bit & 7)) & mask]);
            }
          }
        } else {
          for (int64_t j = 0; j < len; ++j) {
            const int64_t bit = (i + j) * w;
            const int64_t byte = bit >> 3;
            uint64_t word = 0;
            if (byte + 8 <= nbytes) {
              std::memcpy(&word, pk + byte, 8);
            } else {
              for (int64_t t = byte; t < nbytes; ++t) word |= static_cast<uint64_t>(pk[t]) << (8 * (t - byte));
            }
            emit(j, value((word >> (bit & 7)) & mask));
          }
        }
      }
      T* o = out + i;
      if (plain) {
        for (int64_t j = 0; j < len; ++j) o[j] = static_cast<T>(acc[j]);
      } else {
        for (int64_t j = 0; j < len; ++j) o[j] = static_cast<T>(acc[j] * sc);
      }
      i += len;
    }
  });
}

// Upper bound of one bucket's Elias code in bits: header gamma(nnz+1), gaps (<= 1.51 len
// in total, by concavity), sign + gamma(level) per value.
int64_t elias_bucket_bound(int64_t len, int64_t s) {
  const int64_t lg_s = 63 - __builtin_clzll(static_cast<uint64_t>(s));
  const int64_t lg_len = 63 - __builtin_clzll(static_cast<uint64_t>(len + 1));
  return 2 * len + len * (2 * lg_s + 2) + 2 * lg_len + 1;
}

template <typename T>
void encode_elias_impl(const T* x, int64_t n, int64_t d, int64_t s, bool max_norm, uint64_t key, int64_t gb,
                       int64_t G, float* norms, int64_t* nbits, const std::vector<int64_t>& region, uint8_t* tmp) {
  const int64_t B = num_buckets(n, d);
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> u(kBlock);
    std::vector<int32_t> q(static_cast<size_t>(std::min(d, n)));
    for (int64_t g = g0; g < g1; ++g) {
      BitWriter bw(tmp + region[g]);
      for (int64_t b = g * gb, be = std::min(B, (g + 1) * gb); b < be; ++b) {
        const int64_t i0 = b * d, len = std::min(d, n - i0);
        const float nrm = bucket_norm(x + i0, len, max_norm);
        norms[b] = nrm;
        int64_t nnz = 0;
        for (int64_t j = 0; j < len; j += kBlock) {
          const int64_t l = std::min(kBlock, len - j);
          quantize(x + i0 + j, l, i0 + j, nrm, s, key, u.data(), q.data() + j);
          for (int64_t t = 0; t < l; ++t) nnz += q[j + t] != 0;
        }
        bw.put_gamma(static_cast<uint64_t>(nnz) + 1);
        int64_t prev = -1;
        for (int64_t j = 0; j < len; ++j) {
          const int32_t v = q[j];
          if (v == 0) continue;
          bw.put_gamma(static_cast<uint64_t>(j - prev));  // gap + 1
          bw.put(v < 0 ? 1 : 0, 1);
          bw.put_gamma(static_cast<uint64_t>(v < 0 ? -v : v));
          prev = j;
        }
      }
      nbits[g] = bw.bits();
      bw.flush();
    }
  });
}

template <typename T>
void decode_elias_impl(const float* norms, const int64_t* nbits, const uint8_t* stream, const std::vector<int64_t>& start,
                       int64_t n, int64_t d, int64_t s, int64_t gb, int64_t G, T* out, std::atomic<int>* bad) {
  using acc_t = typename Acc<T>::type;
  const int64_t B = num_buckets(n, d);
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      BitReader br{stream + start[g], start[g + 1] - start[g]};
      const int64_t limit = nbits[g];
      for (int64_t b = g * gb, be = std::min(B, (g + 1) * gb); b < be; ++b) {
        const int64_t i0 = b * d, len = std::min(d, n - i0);
        const acc_t bscale = static_cast<acc_t>(norms[b]) / static_cast<acc_t>(s);
        const T zero = static_cast<T>(acc_t(0) * bscale);
        T* o = out + i0;
        for (int64_t j = 0; j < len; ++j) o[j] = zero;
        const uint64_t h = br.gamma();
        if (h == 0 || h - 1 > static_cast<uint64_t>(len) || br.pos > limit) { bad->store(1); return; }
        int64_t pos = -1;
        for (uint64_t t = 0; t + 1 < h; ++t) {
          const uint64_t gap = br.gamma();
          if (gap == 0 || br.pos >= limit) { bad->store(1); return; }
          pos += static_cast<int64_t>(gap);
          const uint32_t neg = br.bit();
          const uint64_t lvl = br.gamma();
          if (pos >= len || lvl == 0 || lvl > static_cast<uint64_t>(s) || br.pos > limit) { bad->store(1); return; }
          const acc_t v = static_cast<acc_t>(lvl) * bscale;
          o[pos] = static_cast<T>(neg ? -v : v);
        }
      }
      if (br.pos != limit) { bad->store(1); return; }
    }
  });
}

at::Tensor make_out(const c10::optional<at::Tensor>& out_opt, int64_t n, at::ScalarType dtype, const char* who) {
  return hgc_decode_output(out_opt, n, dtype, at::kCPU, who);
}

void check_input(const at::Tensor& x, const char* who) {
  TORCH_CHECK(!x.is_cuda(), who, ": the native QSGD kernels are CPU-only; use impl='reference' for CUDA tensors");
  HGC_CHECK_CONTIGUOUS(x);
  HGC_CHECK_FLOATING(x);
}

void check_dtype(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "qsgd_decode: dtype must be fp16, bf16, fp32 or fp64, got ", dtype);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> qsgd_encode_fixed_cpu(const at::Tensor& x, int64_t s, int64_t bucket,
                                                         bool max_norm, int64_t key) {
  check_input(x, "qsgd_encode_fixed");
  const int64_t n = x.numel();
  check_common(s, bucket, n);
  const int w = code_width(s);
  auto norms = at::empty({num_buckets(n, bucket)}, x.options().dtype(at::kFloat));
  auto packed = at::empty({(n * w + 7) / 8}, x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "qsgd_encode_fixed_cpu", [&] {
    encode_fixed_impl<scalar_t>(x.data_ptr<scalar_t>(), n, bucket, s, max_norm, static_cast<uint64_t>(key),
                                norms.data_ptr<float>(), packed.data_ptr<uint8_t>());
  });
  return {norms, packed};
}

at::Tensor qsgd_decode_fixed_cpu(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s,
                                 int64_t bucket, at::ScalarType dtype, double scale,
                                 const c10::optional<at::Tensor>& out_opt) {
  TORCH_CHECK(!norms.is_cuda() && !packed.is_cuda(),
              "qsgd_decode: the native QSGD kernels are CPU-only; use impl='reference' for CUDA payloads");
  check_common(s, bucket, n);
  check_dtype(dtype);
  TORCH_CHECK(norms.scalar_type() == at::kFloat && packed.scalar_type() == at::kByte,
              "qsgd_decode: norms must be float32 and packed uint8");
  at::Tensor nr = norms.dim() == 1 ? norms.unsqueeze(0) : norms;
  at::Tensor pk = packed.dim() == 1 ? packed.unsqueeze(0) : packed;
  TORCH_CHECK(nr.dim() == 2 && pk.dim() == 2 && nr.size(0) == pk.size(0),
              "qsgd_decode: expected norms [K, buckets] and packed [K, bytes]");
  TORCH_CHECK((nr.size(1) <= 1 || nr.stride(1) == 1) && (pk.size(1) <= 1 || pk.stride(1) == 1),
              "qsgd_decode: rows must be contiguous");
  const int64_t nbytes = (n * code_width(s) + 7) / 8;
  TORCH_CHECK(nr.size(1) == num_buckets(n, bucket), "qsgd_decode: expected ", num_buckets(n, bucket),
              " norms, got ", nr.size(1));
  TORCH_CHECK(pk.size(1) == nbytes, "qsgd_decode: expected ", nbytes, " packed bytes, got ", pk.size(1));
  at::Tensor out = make_out(out_opt, n, dtype, "qsgd_decode");
  const int64_t K = nr.size(0);
  TORCH_CHECK(K >= 1 || n == 0, "qsgd_decode: no payloads");
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "qsgd_decode_fixed_cpu", [&] {
    decode_fixed_impl<scalar_t>(nr.data_ptr<float>(), nr.stride(0), pk.data_ptr<uint8_t>(), pk.stride(0), nbytes, K,
                                n, bucket, s, scale, out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qsgd_encode_elias_cpu(const at::Tensor& x, int64_t s,
                                                                     int64_t bucket, bool max_norm, int64_t key,
                                                                     int64_t group_buckets) {
  check_input(x, "qsgd_encode_elias");
  const int64_t n = x.numel();
  check_common(s, bucket, n);
  TORCH_CHECK(group_buckets >= 1, "qsgd_encode_elias: group_buckets must be >= 1");
  const int64_t B = num_buckets(n, bucket);
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  std::vector<int64_t> region(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    int64_t bits = 0;
    for (int64_t b = g * group_buckets, be = std::min(B, (g + 1) * group_buckets); b < be; ++b)
      bits += elias_bucket_bound(std::min(bucket, n - b * bucket), s);
    region[g + 1] = region[g] + (bits + 64 + 63) / 64 * 8;  // + a word of slack, 8-byte aligned
  }
  auto norms = at::empty({B}, x.options().dtype(at::kFloat));
  auto nbits = at::zeros({G}, x.options().dtype(at::kLong));
  auto tmp = at::empty({region[G]}, x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "qsgd_encode_elias_cpu", [&] {
    encode_elias_impl<scalar_t>(x.data_ptr<scalar_t>(), n, bucket, s, max_norm, static_cast<uint64_t>(key),
                                group_buckets, G, norms.data_ptr<float>(), nbits.data_ptr<int64_t>(), region,
                                tmp.data_ptr<uint8_t>());
  });
  const int64_t* nb = nbits.data_ptr<int64_t>();
  std::vector<int64_t> start(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) start[g + 1] = start[g] + (nb[g] + 7) / 8;
  auto stream = at::empty({start[G]}, x.options().dtype(at::kByte));
  uint8_t* dst = stream.data_ptr<uint8_t>();
  const uint8_t* src = tmp.data_ptr<uint8_t>();
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) std::memcpy(dst + start[g], src + region[g], start[g + 1] - start[g]);
  });
  return {norms, nbits, stream};
}

at::Tensor qsgd_decode_elias_cpu(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream,
                                 int64_t n, int64_t s, int64_t bucket, int64_t group_buckets,
                                 at::ScalarType dtype, const c10::optional<at::Tensor>& out_opt) {
  TORCH_CHECK(!norms.is_cuda() && !nbits.is_cuda() && !stream.is_cuda(),
              "qsgd_decode: the native QSGD kernels are CPU-only; use impl='reference' for CUDA payloads");
  check_common(s, bucket, n);
  check_dtype(dtype);
  TORCH_CHECK(group_buckets >= 1, "qsgd_decode: group_buckets must be >= 1");
  TORCH_CHECK(norms.scalar_type() == at::kFloat && nbits.scalar_type() == at::kLong &&
                  stream.scalar_type() == at::kByte,
              "qsgd_decode: expected norms float32, nbits int64, stream uint8");
  TORCH_CHECK(norms.dim() == 1 && nbits.dim() == 1 && stream.dim() == 1, "qsgd_decode: expected flat buffers");
  const int64_t B = num_buckets(n, bucket);
  const int64_t G = std::max<int64_t>(1, (B + group_buckets - 1) / group_buckets);
  TORCH_CHECK(norms.numel() == B, "qsgd_decode: expected ", B, " norms, got ", norms.numel());
  TORCH_CHECK(nbits.numel() == G, "qsgd_decode: expected ", G, " group bit counts, got ", nbits.numel());
  auto nb_c = nbits.contiguous();
  auto norms_c = norms.contiguous();
  auto stream_c = stream.contiguous();
  const int64_t* nb = nb_c.data_ptr<int64_t>();
  std::vector<int64_t> start(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    TORCH_CHECK(nb[g] >= 0, "qsgd_decode: negative bit count");
    start[g + 1] = start[g] + (nb[g] + 7) / 8;
  }
  TORCH_CHECK(stream.numel() == start[G], "qsgd_decode: the stream holds ", stream.numel(), " bytes, the header says ",
              start[G]);
  at::Tensor out = make_out(out_opt, n, dtype, "qsgd_decode");
  if (n == 0) return out;
  std::atomic<int> bad{0};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "qsgd_decode_elias_cpu", [&] {
    decode_elias_impl<scalar_t>(norms_c.data_ptr<float>(), nb, stream_c.data_ptr<uint8_t>(), start, n, bucket, s,
                                group_buckets, G, out.data_ptr<scalar_t>(), &bad);
  });
  TORCH_CHECK(!bad.load(), "qsgd_decode: malformed Elias stream");
  return out;
}
