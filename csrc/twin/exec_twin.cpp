// Twin build of csrc/device/exec.cu (see csrc/device/exec.cuh).
#include "../device/exec.cu"
