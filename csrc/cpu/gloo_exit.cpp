#include "gloo_exit.h"

#include <map>
#include <memory>
#include <mutex>

#include <ATen/ThreadLocalPythonObjects.h>

bool retain_backward_context() {
  // PyTorch (2.13) stashes contextvars.copy_context() under "context" for the duration of each
  // backward; every collective issued meanwhile copies the thread-local state, so a gloo worker
  // that frees a finished work can drop the last reference. That release takes the GIL, and a
  // thread taking the GIL while the interpreter finalizes is ended by pthread_exit, which
  // aborts in the work's noexcept destructor ("terminate called without an active exception").
  // A second owner here makes the workers' releases plain decrements. Leaked on purpose: a
  // static holder's destructor would run after finalization.
  static auto* held = new std::shared_ptr<c10::SafePyObject>();
  static constexpr const char* kKey = "context";
  if (!at::impl::ThreadLocalPythonObjects::contains(kKey)) return false;
  *held = at::impl::ThreadLocalPythonObjects::get(kKey);  // the previous one is released here, under the GIL
  return true;
}

void keep_until_exit(const std::vector<at::Tensor>& tensors) {
  static auto* mutex = new std::mutex();
  static auto* kept = new std::vector<at::Tensor>();  // leaked on purpose, as above
  std::lock_guard<std::mutex> lock(*mutex);
  kept->insert(kept->end(), tensors.begin(), tensors.end());
}

void hold_latest(const std::string& slot, const std::vector<at::Tensor>& tensors) {
  static auto* mutex = new std::mutex();
  static auto* held = new std::map<std::string, std::vector<at::Tensor>>();  // leaked on purpose, as above
  std::vector<at::Tensor> previous;
  {
    std::lock_guard<std::mutex> lock(*mutex);
    previous.swap((*held)[slot]);
    (*held)[slot] = tensors;
  }
  // `previous` is released here, by the caller's thread (which holds the GIL)
}

void bind_gloo_exit(pybind11::module_& m) {
  namespace py = pybind11;
  // Holds the GIL: replacing the held object releases the previous one.
  m.def("retain_backward_context", &retain_backward_context,
        "during a backward: keep its stashed context alive (see horovod_gradcomp/ddp/gloo_exit.py)");
  m.def("keep_until_exit", &keep_until_exit, "hold a C++ reference to each tensor until the process ends",
        py::arg("tensors"));
  m.def("hold_latest", &hold_latest,
        "hold a C++ reference to each tensor under slot, releasing the slot's previous ones", py::arg("slot"),
        py::arg("tensors"));
}
