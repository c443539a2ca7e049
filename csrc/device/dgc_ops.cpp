// Torch ops of the dgc device path (see ops_common.h): being ported from csrc/cuda/.
#include "ops_common.h"
#include "registry.h"

namespace hgc_dev {
#if defined(HGC_TWIN)
namespace {
void register_dgc_ops(pybind11::module& m) { (void)m; }
const Registrar registrar("dgc", &register_dgc_ops);
}  // namespace
#endif
}  // namespace hgc_dev
