// The Python stacks of this rank, taken from inside the engine. hpcdl.common.stacks registered faulthandler
// for every thread on a real-time signal, writing into a file whose descriptor init hands over (options
// stack_fd, stack_signal, stack_thread). To take a dump the engine empties the file and raises the signal in
// its own thread: the handler is C code that needs no GIL, so a main thread stuck in C code holding the GIL
// still has its stack written. The dump is read back from the file.
#pragma once

#include <mutex>
#include <string>

namespace hpcdl {

class PythonStacks {
 public:
  // `main_thread`: the main thread as the dumps name it ("0x00007f..."). fd < 0: no stacks.
  void configure(int fd, int signal, std::string main_thread);
  bool available() const { return fd_ >= 0 && signal_ > 0; }
  // Every thread's stack, the main thread first; "" when no dump could be taken.
  std::string all_threads();
  // The main thread's frames, innermost first, at most `max_frames` of them, indented by six spaces; "" when
  // unavailable.
  std::string main_thread(int max_frames);

 private:
  std::string dump();

  std::mutex mutex_;  // one dump at a time
  int fd_ = -1, signal_ = 0;
  std::string main_;
};

}  // namespace hpcdl
