// Twin build of the dgc device path: its device source and its torch ops (HGC_TWIN).
#include "../device/dgc_device.cu"
#include "../device/dgc_ops.cpp"
