// A buffer that the point-to-point algorithms address by byte offset, laid over one or more areas of memory
// one after another. A contiguous buffer is one area; an engine batch is its tensors, each an area, so that
// a fused allreduce across hosts (the TCP ring, and the shared-memory stages of the hierarchical path) is
// sent from and received into the tensors themselves. The engine then fuses tensors of every size there,
// where it used to copy small ones into its fusion buffer and back and run each large one as a collective
// of its own (benchmarks/README.md, "Fused batches across hosts").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "comm.h"

namespace hpcdl {

class Areas {
 public:
  Areas() = default;
  Areas(const void* data, size_t bytes) { add(data, bytes); }
  // Appends `bytes` at `data` after the areas already there (empty areas are left out).
  void add(const void* data, size_t bytes) {
    if (bytes == 0) return;
    base_.push_back(static_cast<char*>(const_cast<void*>(data)));
    start_.push_back(start_.back() + bytes);
  }
  size_t bytes() const { return start_.back(); }
  // Bytes [at, at + len) as a buffer of their own.
  Areas window(size_t at, size_t len) const {
    Areas w;
    each(at, len, [&](char* data, size_t, size_t n) { w.add(data, n); });
    return w;
  }
  // Copies the whole buffer into `into` (its bytes one after another) / from `from` into the buffer.
  void pack(char* into) const {
    each(0, bytes(), [&](char* data, size_t rel, size_t len) { std::memcpy(into + rel, data, len); });
  }
  void unpack(const char* from) const {
    each(0, bytes(), [&](char* data, size_t rel, size_t len) { std::memcpy(data, from + rel, len); });
  }
  // Calls visit(data, offset from `at`, length) for each contiguous piece of bytes [at, at + len), in order.
  template <class Visit>
  void each(size_t at, size_t len, Visit visit) const {
    if (len == 0) return;
    size_t i = size_t(std::upper_bound(start_.begin(), start_.end(), at) - start_.begin()) - 1;
    for (size_t done = 0; done < len; ++i) {
      const size_t within = at + done - start_[i];
      const size_t piece = std::min(len - done, start_[i + 1] - start_[i] - within);
      visit(base_[i] + within, done, piece);
      done += piece;
    }
  }

 private:
  std::vector<char*> base_;
  std::vector<size_t> start_{0};  // start_[i]: offset of area i; the last entry is the total
};

// The inputs and the outputs of an allreduce's segments (see Comm::allreduce_segments), each as one buffer.
inline std::pair<Areas, Areas> segment_areas(const std::vector<Segment>& segments, size_t element_bytes) {
  std::pair<Areas, Areas> both;
  for (const Segment& s : segments) {
    both.first.add(s.send, size_t(s.count) * element_bytes);
    both.second.add(s.recv, size_t(s.count) * element_bytes);
  }
  return both;
}

// A buffer in one area, with Areas' interface and no allocation: for code written once over both (templates),
// whose contiguous callers must not pay for building an Areas on every call.
struct OneArea {
  char* base;
  template <class Visit>
  void each(size_t at, size_t len, Visit visit) const {
    if (len > 0) visit(base + at, size_t(0), len);
  }
};

// Walks bytes [a_at, a_at + len) of `a` and [b_at, b_at + len) of `b` (each an Areas or a OneArea) together:
// visit(piece of a, piece of b, offset from the start, length) for each piece contiguous in both.
template <class A, class B, class Visit>
void each_pair(const A& a, size_t a_at, const B& b, size_t b_at, size_t len, Visit visit) {
  a.each(a_at, len, [&](char* pa, size_t rel, size_t n) {
    b.each(b_at + rel, n, [&](char* pb, size_t sub, size_t m) { visit(pa + sub, pb, rel + sub, m); });
  });
}

}  // namespace hpcdl
