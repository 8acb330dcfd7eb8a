#include "engine/python_stacks.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>
#include <vector>

namespace hpcdl {

namespace {

// A dump's threads: each block starts with "Thread 0x..." or "Current thread 0x..." and ends before the
// next one (faulthandler separates them with a blank line).
std::vector<std::string> thread_blocks(const std::string& text) {
  std::vector<std::string> blocks;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Thread 0x", 0) == 0 || line.rfind("Current thread 0x", 0) == 0) blocks.emplace_back();
    if (blocks.empty() || line.empty()) continue;
    blocks.back() += line + "\n";
  }
  return blocks;
}

bool names_thread(const std::string& block, const std::string& thread) {
  const size_t end = block.find('\n');
  return !thread.empty() && block.substr(0, end).find("hread " + thread + " ") != std::string::npos;
}

}  // namespace

void PythonStacks::configure(int fd, int signal, std::string main_thread) {
  std::lock_guard<std::mutex> lock(mutex_);
  fd_ = fd;
  signal_ = signal;
  main_ = std::move(main_thread);
}

std::string PythonStacks::dump() {
  if (!available() || ftruncate(fd_, 0) != 0) return "";
  // raise() delivers to this thread and returns once the handler has written the dump.
  if (raise(signal_) != 0) return "";
  struct stat info;
  if (fstat(fd_, &info) != 0 || info.st_size <= 0) return "";
  std::string text(static_cast<size_t>(info.st_size), '\0');
  const ssize_t n = pread(fd_, &text[0], text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

std::string PythonStacks::all_threads() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out, others;
  for (const std::string& block : thread_blocks(dump())) (names_thread(block, main_) ? out : others) += block + "\n";
  return out + others;
}

std::string PythonStacks::main_thread(int max_frames) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::string& block : thread_blocks(dump())) {
    if (!names_thread(block, main_)) continue;
    std::istringstream in(block);
    std::string line, out;
    std::getline(in, line);  // the header
    int frames = 0;
    while (std::getline(in, line)) {
      if (frames++ == max_frames) {
        out += "      ...\n";
        break;
      }
      out += "    " + line + "\n";
    }
    return out.empty() ? "      (no Python frames)\n" : out;
  }
  return "";
}

}  // namespace hpcdl
