// How a rank waits for its peers: spin briefly (a peer in step is microseconds away), yield the core a few
// times (a peer sharing the core, when ranks outnumber cores, runs at once), then sleep on a futex until a
// peer's publish wakes it or a short timeout passes (checking that the peers are still alive). A waiter
// holds a core that another rank or another thread of the host needs (a data loader, a framework's own
// thread) for no longer than spin + yield. Every wait ends at its deadline.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>

#include "comm.h"

namespace hpcdl {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Futex on a 32-bit word in memory shared between processes. timeout_ns <= 0 returns at once.
void futex_wait_shared(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);
void futex_wake_shared(std::atomic<uint32_t>* word);

// Whether the process `pid` on this host still runs (false for exited and zombie processes).
bool process_alive(int pid);

struct WaitPolicy {
  std::chrono::microseconds spin{20};
  std::chrono::microseconds yield{50};
};

}  // namespace hpcdl
