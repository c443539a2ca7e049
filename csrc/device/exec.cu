// The algorithm-call and host-synchronization counters of exec.cuh, and multi_tensor.cuh's
// 32-bit index limit and stage counters (one definition per build).
#include <limits>
#include <stdexcept>
#include <string>

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
std::atomic<int64_t>& narrow_stage_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}
std::atomic<int64_t>& wide_stage_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}
std::atomic<int64_t>& index32_limit_value() {
  static std::atomic<int64_t> limit{std::numeric_limits<int32_t>::max()};
  return limit;
}
}  // namespace detail

int64_t index32_limit() { return detail::index32_limit_value().load(std::memory_order_relaxed); }
int64_t set_index32_limit(int64_t limit) {
  if (limit < 0 || limit > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("hgc_dev: the 32-bit index limit must lie in [0, 2^31 - 1], got " +
                                std::to_string(limit));
  }
  return detail::index32_limit_value().exchange(limit, std::memory_order_relaxed);
}
int64_t narrow_stage_runs() { return detail::narrow_stage_counter().load(std::memory_order_relaxed); }
int64_t wide_stage_runs() { return detail::wide_stage_counter().load(std::memory_order_relaxed); }

int64_t algorithm_calls() { return detail::call_counter().load(std::memory_order_relaxed); }
int64_t host_syncs() { return detail::sync_counter().load(std::memory_order_relaxed); }
void count_host_sync() { detail::sync_counter().fetch_add(1, std::memory_order_relaxed); }

}  // namespace hgc_dev
