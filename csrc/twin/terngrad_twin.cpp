// Twin build of the terngrad device path: its device source and its torch ops (HGC_TWIN).
#include "../device/terngrad_device.cu"
#include "../device/terngrad_ops.cpp"
