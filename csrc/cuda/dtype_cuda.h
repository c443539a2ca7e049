// Element types the CUDA launchers take (plain C++: no PyTorch, no CUDA headers needed).
#pragma once

namespace hgc_cuda {

// Element types of gradients and outputs.
enum class DType : int { kHalf = 0, kBFloat16 = 1, kFloat = 2, kDouble = 3 };

}  // namespace hgc_cuda
