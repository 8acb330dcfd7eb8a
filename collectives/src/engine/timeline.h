// The engine's timeline: a Chrome trace (JSON array of trace events, readable by chrome://tracing and
// Perfetto) written by world rank 0. Each tensor name gets its own track; its operation shows as the
// phases NEGOTIATE (with the ranks in the order they became ready), QUEUE, MEMCPY_IN_FUSION_BUFFER, the
// collective (ALLREDUCE, ...) and MEMCPY_OUT_FUSION_BUFFER.
//
// The file is valid JSON after every flush: events are appended before a closing "]" that the next flush
// overwrites, so a trace survives the process being killed between flushes.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "comm.h"

namespace hpcdl {

class Timeline {
 public:
  ~Timeline();
  Status start(const std::string& path, bool mark_cycles);
  void stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }  // a hint; writes re-check
  bool mark_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // A complete event ("ph":"X") on the track of `tensor`. `args_json` is "" or a JSON object body
  // without braces (e.g. "\"bytes\":4").
  void span(const std::string& tensor, const char* phase, Clock::time_point begin, Clock::time_point end,
            const std::string& args_json = "");
  // An instant event on the engine's own track (cycle marks, stall warnings).
  void instant(const char* name, Clock::time_point at, const std::string& args_json = "");
  // Writes buffered events when enough accumulated or enough time passed (force: always).
  void flush(bool force);
  bool has_pending();

 private:
  int track(const std::string& tensor);  // caller holds mutex_
  void append(const std::string& event);
  void write_out();

  std::mutex mutex_;
  int fd_ = -1;
  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};
  std::string path_;
  Clock::time_point origin_;
  Clock::time_point last_flush_;
  std::string pending_;
  bool first_event_ = true;
  long long end_offset_ = 0;  // where the closing "]" starts
  std::map<std::string, int> tracks_;
};

std::string json_escape(const std::string& text);

}  // namespace hpcdl
