// Twin build of the qsgd device path: its device source and its torch ops (HGC_TWIN).
#include "../device/qsgd_device.cu"
#include "../device/qsgd_ops.cpp"
