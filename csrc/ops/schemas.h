// Every op of horovod_gradcomp, one entry per op, codec by codec: X(name, kernel, schema).
// These lists are the only place an op is named: the `hgc` namespace of _C defines each schema
// (binding.cpp) and registers its CPU kernel `name_cpu` (csrc/cpu/, registered by binding.cpp)
// and, with CUDA, its device kernel `name_device` (device/<codec>_ops.cpp); _C_twin defines the
// same schemas under `hgc_twin` with the device kernels (device/registry.h). `kernel` says how a kernel function
// becomes the op's kernel: HGC_AS_IS (its signature is the schema's), HGC_ADAPTED (through the
// adapter hgc::adapt::<name>, ops/adapters.h). Mutated arguments are annotated (a!); lists of
// dtypes travel as their ScalarType codes (int[]) and lists of per-tensor payload lists
// flattened, with their lengths in `<name>_counts` (see ops/adapters.h).
// A decode that can write into the caller's buffer is two ops (HGC_<CODEC>_INTO_OPS): `name`
// returns a fresh result and `name_into` writes into `out` (or every one of `outs`) and returns
// nothing. One op with an optional `out` that it also returned would return an alias of an input,
// which a custom op must not: torch.compile's functionalization cannot express it (inductor fails
// on it) and the schema could not say it.
// horovod_gradcomp/ops.py binds the ops to the modules under their Python names (`name(...,
// out=None)` calls one or the other) and registers their fake (meta) kernels.
#pragma once
#include <torch/library.h>

#include <string>
#include <vector>

#define HGC_TERNGRAD_OPS(X)                                                                                       \
  X(terngrad_max_abs, HGC_AS_IS, "(Tensor grad) -> float")                                                           \
  X(terngrad_sigma, HGC_AS_IS, "(Tensor grad) -> float")                                                             \
  X(terngrad_encode, HGC_AS_IS, "(Tensor grad, float scale, float clip, int key0, int key1) -> (Tensor, Tensor)")    \
  X(terngrad_decode_sum, HGC_ADAPTED, "(Tensor codes, Tensor scales, int n, ScalarType dtype, "                      \
      "float scale) -> Tensor")                                                                                      \
  X(terngrad_sum_levels, HGC_AS_IS, "(Tensor codes, int n, int width) -> Tensor")                                    \
  X(terngrad_sum_decode, HGC_ADAPTED, "(Tensor levels, int n, int k, int width, float mult, "                        \
      "ScalarType dtype) -> Tensor")                                                                                 \
  X(terngrad_scale_stats_many, HGC_AS_IS, "(Tensor[] grads, bool with_sigma) -> Tensor")                             \
  X(terngrad_encode_many, HGC_AS_IS, "(Tensor[] grads, float[] scales, float[] clips, int[] key0s, "                 \
      "int[] key1s) -> (Tensor[], Tensor[])")                                                                        \
  X(terngrad_decode_sum_many, HGC_ADAPTED, "(Tensor[] codes, Tensor[] scales, int[] n, int[] dtypes, "               \
      "float scale) -> Tensor[]")
#define HGC_TERNGRAD_INTO_OPS(Y)                                                                                  \
  Y(terngrad_decode_sum, "(Tensor codes, Tensor scales, int n, ScalarType dtype, float scale, "                      \
      "Tensor(a!) out) -> ()")                                                                                       \
  Y(terngrad_sum_decode, "(Tensor levels, int n, int k, int width, float mult, ScalarType dtype, "                   \
      "Tensor(a!) out) -> ()")                                                                                       \
  Y(terngrad_decode_sum_many, "(Tensor[] codes, Tensor[] scales, int[] n, int[] dtypes, float scale, "               \
      "Tensor(a!)[] outs) -> ()")

#define HGC_ONEBIT_OPS(X)                                                                                          \
  X(onebit_encode, HGC_AS_IS, "(Tensor grad, Tensor(a!)? residual, int cols, Tensor? scales=None, "                  \
      "bool by_rows=False) -> (Tensor, Tensor)")                                                                     \
  X(onebit_scales, HGC_AS_IS, "(Tensor grad, Tensor? residual, int cols, bool by_rows=False) -> Tensor")             \
  X(onebit_scales_many, HGC_ADAPTED, "(Tensor[] grads, Tensor[]? residuals, int[] cols, "                            \
      "bool[]? by_rows=None) -> Tensor[]")                                                                           \
  X(onebit_decode, HGC_ADAPTED, "(Tensor bits, Tensor scales, int n, int cols, ScalarType dtype, "                   \
      "bool by_rows=False) -> Tensor")                                                                               \
  X(onebit_decode_sum, HGC_ADAPTED, "(Tensor bits, Tensor scales, int n, int cols, ScalarType dtype, "               \
      "float scale, bool by_rows=False) -> Tensor")                                                                  \
  X(onebit_encode_columns, HGC_AS_IS, "(Tensor full, Tensor(a!)? residual, int full_cols, int col0, int col1, "      \
      "Tensor? scales=None) -> (Tensor, Tensor)")                                                                    \
  X(onebit_decode_columns, HGC_AS_IS, "(Tensor bits, Tensor scales, Tensor(a!) out, int full_cols, int col0, "       \
      "int col1) -> ()")                                                                                             \
  X(onebit_encode_many, HGC_ADAPTED, "(Tensor[] grads, Tensor(a!)[]? residuals, int[] cols, "                        \
      "Tensor[]? scales=None, bool[]? by_rows=None) -> (Tensor[], Tensor[])")                                        \
  X(onebit_decode_sum_many, HGC_ADAPTED, "(Tensor[] bits, Tensor[] scales, int[] n, int[] cols, int[] dtypes, "      \
      "float scale, bool[]? by_rows=None) -> Tensor[]")                                                              \
  X(onebit_encode_columns_many, HGC_AS_IS, "(Tensor[] fulls, Tensor(a!)[]? residuals, int[] full_cols, "             \
      "int[] col0, int[] col1, Tensor[]? scales=None) -> (Tensor[], Tensor[])")                                      \
  X(onebit_decode_columns_many, HGC_AS_IS, "(Tensor[] bits, Tensor[] scales, Tensor(a!)[] outs, int[] full_cols, "   \
      "int[] col0, int[] col1) -> ()")
#define HGC_ONEBIT_INTO_OPS(Y)                                                                                     \
  Y(onebit_decode, "(Tensor bits, Tensor scales, int n, int cols, ScalarType dtype, Tensor(a!) out, "                \
      "bool by_rows=False) -> ()")                                                                                   \
  Y(onebit_decode_sum, "(Tensor bits, Tensor scales, int n, int cols, ScalarType dtype, float scale, "               \
      "Tensor(a!) out, bool by_rows=False) -> ()")                                                                   \
  Y(onebit_decode_sum_many, "(Tensor[] bits, Tensor[] scales, int[] n, int[] cols, int[] dtypes, float scale, "      \
      "Tensor(a!)[] outs, bool[]? by_rows=None) -> ()")

#define HGC_QSGD_OPS(X)                                                                                             \
  X(qsgd_encode_fixed, HGC_AS_IS, "(Tensor x, int s, int bucket, bool max_norm, int key) -> (Tensor, Tensor)")       \
  X(qsgd_decode_fixed, HGC_ADAPTED, "(Tensor norms, Tensor packed, int n, int s, int bucket, ScalarType dtype, "     \
      "float scale=1.0) -> Tensor")                                                                                  \
  X(qsgd_encode_elias, HGC_AS_IS, "(Tensor x, int s, int bucket, bool max_norm, int key, "                           \
      "int group_buckets) -> (Tensor, Tensor, Tensor)")                                                              \
  X(qsgd_decode_elias, HGC_ADAPTED, "(Tensor norms, Tensor nbits, Tensor stream, int n, int s, int bucket, "         \
      "int group_buckets, ScalarType dtype) -> Tensor")                                                              \
  X(qsgd_encode_fixed_many, HGC_AS_IS, "(Tensor[] xs, int s, int bucket, bool max_norm, "                            \
      "int[] keys) -> (Tensor[], Tensor[])")                                                                         \
  X(qsgd_decode_fixed_many, HGC_ADAPTED, "(Tensor[] norms, Tensor[] packed, int[] n, int s, int bucket, "            \
      "int[] dtypes, float scale) -> Tensor[]")                                                                      \
  X(qsgd_encode_elias_many, HGC_AS_IS, "(Tensor[] xs, int s, int bucket, bool max_norm, int[] keys, "                \
      "int group_buckets) -> (Tensor[], Tensor[], Tensor[])")                                                        \
  X(qsgd_decode_elias_many, HGC_ADAPTED, "(Tensor[] norms, int[] norms_counts, Tensor[] nbits, "                     \
      "int[] nbits_counts, Tensor[] streams, int[] streams_counts, int[] n, int s, int bucket, int group_buckets, "  \
      "int[] dtypes, float scale) -> Tensor[]")
#define HGC_QSGD_INTO_OPS(Y)                                                                                        \
  Y(qsgd_decode_fixed, "(Tensor norms, Tensor packed, int n, int s, int bucket, ScalarType dtype, "                  \
      "float scale, Tensor(a!) out) -> ()")                                                                          \
  Y(qsgd_decode_elias, "(Tensor norms, Tensor nbits, Tensor stream, int n, int s, int bucket, int group_buckets, "   \
      "ScalarType dtype, Tensor(a!) out) -> ()")                                                                     \
  Y(qsgd_decode_fixed_many, "(Tensor[] norms, Tensor[] packed, int[] n, int s, int bucket, int[] dtypes, "           \
      "float scale, Tensor(a!)[] outs) -> ()")                                                                       \
  Y(qsgd_decode_elias_many, "(Tensor[] norms, int[] norms_counts, Tensor[] nbits, int[] nbits_counts, "              \
      "Tensor[] streams, int[] streams_counts, int[] n, int s, int bucket, int group_buckets, int[] dtypes, "        \
      "float scale, Tensor(a!)[] outs) -> ()")

#define HGC_DGC_OPS(X)                                                                                             \
  X(dgc_select, HGC_AS_IS, "(Tensor x, int k, int sample_count, int key) -> (Tensor, Tensor, float, int)")           \
  X(dgc_scatter_sum, HGC_ADAPTED, "(Tensor[] indices, Tensor[] values, int n, ScalarType dtype, "                    \
      "float scale=1.0) -> Tensor")                                                                                  \
  X(dgc_index_encode, HGC_AS_IS, "(Tensor indices, int n) -> Tensor")                                                \
  X(dgc_index_decode, HGC_AS_IS, "(Tensor code, SymInt count, int n) -> Tensor")                                     \
  X(dgc_accumulate, HGC_ADAPTED, "(Tensor(a!) u, Tensor(b!) v, Tensor g, float momentum, bool nesterov, "            \
      "float coef=1.0) -> ()")                                                                                       \
  X(dgc_scatter_sum_many, HGC_ADAPTED, "(Tensor[] indices, int[] indices_counts, Tensor[] values, "                  \
      "int[] values_counts, int[] n, int[] dtypes, float scale) -> Tensor[]")                                        \
  X(dgc_decode_sum_many, HGC_ADAPTED, "(Tensor[] codes, int[] codes_counts, Tensor[] values, "                       \
      "int[] values_counts, int[] n, int[] dtypes, float scale) -> Tensor[]")                                        \
  X(dgc_accumulate_many, HGC_AS_IS, "(Tensor(a!)[] u, Tensor(b!)[] v, Tensor[] g, float momentum, bool nesterov, "   \
      "float coef=1.0) -> ()")                                                                                       \
  X(dgc_mask_many, HGC_AS_IS, "(Tensor[] indices, Tensor(a!)[] v, Tensor(b!)[]? u=None) -> ()")                      \
  X(dgc_select_many, HGC_AS_IS, "(Tensor[] xs, int[] k, int[] sample_count, int[] keys) -> (Tensor[], Tensor[], "    \
      "float[], int[])")                                                                                             \
  X(dgc_index_encode_many, HGC_AS_IS, "(Tensor[] indices, int[] n) -> Tensor[]")
#define HGC_DGC_INTO_OPS(Y)                                                                                        \
  Y(dgc_scatter_sum, "(Tensor[] indices, Tensor[] values, int n, ScalarType dtype, float scale, "                    \
      "Tensor(a!) out) -> ()")                                                                                       \
  Y(dgc_scatter_sum_many, "(Tensor[] indices, int[] indices_counts, Tensor[] values, int[] values_counts, "          \
      "int[] n, int[] dtypes, float scale, Tensor(a!)[] outs) -> ()")                                                \
  Y(dgc_decode_sum_many, "(Tensor[] codes, int[] codes_counts, Tensor[] values, int[] values_counts, int[] n, "      \
      "int[] dtypes, float scale, Tensor(a!)[] outs) -> ()")

// The kernel function `fn` of op `name` as the dispatcher takes it (see the file's head).
#define HGC_AS_IS(name, fn) &fn
#define HGC_ADAPTED(name, fn) &hgc::adapt::name<&fn>

// X macros for the lists, used as HGC_<CODEC>_OPS(HGC_IMPL_CPU) inside a function whose
// torch::Library is `m`: each op's CPU kernel (the function `name_cpu`, csrc/cpu/) or device
// kernel (`name_device`); HGC_SCHEMA: the op's full schema string.
#define HGC_IMPL_CPU(name, kernel, schema) m.impl(#name, kernel(name, name##_cpu));
#define HGC_IMPL_DEVICE(name, kernel, schema) m.impl(#name, kernel(name, name##_device));
#define HGC_SCHEMA(name, kernel, schema) #name schema,
// The same for the lists HGC_<CODEC>_INTO_OPS(Y): op `base_into`, whose kernel is
// hgc::adapt::base_into over base's kernel (`base_cpu`, `base_device`).
#define HGC_IMPL_INTO_CPU(base, schema) m.impl(#base "_into", &hgc::adapt::base##_into<&base##_cpu>);
#define HGC_IMPL_INTO_DEVICE(base, schema) m.impl(#base "_into", &hgc::adapt::base##_into<&base##_device>);
#define HGC_SCHEMA_INTO(base, schema) #base "_into" schema,

namespace hgc {

// The schemas of each codec's ops, in the lists' order: hgc::<codec>_schemas().
#define HGC_CODEC_SCHEMAS(codec, OPS, INTO)                                          \
  inline const std::vector<const char*>& codec##_schemas() {                         \
    static const std::vector<const char*> s = {OPS(HGC_SCHEMA) INTO(HGC_SCHEMA_INTO)}; \
    return s;                                                                        \
  }
HGC_CODEC_SCHEMAS(terngrad, HGC_TERNGRAD_OPS, HGC_TERNGRAD_INTO_OPS)
HGC_CODEC_SCHEMAS(onebit, HGC_ONEBIT_OPS, HGC_ONEBIT_INTO_OPS)
HGC_CODEC_SCHEMAS(qsgd, HGC_QSGD_OPS, HGC_QSGD_INTO_OPS)
HGC_CODEC_SCHEMAS(dgc, HGC_DGC_OPS, HGC_DGC_INTO_OPS)

// Define each schema of `schemas` in m's namespace.
inline void define_ops(torch::Library& m, const std::vector<const char*>& schemas) {
  for (const char* s : schemas) m.def(s);
}

// The op names of `schemas` (each schema up to its '(').
inline std::vector<std::string> op_names(const std::vector<const char*>& schemas) {
  std::vector<std::string> names;
  for (const char* s : schemas) {
    const std::string full(s);
    names.push_back(full.substr(0, full.find('(')));
  }
  return names;
}

}  // namespace hgc
