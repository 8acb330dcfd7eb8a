#include "engine/timeline.h"

#include <unistd.h>

#include <cstring>
#include <sstream>

#include "engine/output_file.h"

namespace hpcdl {

namespace {
constexpr const char* kTail = "\n]\n";
constexpr size_t kFlushBytes = 1 << 16;
constexpr auto kFlushInterval = std::chrono::milliseconds(500);

long long micros(Clock::time_point origin, Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin).count();
}
}  // namespace

std::string json_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

Timeline::~Timeline() { stop(); }

Status Timeline::start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ >= 0) {
    if (path == path_) return Status::ok();
    return Status::error(HPCDL_ERR_INVALID, "a timeline is already being written to " + path_ +
                                                "; call stop_timeline() before starting one at " + path);
  }
  int fd = -1;
  Status opened = open_output_file(path, "timeline", &fd);
  if (!opened.is_ok()) return opened;
  fd_ = fd;
  path_ = path;
  mark_cycles_ = mark_cycles;
  origin_ = Clock::now();
  last_flush_ = origin_;
  tracks_.clear();
  pending_.clear();
  first_event_ = true;
  end_offset_ = 0;
  std::string head = "[\n";
  if (::pwrite(fd_, head.data(), head.size(), 0) < 0) {}
  end_offset_ = static_cast<long long>(head.size());
  active_ = true;
  append("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"hpcdl engine (rank 0)\"}}");
  append("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"engine\"}}");
  write_out();
  return Status::ok();
}

void Timeline::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  write_out();
  ::close(fd_);
  fd_ = -1;
  active_ = false;
}

int Timeline::track(const std::string& tensor) {
  auto it = tracks_.find(tensor);
  if (it != tracks_.end()) return it->second;
  int tid = static_cast<int>(tracks_.size()) + 1;
  tracks_[tensor] = tid;
  append("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(tid) +
         ",\"args\":{\"name\":\"" + json_escape(tensor) + "\"}}");
  return tid;
}

void Timeline::append(const std::string& event) {
  if (!first_event_) pending_ += ",\n";
  first_event_ = false;
  pending_ += event;
}

void Timeline::span(const std::string& tensor, const char* phase, Clock::time_point begin,
                    Clock::time_point end, const std::string& args_json) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  if (begin < origin_) begin = origin_;
  if (end < begin) end = begin;
  int tid = track(tensor);
  std::ostringstream e;
  e << "{\"name\":\"" << phase << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << tid << ",\"ts\":" << micros(origin_, begin)
    << ",\"dur\":" << micros(begin, end) << ",\"args\":{" << args_json << "}}";
  append(e.str());
}

void Timeline::instant(const char* name, Clock::time_point at, const std::string& args_json) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  if (at < origin_) at = origin_;
  std::ostringstream e;
  e << "{\"name\":\"" << name << "\",\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":0,\"ts\":" << micros(origin_, at)
    << ",\"args\":{" << args_json << "}}";
  append(e.str());
}

void Timeline::flush(bool force) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0 || pending_.empty()) return;
  auto now = Clock::now();
  if (!force && pending_.size() < kFlushBytes && now - last_flush_ < kFlushInterval) return;
  write_out();
}

bool Timeline::has_pending() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fd_ >= 0 && !pending_.empty();
}

void Timeline::write_out() {
  if (fd_ < 0) return;
  last_flush_ = Clock::now();
  if (pending_.empty()) return;
  std::string chunk = pending_ + kTail;
  // One pwrite replaces the old closing bracket with the new events and a new closing bracket.
  ssize_t written = ::pwrite(fd_, chunk.data(), chunk.size(), end_offset_);
  if (written == static_cast<ssize_t>(chunk.size())) {
    end_offset_ += static_cast<long long>(pending_.size());
    pending_.clear();
  }
}

}  // namespace hpcdl
