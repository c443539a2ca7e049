// The schema of every op of horovod_gradcomp, one per op: the `hgc` namespace of _C (defined in
// binding.cpp, CPU kernels there, CUDA kernels in device/<codec>_ops.cpp) and the `hgc_twin`
// namespace of _C_twin (the same schemas, one fragment per codec, see device/<codec>_ops.cpp).
// Mutated arguments are annotated (a!); lists of dtypes travel as their ScalarType codes (int[],
// see ops/adapters.h) and lists of per-tensor payload lists flattened, with their lengths in
// `<name>_counts`. horovod_gradcomp/ops.py binds them to the modules under their Python names
// and registers their fake (meta) kernels.
#pragma once
#include <torch/library.h>

#include <string>
#include <vector>

namespace hgc {

inline const std::vector<const char*>& terngrad_schemas() {
  static const std::vector<const char*> s = {
      "terngrad_max_abs(Tensor grad) -> float",
      "terngrad_sigma(Tensor grad) -> float",
      "terngrad_encode(Tensor grad, float scale, float clip, int key0, int key1) -> (Tensor, Tensor)",
      "terngrad_decode_sum(Tensor codes, Tensor scales, int n, ScalarType dtype, float scale, "
      "Tensor(a!)? out=None) -> Tensor",
      "terngrad_sum_levels(Tensor codes, int n, int width) -> Tensor",
      "terngrad_sum_decode(Tensor levels, int n, int k, int width, float mult, ScalarType dtype, "
      "Tensor(a!)? out=None) -> Tensor",
      "terngrad_scale_stats_many(Tensor[] grads, bool with_sigma) -> Tensor",
      "terngrad_encode_many(Tensor[] grads, float[] scales, float[] clips, int[] key0s, int[] key1s) "
      "-> (Tensor[], Tensor[])",
      "terngrad_decode_sum_many(Tensor[] codes, Tensor[] scales, int[] n, int[] dtypes, float scale, "
      "Tensor(a!)?[] outs) -> Tensor[]",
  };
  return s;
}

inline const std::vector<const char*>& onebit_schemas() {
  static const std::vector<const char*> s = {
      "onebit_encode(Tensor grad, Tensor(a!)? residual, int cols, Tensor? scales=None, bool by_rows=False) "
      "-> (Tensor, Tensor)",
      "onebit_scales(Tensor grad, Tensor? residual, int cols, bool by_rows=False) -> Tensor",
      "onebit_scales_many(Tensor[] grads, Tensor[]? residuals, int[] cols, bool[]? by_rows=None) -> Tensor[]",
      "onebit_decode(Tensor bits, Tensor scales, int n, int cols, ScalarType dtype, Tensor(a!)? out=None, "
      "bool by_rows=False) -> Tensor",
      "onebit_decode_sum(Tensor bits, Tensor scales, int n, int cols, ScalarType dtype, float scale, "
      "Tensor(a!)? out=None, bool by_rows=False) -> Tensor",
      "onebit_encode_columns(Tensor full, Tensor(a!)? residual, int full_cols, int col0, int col1, "
      "Tensor? scales=None) -> (Tensor, Tensor)",
      "onebit_decode_columns(Tensor bits, Tensor scales, Tensor(a!) out, int full_cols, int col0, int col1) -> ()",
      "onebit_encode_many(Tensor[] grads, Tensor(a!)[]? residuals, int[] cols, Tensor[]? scales=None, "
      "bool[]? by_rows=None) -> (Tensor[], Tensor[])",
      "onebit_decode_sum_many(Tensor[] bits, Tensor[] scales, int[] n, int[] cols, int[] dtypes, float scale, "
      "Tensor(a!)?[] outs, bool[]? by_rows=None) -> Tensor[]",
      "onebit_encode_columns_many(Tensor[] fulls, Tensor(a!)[]? residuals, int[] full_cols, int[] col0, "
      "int[] col1, Tensor[]? scales=None) -> (Tensor[], Tensor[])",
      "onebit_decode_columns_many(Tensor[] bits, Tensor[] scales, Tensor(a!)[] outs, int[] full_cols, "
      "int[] col0, int[] col1) -> ()",
  };
  return s;
}

inline const std::vector<const char*>& qsgd_schemas() {
  static const std::vector<const char*> s = {
      "qsgd_encode_fixed(Tensor x, int s, int bucket, bool max_norm, int key) -> (Tensor, Tensor)",
      "qsgd_decode_fixed(Tensor norms, Tensor packed, int n, int s, int bucket, ScalarType dtype, "
      "float scale=1.0, Tensor(a!)? out=None) -> Tensor",
      "qsgd_encode_elias(Tensor x, int s, int bucket, bool max_norm, int key, int group_buckets) "
      "-> (Tensor, Tensor, Tensor)",
      "qsgd_decode_elias(Tensor norms, Tensor nbits, Tensor stream, int n, int s, int bucket, "
      "int group_buckets, ScalarType dtype, Tensor(a!)? out=None) -> Tensor",
      "qsgd_encode_fixed_many(Tensor[] xs, int s, int bucket, bool max_norm, int[] keys) -> (Tensor[], Tensor[])",
      "qsgd_decode_fixed_many(Tensor[] norms, Tensor[] packed, int[] n, int s, int bucket, int[] dtypes, "
      "float scale, Tensor(a!)?[] outs) -> Tensor[]",
      "qsgd_encode_elias_many(Tensor[] xs, int s, int bucket, bool max_norm, int[] keys, int group_buckets) "
      "-> (Tensor[], Tensor[], Tensor[])",
      "qsgd_decode_elias_many(Tensor[] norms, int[] norms_counts, Tensor[] nbits, int[] nbits_counts, "
      "Tensor[] streams, int[] streams_counts, int[] n, int s, int bucket, int group_buckets, int[] dtypes, "
      "float scale, Tensor(a!)?[] outs) -> Tensor[]",
  };
  return s;
}

inline const std::vector<const char*>& dgc_schemas() {
  static const std::vector<const char*> s = {
      "dgc_select(Tensor x, int k, int sample_count, int key) -> (Tensor, Tensor, float, int)",
      "dgc_scatter_sum(Tensor[] indices, Tensor[] values, int n, ScalarType dtype, float scale=1.0, "
      "Tensor(a!)? out=None) -> Tensor",
      "dgc_index_encode(Tensor indices, int n) -> Tensor",
      "dgc_index_decode(Tensor code, int count, int n) -> Tensor",
      "dgc_accumulate(Tensor(a!) u, Tensor(b!) v, Tensor g, float momentum, bool nesterov, float coef=1.0) -> ()",
      "dgc_scatter_sum_many(Tensor[] indices, int[] indices_counts, Tensor[] values, int[] values_counts, "
      "int[] n, int[] dtypes, float scale, Tensor(a!)?[] outs) -> Tensor[]",
      "dgc_decode_sum_many(Tensor[] codes, int[] codes_counts, Tensor[] values, int[] values_counts, int[] n, "
      "int[] dtypes, float scale, Tensor(a!)?[] outs) -> Tensor[]",
      "dgc_accumulate_many(Tensor(a!)[] u, Tensor(b!)[] v, Tensor[] g, float momentum, bool nesterov, "
      "float coef=1.0) -> ()",
      "dgc_mask_many(Tensor[] indices, Tensor(a!)[] v, Tensor(b!)[]? u=None) -> ()",
      "dgc_select_many(Tensor[] xs, int[] k, int[] sample_count, int[] keys) "
      "-> (Tensor[], Tensor[], float[], int[])",
      "dgc_index_encode_many(Tensor[] indices, int[] n) -> Tensor[]",
  };
  return s;
}

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
