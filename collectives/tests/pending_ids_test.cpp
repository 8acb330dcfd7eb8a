// Checks PendingIds against a plain set of pending handles: handles added in order, finished in any order,
// some pending across thousands of later ones, and finish_all. Built and run by
// tests/unit/test_pending_ids.py; prints one "ok" or "FAIL ..." line per check.
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "engine/pending_ids.h"

using hpcdl::PendingIds;

namespace {
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++failures;
}

// Every handle in [0, next) (and a few beyond) answers pending() as the reference set does.
bool agrees(const PendingIds& ids, const std::set<int64_t>& pending, int64_t next) {
  for (int64_t id = 0; id < next + 70; ++id)
    if (ids.pending(id) != (id < next && pending.count(id) > 0)) return false;
  return true;
}
}  // namespace

int main() {
  {
    PendingIds ids(1);
    check(!ids.pending(0) && !ids.pending(1), "nothing is pending before the first handle is added");
    ids.add(1);
    ids.add(2);
    check(ids.pending(1) && ids.pending(2), "added handles are pending");
    ids.finish(2);
    check(ids.pending(1) && !ids.pending(2), "finishing one leaves the other pending");
    ids.finish(1);
    ids.finish(1);
    check(!ids.pending(1), "finishing twice is harmless");
  }
  {
    // Random finishing order, with one handle that stays pending while 10000 later ones come and go.
    std::mt19937 random(7);
    PendingIds ids(1);
    std::set<int64_t> pending;
    std::vector<int64_t> open;
    int64_t next = 1;
    bool all_agree = true;
    for (int step = 0; step < 20000; ++step) {
      if (open.empty() || random() % 3 != 0) {
        ids.add(next);
        pending.insert(next);
        if (next != 5) open.push_back(next);
        ++next;
      } else {
        size_t at = random() % open.size();
        ids.finish(open[at]);
        pending.erase(open[at]);
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(at));
      }
      if (step % 997 == 0) all_agree = all_agree && agrees(ids, pending, next);
    }
    check(all_agree && agrees(ids, pending, next), "random finishing order agrees with a set");
    check(ids.pending(5), "a handle stays pending while thousands of later ones finish");
    for (int64_t id : open) ids.finish(id);
    pending.clear();
    pending.insert(5);
    check(agrees(ids, pending, next), "only the long-pending handle is left");
    ids.finish(5);
    check(agrees(ids, {}, next), "then none");
    ids.add(next);
    check(ids.pending(next), "handles added after the window emptied are pending");
    ids.finish_all(next + 1);
    check(agrees(ids, {}, next + 1), "finish_all finishes every handle given out");
    ids.add(next + 1);
    check(ids.pending(next + 1) && !ids.pending(next), "handles added after finish_all are pending");
  }
  return failures == 0 ? 0 : 1;
}
