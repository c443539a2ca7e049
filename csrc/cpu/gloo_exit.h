// References that outlive the Python interpreter, so that gloo's worker threads never release
// the last one (see horovod_gradcomp/ddp/gloo_exit.py for the abort this prevents).
#pragma once
#include <string>
#include <vector>

#include <torch/extension.h>

// Called during a backward pass: hold one more reference to the backward's stashed
// "context" (a contextvars.Context), replacing the one held before. The holder is never
// destroyed, so the last backward's context is released only after Python has finalized
// (where PyTorch skips the release). False when nothing is stashed (outside a backward, or a
// PyTorch that does not stash).
bool retain_backward_context();

// Hold a C++ reference to each tensor until the process ends. A tensor's Python object is
// released whenever its C++ reference count drops from 2 to 1; with this extra owner, a gloo
// worker's release of a finished collective's tensors is never that drop.
void keep_until_exit(const std::vector<at::Tensor>& tensors);

// Hold a C++ reference to each tensor under `slot`, releasing (here, on the calling thread) the
// tensors held there before: keep_until_exit for what a job repeats (a checkpoint's gather),
// whose memory must not pile up. The slot's last tensors are held until the process ends.
void hold_latest(const std::string& slot, const std::vector<at::Tensor>& tensors);

// Binds the three functions above into the Python module `m` under their own names.
void bind_gloo_exit(pybind11::module_& m);
