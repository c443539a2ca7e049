// Compact coding of a DGC payload's ascending indices, CPU (see
// horovod_gradcomp/codecs/dgc.py, "Wire format").
#pragma once
#include <torch/extension.h>

// idx: 1-D int32 (n < 2^31) or int64, strictly increasing, in [0, n). Returns uint8[w * c]
// (c = idx.numel()) with the narrowest w that holds every gap:
//   w = 1 or 2: gap codes idx_j - idx_{j-1} - 1 (idx_{-1} = -1) as little-endian uint8 / uint16;
//   w = 4 (n < 2^31) or 8: the indices themselves, little-endian int32 / int64.
at::Tensor dgc_index_encode_cpu(const at::Tensor& idx, int64_t n);

// Inverse: the `count` indices of `code` (uint8, w * count bytes; w read from the length)
// as int32 (n < 2^31) or int64; raises unless they are strictly increasing and in [0, n).
at::Tensor dgc_index_decode_cpu(const at::Tensor& code, int64_t count, int64_t n);
