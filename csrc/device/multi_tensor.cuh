// Many tensors per device algorithm call: the idea of Apex's multi-tensor apply, on Thrust.
//
// A codec's single-tensor launcher runs a fixed sequence of stages, each a for_each of one
// functor over [0, count). A bucket's launcher runs the same sequence once for all of its
// tensors: a Stage<F> collects one functor (with its own pointers and sizes) and one count per
// tensor, and runs as one for_each over [0, sum of counts) of MultiFor<F>, which finds each
// index's tensor by binary search over the prefix counts and calls that tensor's functor with
// the index inside its tensor. So every tensor's values are computed by the very functor, and
// in the very order, of its single-tensor launch: the results are bitwise the same.
//
// The stages' tables (functors and prefix counts), and any other per-tensor table a launcher's
// algorithms read (descriptors of segmented reductions, sorts, compactions: TableSet::add), are
// built on the host and reach device memory in one copy per launcher call (TableSet::upload); in
// the twin that copy is a memcpy. A bucket holding several dtypes keeps one set of stages per
// storage type (PerDtype), each run in DType order.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "../host_device.h"
#include "exec.cuh"

namespace hgc_dev {

// One stage over many tensors: index i of the whole range runs table[t](i - start[t]) for the t
// with start[t] <= i < start[t + 1] (tensors with a count of 0 own no index).
template <typename F> struct MultiFor {
  const F* table;
  const int64_t* start;  // tensors + 1 prefix counts, start[0] == 0
  int64_t tensors;
  HGC_HOST_DEVICE void operator()(int64_t i) const {
    int64_t lo = 0, hi = tensors;  // start[lo] <= i < start[hi]
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (start[mid] <= i) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    table[lo](i - start[lo]);
  }
};

// The host side of a stage: each tensor's functor and index count, in tensor order.
template <typename F> class Stage {
  static_assert(std::is_trivially_copyable<F>::value, "a stage's functors are copied to device memory as bytes");

 public:
  Stage() : start_{0} {}
  void add(const F& f, int64_t count) {
    fns_.push_back(f);
    start_.push_back(start_.back() + (count > 0 ? count : 0));
  }
  int64_t total() const { return start_.back(); }
  int64_t tensors() const { return static_cast<int64_t>(fns_.size()); }

 private:
  friend class TableSet;
  std::vector<F> fns_;
  std::vector<int64_t> start_;
  std::size_t fn_offset_ = 0, start_offset_ = 0;
};

// The tables of one launcher call's stages: put() every stage, upload() once, then run() them in
// order. Each run is one device algorithm call (none for a stage without indices).
class TableSet {
 public:
  explicit TableSet(Exec& ex) : ex_(ex) {}

  template <typename F> void put(Stage<F>& s) {
    s.fn_offset_ = append(s.fns_.data(), s.fns_.size() * sizeof(F));
    s.start_offset_ = append(s.start_.data(), s.start_.size() * sizeof(int64_t));
  }

  // Copies every table put so far to device memory (one copy), freed with this object.
  void upload() {
    device_.reset(new Scratch<unsigned char>(ex_, static_cast<int64_t>(host_.size())));
    ex_.to_device(device_->get(), host_.data(), host_.size());
  }

  // Any other table (per-tensor descriptors read by algorithms other than run()): its offset in
  // the upload, for at<T>() once uploaded.
  template <typename T> std::size_t add(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable<T>::value, "tables are copied to device memory as bytes");
    static_assert(alignof(T) <= kAlign, "tables are aligned to kAlign");
    return append(v.data(), v.size() * sizeof(T));
  }

  // Device pointers, valid after upload(): a table added at `offset`; a put() stage's functors
  // and its tensors() + 1 prefix counts.
  template <typename T> const T* at(std::size_t offset) const {
    return reinterpret_cast<const T*>(device_->get() + offset);
  }
  template <typename F> const F* items(const Stage<F>& s) const { return at<F>(s.fn_offset_); }
  template <typename F> const int64_t* starts(const Stage<F>& s) const { return at<int64_t>(s.start_offset_); }

  template <typename F> void run(const Stage<F>& s) {
    if (s.total() == 0) return;
    ex_.for_each_index(s.total(), MultiFor<F>{items(s), starts(s), s.tensors()});
  }

 private:
  static constexpr std::size_t kAlign = 16;  // >= the alignment of every functor and of int64_t

  std::size_t append(const void* src, std::size_t bytes) {
    const std::size_t at = (host_.size() + kAlign - 1) / kAlign * kAlign;
    host_.resize(at + bytes);
    if (bytes) std::memcpy(host_.data() + at, src, bytes);
    return at;
  }

  Exec& ex_;
  std::vector<unsigned char> host_;
  std::unique_ptr<Scratch<unsigned char>> device_;
};

// One Set<T> of a launcher's stages for each storage type (half_t, bf16_t, float, double): the
// per-dtype stage sets of a bucket that mixes dtypes. A bucket's absent dtypes leave theirs empty
// (no call). The constructor's arguments go to every Set<T>. In an unnamed namespace, as the
// codecs' Set templates are in theirs (one launcher file's types: no linkage across files).
namespace {
template <template <typename> class Set> struct PerDtype {
  Set<half_t> h;
  Set<bf16_t> b;
  Set<float> f;
  Set<double> d;
  template <typename... Args> explicit PerDtype(const Args&... args) : h(args...), b(args...), f(args...), d(args...) {}
  template <typename T> Set<T>& get() {
    if constexpr (std::is_same<T, half_t>::value) {
      return h;
    } else if constexpr (std::is_same<T, bf16_t>::value) {
      return b;
    } else if constexpr (std::is_same<T, float>::value) {
      return f;
    } else {
      static_assert(std::is_same<T, double>::value, "a storage type");
      return d;
    }
  }
  // fn(Set<T>&) for every storage type, in DType order (the order their stages are put and run).
  template <typename Fn> void each(Fn&& fn) {
    fn(h);
    fn(b);
    fn(f);
    fn(d);
  }
};

// fn(Set<T>&, const T* x) with T the storage type of `dtype` (x: a tensor's data, or null).
template <template <typename> class Set, typename Fn>
void with_dtype(PerDtype<Set>& sets, DType dtype, const void* x, Fn&& fn) {
  dispatch_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    fn(sets.template get<T>(), static_cast<const T*>(x));
  });
}
}  // namespace

}  // namespace hgc_dev
