// Torch ops of the qsgd device path (see ops_common.h): being ported from csrc/cuda/.
#include "ops_common.h"
#include "registry.h"

namespace hgc_dev {
#if defined(HGC_TWIN)
namespace {
void register_qsgd_ops(pybind11::module& m) { (void)m; }
const Registrar registrar("qsgd", &register_qsgd_ops);
}  // namespace
#endif
}  // namespace hgc_dev
