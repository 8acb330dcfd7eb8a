// Helpers of the check programs that run shared-memory ranks as forked child processes: one "ok"/"FAIL"
// line per check, a child whose status message comes back through a pipe, and the segment name passed
// from the maker to its members through pipes, as the runtime sends it through its bootstrap connection.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/shm_comm.h"

namespace forked_ranks {

inline int failures = 0;

inline void check(bool ok, const std::string& what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "ok" : "FAIL", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

inline hpcdl::Deadline in_seconds(double s) {
  return hpcdl::Clock::now() + std::chrono::milliseconds(int64_t(s * 1000));
}

inline bool write_text(int fd, const std::string& text) {
  const uint32_t len = uint32_t(text.size());
  return write(fd, &len, 4) == 4 && write(fd, text.data(), len) == ssize_t(len);
}

inline bool read_text(int fd, std::string* text) {
  uint32_t len = 0;
  if (read(fd, &len, 4) != 4 || len > 4096) return false;
  text->assign(len, '\0');
  return len == 0 || read(fd, &(*text)[0], len) == ssize_t(len);
}

// What one rank's attempt ended with: ok, its status message, or the signal that killed it.
struct Outcome {
  bool ok = false;
  std::string message;
  int signal = 0;
};

// A child process running one attempt; its status message comes back through a pipe.
struct Child {
  pid_t pid = -1;
  int result_fd = -1;
};

inline Child start(const std::function<hpcdl::Status()>& attempt) {
  int result[2];
  if (pipe(result) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(result[0]);
    hpcdl::Status st = attempt();
    write_text(result[1], (st.is_ok() ? "ok " : "error ") + st.message);
    _exit(0);
  }
  close(result[1]);
  return {pid, result[0]};
}

inline Outcome finish(const Child& child) {
  Outcome out;
  if (child.pid < 0) return {false, "fork or pipe failed", 0};
  std::string text;
  const bool got = read_text(child.result_fd, &text);
  close(child.result_fd);
  int status = 0;
  waitpid(child.pid, &status, 0);
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  if (got) {
    out.ok = text.rfind("ok ", 0) == 0;
    out.message = text.substr(text.find(' ') + 1);
  } else if (out.signal != 0) {
    out.message = std::string("killed by ") + strsignal(out.signal);
  }
  return out;
}

inline std::vector<int> ranks(int n) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i) r.push_back(i);
  return r;
}

// Rank `rank` of an `n`-rank communicator on this host; the maker (rank 0) writes the segment name to
// `name_out` (once per member), a member reads it from `name_in`. `before_send` lets a check tamper with
// the segment before the name goes out.
inline hpcdl::Status make_comm(int n, int rank, const hpcdl::ShmParams& params, int name_in, int name_out,
                               double seconds, std::shared_ptr<hpcdl::ShmComm>* comm,
                               const std::function<void(const std::string&)>& before_send = nullptr) {
  auto send = [&](int, const std::string& name) -> hpcdl::Status {
    if (before_send) before_send(name);
    return write_text(name_out, name) ? hpcdl::Status::ok() : hpcdl::Status::error(HPCDL_ERR_INTERNAL, "pipe closed");
  };
  auto recv = [&](int, std::string* name) -> hpcdl::Status {
    return read_text(name_in, name) ? hpcdl::Status::ok() : hpcdl::Status::error(HPCDL_ERR_INTERNAL, "pipe closed");
  };
  std::vector<int> pids(size_t(n), 0);
  pids[size_t(rank)] = int(getpid());
  return hpcdl::ShmComm::create(ranks(n), rank, pids, params, "test", in_seconds(seconds), send, recv, comm);
}

}  // namespace forked_ranks
