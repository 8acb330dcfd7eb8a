// Which operation handles are still pending, for handles given out in increasing order: one bit per handle
// from the oldest pending one on. Finishing an operation sets a bit in a word that the step's other
// operations share, where a set of pending names would touch each name's own (cold) node.
#pragma once

#include <cstdint>
#include <deque>

namespace hpcdl {

class PendingIds {
 public:
  // `first`: the first handle that will be added.
  explicit PendingIds(int64_t first) { finish_all(first); }

  // `id` is the next handle: one more than the previous one added.
  void add(int64_t id) {
    next_ = id + 1;
    while (static_cast<size_t>((id - base_) / 64) >= finished_.size()) finished_.push_back(0);
  }
  void finish(int64_t id) {
    if (id < base_ || id >= next_) return;
    const int64_t offset = id - base_;
    finished_[static_cast<size_t>(offset / 64)] |= uint64_t{1} << (offset % 64);
    while (!finished_.empty() && finished_.front() == ~uint64_t{0}) {
      finished_.pop_front();
      base_ += 64;
    }
  }
  bool pending(int64_t id) const {
    if (id < base_ || id >= next_) return false;
    const int64_t offset = id - base_;
    return (finished_[static_cast<size_t>(offset / 64)] >> (offset % 64) & 1) == 0;
  }
  // Every handle below `next` finished.
  void finish_all(int64_t next) {
    finished_.clear();
    next_ = next;
    base_ = next - next % 64;
    if (next % 64 != 0) finished_.push_back((uint64_t{1} << (next % 64)) - 1);
  }

 private:
  int64_t base_ = 0;               // a multiple of 64; every handle below it finished
  int64_t next_ = 0;               // one more than the last handle added
  std::deque<uint64_t> finished_;  // bit i of word w: handle base_ + 64 * w + i finished
};

}  // namespace hpcdl
