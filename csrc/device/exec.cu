// The algorithm-call and host-synchronization counters of exec.cuh (one definition per build).
#include "exec.cuh"

namespace hgc_dev {
namespace detail {
std::atomic<int64_t>& call_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}
std::atomic<int64_t>& sync_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}
}  // namespace detail

int64_t algorithm_calls() { return detail::call_counter().load(std::memory_order_relaxed); }
int64_t host_syncs() { return detail::sync_counter().load(std::memory_order_relaxed); }
void count_host_sync() { detail::sync_counter().fetch_add(1, std::memory_order_relaxed); }

}  // namespace hgc_dev
