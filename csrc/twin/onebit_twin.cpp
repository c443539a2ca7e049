// Twin build of the onebit device path: its device source and its torch ops (HGC_TWIN).
#include "../device/onebit_device.cu"
#include "../device/onebit_ops.cpp"
