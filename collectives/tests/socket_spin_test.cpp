// Checks SocketSpin's policy against synthetic outcomes: polls in time keep polling; polls that lose the
// core back off exponentially up to kMaxBackoff, late polls on a kept core up to kMaxLateBackoff; one poll
// in time ends any backoff; a window of 0 never polls. Built and run by tests/unit/test_socket_spin.py;
// prints one "ok" or "FAIL ..." line per check.
#include <cstdio>

#include "transport/wait.h"

using hpcdl::SocketSpin;
using Outcome = hpcdl::SocketSpin::Outcome;

namespace {
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++failures;
}

// Runs `waits` waits whose polls end as `outcome(i)` says; returns how many of them polled.
template <class Outcomes>
int run(SocketSpin& spin, int waits, Outcomes outcome) {
  int polled = 0;
  for (int i = 0; i < waits; ++i) {
    if (!spin.poll_first()) continue;
    ++polled;
    spin.ended(outcome(i));
  }
  return polled;
}
}  // namespace

int main() {
  const std::chrono::microseconds window(30);
  {
    SocketSpin s(window);
    check(run(s, 1000, [](int) { return Outcome::kInTime; }) == 1000, "polls in time: every wait polls");
  }
  {
    SocketSpin s(window);
    // 1 + 2 + 4 + ... + 512 waits skipped after the first 10 lost cores, then 1024 each.
    const int polled = run(s, 10000, [](int) { return Outcome::kPreempted; });
    check(polled >= 15 && polled <= 20, "polls that lose the core: about 1 wait in 1024 polls, once backed off");
  }
  {
    SocketSpin s(window);
    run(s, 100, [](int) { return Outcome::kPreempted; });  // backed off
    int waits = 1;
    while (!s.poll_first()) ++waits;  // the next poll comes within kMaxBackoff waits
    check(waits <= SocketSpin::kMaxBackoff + 1, "a backoff ends within kMaxBackoff waits");
    s.ended(Outcome::kInTime);
    check(run(s, 50, [](int) { return Outcome::kInTime; }) == 50, "one poll in time ends the backoff");
  }
  {
    SocketSpin s(window);
    // A peer asleep: late answers on a kept core; one wait in kMaxLateBackoff + 1 still polls.
    const int polled = run(s, 900, [](int) { return Outcome::kLate; });
    check(polled >= 100 && polled <= 104, "late polls on a kept core: one wait in 9 polls, once backed off");
  }
  {
    SocketSpin off(std::chrono::microseconds(0));
    check(run(off, 100, [](int) { return Outcome::kInTime; }) == 0, "a window of 0 never polls");
  }
  return failures == 0 ? 0 : 1;
}
