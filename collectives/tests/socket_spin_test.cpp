// Checks SocketSpin's policy against synthetic outcomes: polls that pay keep polling, polls that do not
// back off exponentially up to kMaxBackoff, one that pays ends the backoff, and a window of 0 never polls.
// Built and run by tests/unit/test_socket_spin.py; prints one "ok" or "FAIL ..." line per check.
#include <cstdio>

#include "transport/wait.h"

using hpcdl::SocketSpin;

namespace {
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++failures;
}

// Runs `waits` waits whose polls end as `pays(i)` says; returns how many of them polled.
template <class Pays>
int run(SocketSpin& spin, int waits, Pays pays) {
  int polled = 0;
  for (int i = 0; i < waits; ++i) {
    if (!spin.poll_first()) continue;
    ++polled;
    spin.paid(pays(i));
  }
  return polled;
}
}  // namespace

int main() {
  const std::chrono::microseconds window(30);
  {
    SocketSpin s(window);
    check(run(s, 1000, [](int) { return true; }) == 1000, "polls that pay: every wait polls");
  }
  {
    SocketSpin s(window);
    // 1 + 2 + 4 + ... + 512 waits skipped after the first 10 failures, then 1024 each.
    const int polled = run(s, 10000, [](int) { return false; });
    check(polled >= 15 && polled <= 20, "polls that never pay: about 1 wait in 1024 polls, once backed off");
  }
  {
    SocketSpin s(window);
    run(s, 100, [](int) { return false; });  // backed off
    int polled_before = 0;
    while (!s.poll_first()) ++polled_before;  // the next poll comes within kMaxBackoff waits
    check(polled_before <= SocketSpin::kMaxBackoff, "a backoff ends within kMaxBackoff waits");
    s.paid(true);
    check(run(s, 50, [](int) { return true; }) == 50, "one poll that pays ends the backoff");
  }
  {
    SocketSpin s(window);
    // One failure in four: a backoff of 1 after each, so most waits still poll.
    const int polled = run(s, 1000, [](int i) { return i % 4 != 0; });
    check(polled > 700, "an occasional late answer costs a few polls, not the polling");
  }
  {
    SocketSpin off(std::chrono::microseconds(0));
    check(run(off, 100, [](int) { return true; }) == 0, "a window of 0 never polls");
  }
  return failures == 0 ? 0 : 1;
}
