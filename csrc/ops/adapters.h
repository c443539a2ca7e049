// Adapters between the dispatcher's argument types and the kernels' (the ops marked HGC_ADAPTED
// in ops/schemas.h: hgc::adapt::<op name>, for _C's CPU kernels and the device kernels alike):
//   int[] dtypes      -> std::vector<at::ScalarType> (a ScalarType[] argument fails opcheck's
//                        schema check in torch 2.13, so the dtypes travel as their codes);
//   bool[]? by_rows   -> c10::optional<std::vector<bool>> (the dispatcher has no vector<bool>);
//   Tensor[] x + int[] x_counts -> std::vector<std::vector<at::Tensor>> (a Tensor[][] argument
//                        is invisible to the dispatcher's device selection).
//   the decodes' `out`/`outs` (ops/schemas.h): `name` calls the kernel with none (c10::nullopt,
//                        or one empty slot per tensor), `name_into` with the caller's and drops
//                        the result (the kernel wrote into them).
// Each adapter is a template over the kernel it calls, so one definition serves both backends.
#pragma once
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace hgc {

using Tensors = std::vector<at::Tensor>;
using Outs = std::vector<c10::optional<at::Tensor>>;
using Nested = std::vector<std::vector<at::Tensor>>;
using BoolList = c10::optional<c10::List<bool>>;

// The ScalarTypes of their codes (checked: each names a ScalarType).
inline std::vector<at::ScalarType> scalar_types(const std::vector<int64_t>& codes, const char* op) {
  std::vector<at::ScalarType> types;
  for (const int64_t c : codes) {
    TORCH_CHECK(c >= 0 && c < static_cast<int64_t>(at::ScalarType::NumOptions), op, ": ", c,
                " is not a dtype code (give torch dtypes)");
    types.push_back(static_cast<at::ScalarType>(c));
  }
  return types;
}

inline c10::optional<std::vector<bool>> bools(const BoolList& list) {
  if (!list.has_value()) return c10::nullopt;
  std::vector<bool> out;
  for (const bool b : *list) out.push_back(b);
  return out;
}

// flat (every list's tensors, list after list) cut into lists of counts[i] tensors (checked).
inline Nested nest(const Tensors& flat, const std::vector<int64_t>& counts, const char* op, const char* what) {
  Nested lists;
  std::size_t at = 0;
  for (const int64_t c : counts) {
    TORCH_CHECK(c >= 0 && at + static_cast<std::size_t>(c) <= flat.size(), op, ": ", what,
                "_counts do not match the ", flat.size(), " tensors of ", what);
    lists.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(at),
                       flat.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(c)));
    at += static_cast<std::size_t>(c);
  }
  TORCH_CHECK(at == flat.size(), op, ": ", what, "_counts do not match the ", flat.size(), " tensors of ", what);
  return lists;
}

// Every out of a `_into` bucket op as the kernels take them (each present).
inline Outs present(const Tensors& outs) { return Outs(outs.begin(), outs.end()); }

namespace adapt {

// -- single-tensor decodes: a fresh result, or into the caller's out -------------------------------

template <auto Fn>
at::Tensor terngrad_decode_sum(const at::Tensor& codes, const at::Tensor& scales, int64_t n, at::ScalarType dtype,
                               double scale) {
  return Fn(codes, scales, n, dtype, scale, c10::nullopt);
}

template <auto Fn>
void terngrad_decode_sum_into(const at::Tensor& codes, const at::Tensor& scales, int64_t n, at::ScalarType dtype,
                              double scale, const at::Tensor& out) {
  Fn(codes, scales, n, dtype, scale, out);
}

template <auto Fn>
at::Tensor terngrad_sum_decode(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                               at::ScalarType dtype) {
  return Fn(levels, n, k, width, mult, dtype, c10::nullopt);
}

template <auto Fn>
void terngrad_sum_decode_into(const at::Tensor& levels, int64_t n, int64_t k, int64_t width, double mult,
                              at::ScalarType dtype, const at::Tensor& out) {
  Fn(levels, n, k, width, mult, dtype, out);
}

template <auto Fn>
at::Tensor onebit_decode(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                         at::ScalarType dtype, bool by_rows) {
  return Fn(bits, scales, n, cols, dtype, c10::nullopt, by_rows);
}

template <auto Fn>
void onebit_decode_into(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                        at::ScalarType dtype, const at::Tensor& out, bool by_rows) {
  Fn(bits, scales, n, cols, dtype, out, by_rows);
}

template <auto Fn>
at::Tensor onebit_decode_sum(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                             at::ScalarType dtype, double scale, bool by_rows) {
  return Fn(bits, scales, n, cols, dtype, scale, c10::nullopt, by_rows);
}

template <auto Fn>
void onebit_decode_sum_into(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t cols,
                            at::ScalarType dtype, double scale, const at::Tensor& out, bool by_rows) {
  Fn(bits, scales, n, cols, dtype, scale, out, by_rows);
}

template <auto Fn>
at::Tensor qsgd_decode_fixed(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s, int64_t bucket,
                             at::ScalarType dtype, double scale) {
  return Fn(norms, packed, n, s, bucket, dtype, scale, c10::nullopt);
}

template <auto Fn>
void qsgd_decode_fixed_into(const at::Tensor& norms, const at::Tensor& packed, int64_t n, int64_t s, int64_t bucket,
                            at::ScalarType dtype, double scale, const at::Tensor& out) {
  Fn(norms, packed, n, s, bucket, dtype, scale, out);
}

template <auto Fn>
at::Tensor qsgd_decode_elias(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream, int64_t n,
                             int64_t s, int64_t bucket, int64_t group_buckets, at::ScalarType dtype) {
  return Fn(norms, nbits, stream, n, s, bucket, group_buckets, dtype, c10::nullopt);
}

template <auto Fn>
void qsgd_decode_elias_into(const at::Tensor& norms, const at::Tensor& nbits, const at::Tensor& stream, int64_t n,
                            int64_t s, int64_t bucket, int64_t group_buckets, at::ScalarType dtype,
                            const at::Tensor& out) {
  Fn(norms, nbits, stream, n, s, bucket, group_buckets, dtype, out);
}

template <auto Fn>
at::Tensor dgc_scatter_sum(const Tensors& indices, const Tensors& values, int64_t n, at::ScalarType dtype,
                           double scale) {
  return Fn(indices, values, n, dtype, scale, c10::nullopt);
}

template <auto Fn>
void dgc_scatter_sum_into(const Tensors& indices, const Tensors& values, int64_t n, at::ScalarType dtype,
                          double scale, const at::Tensor& out) {
  Fn(indices, values, n, dtype, scale, out);
}

// -- bucket ops: the adapters' argument conversions, then fresh results or the caller's outs -------

template <auto Fn>
Tensors terngrad_decode_sum_many_with(const Tensors& codes, const Tensors& scales, const std::vector<int64_t>& n,
                                      const std::vector<int64_t>& dtypes, double scale, const Outs& outs) {
  return Fn(codes, scales, n, scalar_types(dtypes, "terngrad_decode_sum_many"), scale, outs);
}

template <auto Fn>
Tensors terngrad_decode_sum_many(const Tensors& codes, const Tensors& scales, const std::vector<int64_t>& n,
                                 const std::vector<int64_t>& dtypes, double scale) {
  return terngrad_decode_sum_many_with<Fn>(codes, scales, n, dtypes, scale, Outs(n.size()));
}

template <auto Fn>
void terngrad_decode_sum_many_into(const Tensors& codes, const Tensors& scales, const std::vector<int64_t>& n,
                                   const std::vector<int64_t>& dtypes, double scale, const Tensors& outs) {
  terngrad_decode_sum_many_with<Fn>(codes, scales, n, dtypes, scale, present(outs));
}

template <auto Fn>
Tensors onebit_scales_many(const Tensors& grads, const c10::optional<Tensors>& residuals,
                           const std::vector<int64_t>& cols, const BoolList& by_rows) {
  return Fn(grads, residuals, cols, bools(by_rows));
}

template <auto Fn>
std::tuple<Tensors, Tensors> onebit_encode_many(const Tensors& grads, const c10::optional<Tensors>& residuals,
                                                const std::vector<int64_t>& cols,
                                                const c10::optional<Tensors>& scales, const BoolList& by_rows) {
  return Fn(grads, residuals, cols, scales, bools(by_rows));
}

template <auto Fn>
Tensors onebit_decode_sum_many(const Tensors& bits, const Tensors& scales, const std::vector<int64_t>& n,
                               const std::vector<int64_t>& cols, const std::vector<int64_t>& dtypes, double scale,
                               const BoolList& by_rows) {
  return Fn(bits, scales, n, cols, scalar_types(dtypes, "onebit_decode_sum_many"), scale, Outs(n.size()),
            bools(by_rows));
}

template <auto Fn>
void onebit_decode_sum_many_into(const Tensors& bits, const Tensors& scales, const std::vector<int64_t>& n,
                                 const std::vector<int64_t>& cols, const std::vector<int64_t>& dtypes, double scale,
                                 const Tensors& outs, const BoolList& by_rows) {
  Fn(bits, scales, n, cols, scalar_types(dtypes, "onebit_decode_sum_many"), scale, present(outs), bools(by_rows));
}

template <auto Fn>
Tensors qsgd_decode_fixed_many(const Tensors& norms, const Tensors& packed, const std::vector<int64_t>& n, int64_t s,
                               int64_t bucket, const std::vector<int64_t>& dtypes, double scale) {
  return Fn(norms, packed, n, s, bucket, scalar_types(dtypes, "qsgd_decode_fixed_many"), scale, Outs(n.size()));
}

template <auto Fn>
void qsgd_decode_fixed_many_into(const Tensors& norms, const Tensors& packed, const std::vector<int64_t>& n,
                                 int64_t s, int64_t bucket, const std::vector<int64_t>& dtypes, double scale,
                                 const Tensors& outs) {
  Fn(norms, packed, n, s, bucket, scalar_types(dtypes, "qsgd_decode_fixed_many"), scale, present(outs));
}

template <auto Fn>
Tensors qsgd_decode_elias_many_with(const Tensors& norms, const std::vector<int64_t>& norms_counts,
                                    const Tensors& nbits, const std::vector<int64_t>& nbits_counts,
                                    const Tensors& streams, const std::vector<int64_t>& streams_counts,
                                    const std::vector<int64_t>& n, int64_t s, int64_t bucket, int64_t group_buckets,
                                    const std::vector<int64_t>& dtypes, double scale, const Outs& outs) {
  constexpr const char* op = "qsgd_decode_elias_many";
  return Fn(nest(norms, norms_counts, op, "norms"), nest(nbits, nbits_counts, op, "nbits"),
            nest(streams, streams_counts, op, "streams"), n, s, bucket, group_buckets, scalar_types(dtypes, op),
            scale, outs);
}

template <auto Fn>
Tensors qsgd_decode_elias_many(const Tensors& norms, const std::vector<int64_t>& norms_counts, const Tensors& nbits,
                               const std::vector<int64_t>& nbits_counts, const Tensors& streams,
                               const std::vector<int64_t>& streams_counts, const std::vector<int64_t>& n, int64_t s,
                               int64_t bucket, int64_t group_buckets, const std::vector<int64_t>& dtypes,
                               double scale) {
  return qsgd_decode_elias_many_with<Fn>(norms, norms_counts, nbits, nbits_counts, streams, streams_counts, n, s,
                                         bucket, group_buckets, dtypes, scale, Outs(n.size()));
}

template <auto Fn>
void qsgd_decode_elias_many_into(const Tensors& norms, const std::vector<int64_t>& norms_counts,
                                 const Tensors& nbits, const std::vector<int64_t>& nbits_counts,
                                 const Tensors& streams, const std::vector<int64_t>& streams_counts,
                                 const std::vector<int64_t>& n, int64_t s, int64_t bucket, int64_t group_buckets,
                                 const std::vector<int64_t>& dtypes, double scale, const Tensors& outs) {
  qsgd_decode_elias_many_with<Fn>(norms, norms_counts, nbits, nbits_counts, streams, streams_counts, n, s, bucket,
                                  group_buckets, dtypes, scale, present(outs));
}

// dgc_scatter_sum_many and dgc_decode_sum_many: `first` is the indices (or codes) of each tensor.
template <auto Fn>
Tensors dgc_sum_many(const char* op, const char* first_name, const Tensors& first,
                     const std::vector<int64_t>& first_counts, const Tensors& values,
                     const std::vector<int64_t>& values_counts, const std::vector<int64_t>& n,
                     const std::vector<int64_t>& dtypes, double scale, const Outs& outs) {
  return Fn(nest(first, first_counts, op, first_name), nest(values, values_counts, op, "values"), n,
            scalar_types(dtypes, op), scale, outs);
}

template <auto Fn>
Tensors dgc_scatter_sum_many(const Tensors& indices, const std::vector<int64_t>& indices_counts,
                             const Tensors& values, const std::vector<int64_t>& values_counts,
                             const std::vector<int64_t>& n, const std::vector<int64_t>& dtypes, double scale) {
  return dgc_sum_many<Fn>("dgc_scatter_sum_many", "indices", indices, indices_counts, values, values_counts, n,
                          dtypes, scale, Outs(n.size()));
}

template <auto Fn>
void dgc_scatter_sum_many_into(const Tensors& indices, const std::vector<int64_t>& indices_counts,
                               const Tensors& values, const std::vector<int64_t>& values_counts,
                               const std::vector<int64_t>& n, const std::vector<int64_t>& dtypes, double scale,
                               const Tensors& outs) {
  dgc_sum_many<Fn>("dgc_scatter_sum_many", "indices", indices, indices_counts, values, values_counts, n, dtypes,
                   scale, present(outs));
}

template <auto Fn>
Tensors dgc_decode_sum_many(const Tensors& codes, const std::vector<int64_t>& codes_counts, const Tensors& values,
                            const std::vector<int64_t>& values_counts, const std::vector<int64_t>& n,
                            const std::vector<int64_t>& dtypes, double scale) {
  return dgc_sum_many<Fn>("dgc_decode_sum_many", "codes", codes, codes_counts, values, values_counts, n, dtypes,
                          scale, Outs(n.size()));
}

template <auto Fn>
void dgc_decode_sum_many_into(const Tensors& codes, const std::vector<int64_t>& codes_counts, const Tensors& values,
                              const std::vector<int64_t>& values_counts, const std::vector<int64_t>& n,
                              const std::vector<int64_t>& dtypes, double scale, const Tensors& outs) {
  dgc_sum_many<Fn>("dgc_decode_sum_many", "codes", codes, codes_counts, values, values_counts, n, dtypes, scale,
                   present(outs));
}

// dgc_accumulate's kernels take u and v by non-const reference.
template <auto Fn>
void dgc_accumulate(const at::Tensor& u, const at::Tensor& v, const at::Tensor& g, double momentum, bool nesterov,
                    double coef) {
  at::Tensor uu = u, vv = v;
  Fn(uu, vv, g, momentum, nesterov, coef);
}

}  // namespace adapt
}  // namespace hgc
