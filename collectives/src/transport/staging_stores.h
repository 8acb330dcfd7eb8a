// How a rank writes what its peers on the same host read next (the shared-memory staging buffers).
//
// Ordinary stores leave a staged chunk dirty in the writer's cache, and the reader pulls each line from
// there. That is cheap when the two cores share a last-level cache and several times slower when they do
// not: ranks on two sockets or dies, or vCPUs that a hypervisor placed apart. On one 2-vCPU VM a 2-rank
// 100 MB allreduce took 54 ms instead of 10 ms for minutes at a time. Streaming (non-temporal) stores send
// the chunk to memory, where the reader finds it at memory speed in both cases, but they cost about 1.7x
// when the cache is shared. Which kind wins depends on where the ranks run now, so `auto` measures: it
// times full chunks, now and then tries the other kind for a few chunks (more rarely while that kind keeps
// losing), and switches when the other kind is clearly faster. When the kind in use becomes much slower
// than it was at the last trial (the host moved the vCPUs), it tries the other kind at once.
//
// The ranks of a communicator feed their StagingStores the same chunk times (the slowest rank's, which the
// shared-memory transport passes through its control blocks), so they make the same choices. Each rank's
// own times, though close, crossed the thresholds at different chunks: one rank tried the other kind
// while its peer did not, and both then timed a mix. A rank that chooses differently is still correct:
// only how the writer stores its bytes changes, never which bytes.
#pragma once

#include <cstddef>

namespace hpcdl {

class StagingStores {
 public:
  enum class Mode { kAuto, kCached, kStreaming };

  // Chunks between trials of the other kind: short at first and after a switch, four times longer after
  // each trial the other kind lost, so a settled choice spends 5 chunks in 512 (1%) on trials.
  static constexpr int kFirstInterval = 8;
  static constexpr int kMaxInterval = 512;
  // A trial's first chunks find the staging buffers as the other kind left them (after streaming stores
  // none of their lines is cached; cached stores then pay a read for ownership of each): one chunk per
  // staging buffer, so the chunks after those two are the ones timed. Counting the cold ones made cached
  // stores lose trials they win by 40% once warm (2 MiB chunks: 0.29 ms against 0.21 ms).
  static constexpr int kTrialWarmup = 2;
  // A last warm-up chunk this many times slower than the current kind ends the trial as lost, so that where
  // the other kind is far slower a trial costs two chunks instead of five. Measured on a 2-vCPU VM: a
  // cached trial's second chunk took 3.6 to 8.5 times streaming's median where cached stores lose (no
  // shared cache), 0.6 to 1.9 times in the other trials; the first chunk overlaps both (1.0 to 4.2).
  static constexpr double kHopeless = 3.0;
  static constexpr int kTrialChunks = 3;  // a trial's cost is the median of this many chunks
  static constexpr int kRecent = 8;       // the current kind's cost is the median of this many chunks
  static constexpr double kSwitchBelow = 0.85;  // the other kind must be 15% faster to win
  // A current kind whose recent median exceeds this times its cost at the last trial is tried against the
  // other at once (the machine changed state); otherwise trials wait for the interval. When the vCPUs
  // come to share a cache, streaming stores become 1.35 to 1.6 times slower while cached ones become the
  // faster kind: a factor of 1.5 missed that change.
  static constexpr double kJump = 1.3;

  explicit StagingStores(Mode mode = Mode::kAuto) : mode_(mode) {}

  // "auto", "cached" or "streaming"; false for anything else.
  static bool parse(const char* text, Mode* mode);

  // The kind of store the next chunk uses.
  bool streaming() const {
    if (mode_ != Mode::kAuto) return mode_ == Mode::kStreaming;
    return trial_left_ > 0 ? !prefer_streaming_ : prefer_streaming_;
  }

  // Copies n bytes into a staging buffer with the kind of store the current chunk uses.
  void copy(void* dst, const void* src, size_t n) const;

  // Reports how long a full chunk took and whether it was staged with streaming stores; picks the kind for
  // the next one. The time may arrive after later chunks were staged (the shared-memory transport shares it
  // with the next chunk's step), so across a change of kind: a chunk of another kind than the one being
  // timed (the trial's during a trial, else the current one) says nothing about either and is not counted.
  void record_chunk(double seconds, bool streamed);

  int trials() const { return trials_; }  // trials of the other kind begun so far

 private:
  void end_trial();
  void keep_current(double current);  // the trial was lost: longer interval; `current` is the new reference

  Mode mode_;
  bool prefer_streaming_ = false;
  int trial_left_ = 0;
  int since_trial_ = 0;
  int interval_ = kFirstInterval;
  double trial_[kTrialChunks] = {};
  double recent_[kRecent] = {};
  int recent_count_ = 0, recent_next_ = 0;
  double settled_cost_ = 0;  // the current kind's median chunk time when the last trial ended
  int trials_ = 0;
};

// memcpy with ordinary stores. When source and destination start at different offsets within a 64-byte
// line (NumPy arrays start 16 bytes into one, staging buffers at its start), it stores whole aligned lines
// from unaligned loads: glibc's memcpy took about 3% longer over a fused 102 MB allreduce of such arrays.
void line_copy(void* dst, const void* src, size_t n);

// memcpy with non-temporal stores (a plain memcpy where the CPU has none, or below 4 KiB).
void stream_copy(void* dst, const void* src, size_t n);

}  // namespace hpcdl
