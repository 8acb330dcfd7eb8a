// How a rank waits for its peers: spin briefly (a peer in step is microseconds away), yield the core a few
// times (a peer sharing the core, when ranks outnumber cores, runs at once), then sleep on a futex until a
// peer's publish wakes it or a short timeout passes (checking that the peers are still alive). A waiter
// holds a core that another rank or another thread of the host needs (a data loader, a framework's own
// thread) for no longer than spin + yield. Every wait ends at its deadline.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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

// Whether a rank waiting on its sockets polls them for a short window before it sleeps in poll(). A sleep
// costs a wake-up (tens of microseconds in a VM, where an idle vCPU halts): on idle cores polling answers a
// 4-byte allreduce between two hosts in 8-10 us instead of 41-53 us. But a poller keeps a core, and where
// ranks share cores with each other or with other work, a sleeper is woken ahead of the busy thread while a
// poller waits for its turn: there a fixed poll made the same call 2-2.5 times slower. So:
// - a poll during which the thread lost its core (a gap between two looks) makes the next waits sleep at
//   once, twice as many after each such poll in a row, up to kMaxBackoff;
// - a poll that saw no bytes in its window, on a core it kept, backs off the same way but only up to
//   kMaxLateBackoff waits: the peer may just have been asleep (its wake-up made the answer late), and two
//   ranks that both backed off get back to polling only when both poll in the same exchange, which frequent
//   polls make likely (with no such cap, both ranks could stay asleep, about 47 us a call, for good);
// - a poll that got its bytes in time ends the backoff.
// Measurements: benchmarks/README.md.
class SocketSpin {
 public:
  enum class Outcome { kInTime, kLate, kPreempted };
  static constexpr int kMaxBackoff = 1024;    // waits that sleep at once after many lost cores in a row
  static constexpr int kMaxLateBackoff = 8;  // after many late answers in a row
  // A gap this long between two looks at the sockets means the poller was descheduled.
  static constexpr std::chrono::microseconds kPreempted{20};

  explicit SocketSpin(std::chrono::microseconds window = std::chrono::microseconds(0)) : window_(window) {}
  std::chrono::microseconds window() const { return window_; }
  // Whether this wait polls first (counts the waits of a backoff).
  bool poll_first() {
    if (window_.count() <= 0) return false;
    if (skip_ > 0) {
      --skip_;
      return false;
    }
    return true;
  }
  void ended(Outcome outcome) {
    switch (outcome) {
      case Outcome::kInTime:
        backoff_ = 0;
        break;
      case Outcome::kLate:
        backoff_ = std::min(std::max(1, backoff_ * 2), std::max(backoff_, kMaxLateBackoff));
        skip_ = backoff_;
        break;
      case Outcome::kPreempted:
        backoff_ = backoff_ == 0 ? 1 : std::min(kMaxBackoff, backoff_ * 2);
        skip_ = backoff_;
        break;
    }
  }

 private:
  std::chrono::microseconds window_;
  int backoff_ = 0, skip_ = 0;
};

// The engine's doorbell rung late (Comm::ring_if_late), as the transports that can do it do it: a cycle
// arms it; the transport's wait rings the peers when it is due, and at the latest before the wait sleeps
// (a sleeper cannot ring later); a wait that ends first drops it, since every peer took part unrung. A
// peer in step then joins the cycle without its engine thread being woken to contend with the caller that
// runs the cycle on the direct path.
class LateRing {
 public:
  void arm(uint32_t cycle, std::chrono::nanoseconds after) {
    armed_ = true;
    cycle_ = cycle;
    at_ = Clock::now() + after;
  }
  void drop() { armed_ = false; }
  // Rings `comm`'s peers for the armed cycle when it is due at `now` (Clock::time_point::max(): at once).
  void ring_if_due(Comm& comm, Clock::time_point now) {
    if (!armed_ || now < at_) return;
    armed_ = false;
    comm.notify_peers(cycle_);
  }

 private:
  bool armed_ = false;
  uint32_t cycle_ = 0;
  Clock::time_point at_;
};

struct WaitPolicy {
  std::chrono::microseconds spin{20};
  std::chrono::microseconds yield{50};
};

}  // namespace hpcdl
