// Many tensors per device algorithm call: the idea of Apex's multi-tensor apply, on Thrust.
//
// A codec's single-tensor launcher runs a fixed sequence of stages, each a for_each of one
// functor over [0, count). A bucket's launcher runs the same sequence once for all of its
// tensors: a Stage<F> collects one functor (with its own pointers and sizes) and one count per
// tensor, and runs as one for_each of MultiFor<F> over a chunk table built once on the host: each
// tensor's indices cut into chunks of one power-of-two size C (chosen per stage), a position p of
// the for_each belongs to chunk p >> log2(C), element p & (C - 1) of it, and the chunk names its
// tensor and first index there (no search). So every tensor's values are computed by the very
// functor, with the very per-tensor indices, of its single-tensor launch: the results are bitwise
// the same. The mapping's own arithmetic is 32-bit when the stage's padded position count fits
// (checked on the host when the stage is put), 64-bit otherwise.
//
// Segmented algorithms over a stage's tensors (DGC's scans by tensor) walk the same padded
// positions through the chunk table (ChunkMap, chunk_map.h), so they search for nothing either.
//
// The stages' tables (functors, chunks, padded prefix counts), and any other per-tensor table a
// launcher's algorithms read (descriptors of segmented reductions, sorts, compactions:
// TableSet::add), are built on the host and reach device memory in one copy per launcher call
// (TableSet::upload); in the twin that copy is a memcpy. A bucket holding several dtypes keeps one
// set of stages per storage type (PerDtype), each run in DType order.
#pragma once

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../host_device.h"
#include "chunk_map.h"
#include "exec.cuh"

namespace hgc_dev {

// One stage over many tensors: position p of [0, chunks * C) runs
// table[c.tensor](c.first + (p & mask)) for its chunk c = chunk[p >> shift], when that element is
// inside the chunk (p & mask < c.len; the padding of a tensor's last chunk does nothing).
//
// One position per element, not one thread per chunk looping over its C elements: consecutive
// positions are consecutive indices of one tensor, so a GPU warp's threads read consecutive
// values as in the single-tensor launch (coalesced), all threads of a block read the same one or
// two chunk entries (one cached load each), and every index stays one functor call of its own, so
// the stages whose functor loops (a bucket's norm, an Elias group) keep their parallelism.
template <typename F, typename I> struct MultiFor {
  const F* table;
  const Chunk<I>* chunk;
  int shift;
  I mask;
  HGC_HOST_DEVICE void operator()(I p) const {
    const Chunk<I> c = chunk[p >> shift];
    const I e = p & mask;
    if (e < c.len) table[c.tensor](static_cast<int64_t>(c.first + e));
  }
};

// The chunking of one stage, decided on the host: chunks of 2^log2 indices, 32-bit mapping when
// narrow.
struct ChunkPlan {
  int log2 = 0;
  int64_t chunks = 0;
  bool narrow = false;
  int64_t positions() const { return chunks << log2; }
};

// The largest chunk size of a stage, as log2 (chunks of at most 2^16 indices, as Apex's): the
// largest power of two that pads the stage's positions by at most an eighth of its indices (each
// tensor's last chunk is padded up to C). With T tensors that keeps C above total / (16 T), so the
// table holds fewer than 17 T + total / 2^16 chunks; a stage of one index per tensor gets C = 1.
inline int chunk_log2(const std::vector<int64_t>& start) {
  constexpr int kMaxLog2 = 16;
  const int64_t total = start.back();
  for (int k = kMaxLog2; k > 0; --k) {
    const int64_t mask = (int64_t(1) << k) - 1;
    int64_t pad = 0;
    for (std::size_t t = 0; t + 1 < start.size() && pad <= total / 8; ++t) {
      pad += (-(start[t + 1] - start[t])) & mask;  // up to the next multiple of C (0 for count 0)
    }
    if (pad <= total / 8) return k;
  }
  return 0;
}

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
  // After TableSet::put: the stage's positions (its chunks, padded: run()'s for_each and the
  // ChunkMap's range) and tensor t's first position among them (t = tensors(): all of them).
  int64_t positions() const { return plan_.positions(); }
  int64_t padded_start(int64_t t) const { return padded_[static_cast<std::size_t>(t)]; }

 private:
  friend class TableSet;
  std::vector<F> fns_;
  std::vector<int64_t> start_;
  std::vector<int64_t> padded_;
  ChunkPlan plan_;
  std::size_t fn_offset_ = 0, start_offset_ = 0, chunk_offset_ = 0;
};

// The tables of one launcher call's stages: put() every stage, upload() once, then run() them in
// order. Each run is one device algorithm call (none for a stage without indices).
class TableSet {
 public:
  explicit TableSet(Exec& ex) : ex_(ex) {}

  // Appends the stage's functors, padded prefix counts and chunk table (its chunk size and index
  // width decided here, once: 32-bit when its padded positions and tensor count are at most
  // index32_limit()).
  template <typename F> void put(Stage<F>& s) {
    s.fn_offset_ = append(s.fns_.data(), s.fns_.size() * sizeof(F));
    ChunkPlan& plan = s.plan_;
    plan.log2 = chunk_log2(s.start_);
    const int64_t C = int64_t(1) << plan.log2;
    plan.chunks = 0;
    s.padded_.assign(1, 0);
    for (std::size_t t = 0; t + 1 < s.start_.size(); ++t) {
      plan.chunks += (s.start_[t + 1] - s.start_[t] + C - 1) / C;
      s.padded_.push_back(plan.chunks << plan.log2);
    }
    s.start_offset_ = append(s.padded_.data(), s.padded_.size() * sizeof(int64_t));
    const int64_t limit = index32_limit();
    plan.narrow = plan.positions() <= limit && s.tensors() <= limit;
    s.chunk_offset_ = plan.narrow ? append_chunks<uint32_t>(s.start_, plan) : append_chunks<int64_t>(s.start_, plan);
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

  // Device pointers, valid after upload(): a table added at `offset`; a put() stage's functors,
  // its tensors() + 1 padded prefix counts (Stage::padded_start's, in device memory) and its chunk
  // table as a ChunkMap (read by DGC's segmented algorithms over the stage's positions()).
  template <typename T> const T* at(std::size_t offset) const {
    return reinterpret_cast<const T*>(device_->get() + offset);
  }
  template <typename F> const F* items(const Stage<F>& s) const { return at<F>(s.fn_offset_); }
  template <typename F> const int64_t* padded_starts(const Stage<F>& s) const { return at<int64_t>(s.start_offset_); }
  template <typename F> ChunkMap map(const Stage<F>& s) const {
    return ChunkMap{device_->get() + s.chunk_offset_, s.plan_.log2, s.plan_.narrow};
  }

  // The stage as one for_each over its chunks' positions (int32 positions when it is narrow).
  template <typename F> void run(const Stage<F>& s) {
    if (s.total() == 0) return;
    const ChunkPlan& plan = s.plan_;
    if (plan.narrow) {
      detail::narrow_stage_counter().fetch_add(1, std::memory_order_relaxed);
      const MultiFor<F, uint32_t> f{items(s), at<Chunk<uint32_t>>(s.chunk_offset_), plan.log2,
                                    static_cast<uint32_t>((uint64_t(1) << plan.log2) - 1)};
      thrust::for_each_n(ex_.policy(), thrust::counting_iterator<uint32_t>(0),
                         static_cast<int32_t>(plan.positions()), f);
    } else {
      detail::wide_stage_counter().fetch_add(1, std::memory_order_relaxed);
      const MultiFor<F, int64_t> f{items(s), at<Chunk<int64_t>>(s.chunk_offset_), plan.log2,
                                   (int64_t(1) << plan.log2) - 1};
      thrust::for_each_n(ex_.policy(), thrust::counting_iterator<int64_t>(0), plan.positions(), f);
    }
  }

 private:
  static constexpr std::size_t kAlign = 16;  // >= the alignment of every functor and of int64_t

  std::size_t append(const void* src, std::size_t bytes) {
    const std::size_t at = (host_.size() + kAlign - 1) / kAlign * kAlign;
    host_.resize(at + bytes);
    if (bytes) std::memcpy(host_.data() + at, src, bytes);
    return at;
  }

  // The chunk table of a stage with prefix counts `start` (tensors without indices own none).
  template <typename I> std::size_t append_chunks(const std::vector<int64_t>& start, const ChunkPlan& plan) {
    const int64_t C = int64_t(1) << plan.log2;
    std::vector<Chunk<I>> chunks;
    chunks.reserve(static_cast<std::size_t>(plan.chunks));
    for (std::size_t t = 0; t + 1 < start.size(); ++t) {
      const int64_t count = start[t + 1] - start[t];
      for (int64_t first = 0; first < count; first += C) {
        chunks.push_back(Chunk<I>{static_cast<I>(t), static_cast<I>(first), static_cast<I>(count - first < C ? count - first : C)});
      }
    }
    return append(chunks.data(), chunks.size() * sizeof(Chunk<I>));
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
