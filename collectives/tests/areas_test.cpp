// Checks Areas (collectives/src/algorithms/areas.h), the byte-offset view the ring algorithms take of a
// buffer in one or several areas of memory: pieces split exactly where areas end, windows start and end
// mid-area, empty areas are left out, and each_pair splits where either buffer's areas end. Built and run
// by tests/unit/test_areas.py; prints one "ok" or "FAIL ..." line per check.
#include <cstdio>
#include <string>
#include <vector>

#include "algorithms/areas.h"

using hpcdl::Areas;

namespace {
int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// Each piece as "offset-in-memory@offset-from-start+length", memory offsets relative to `base`.
std::string pieces(const Areas& a, size_t at, size_t len, const char* base) {
  std::string s;
  a.each(at, len, [&](char* data, size_t rel, size_t n) {
    s += std::to_string(data - base) + "@" + std::to_string(rel) + "+" + std::to_string(n) + " ";
  });
  return s;
}
}  // namespace

int main() {
  std::vector<char> memory(100);
  char* m = memory.data();
  // Areas of 10, 0 (left out), 5 and 20 bytes, not adjacent in memory: logical bytes 0-9, 10-14, 15-34.
  Areas a;
  a.add(m + 50, 10);
  a.add(m + 90, 0);
  a.add(m + 10, 5);
  a.add(m + 20, 20);
  check(a.bytes() == 35, "bytes() is the total of the areas");
  check(pieces(a, 0, 35, m) == "50@0+10 10@10+5 20@15+20 ", "the whole buffer: one piece per non-empty area");
  check(pieces(a, 8, 9, m) == "58@0+2 10@2+5 20@7+2 ", "a range across areas splits where they end");
  check(pieces(a, 10, 5, m) == "10@0+5 ", "a range that is exactly one area");
  check(pieces(a, 30, 5, m) == "35@0+5 ", "a range inside the last area");
  check(pieces(a, 12, 0, m).empty(), "an empty range has no pieces");
  const Areas w = a.window(8, 9);
  check(w.bytes() == 9 && pieces(w, 0, 9, m) == "58@0+2 10@2+5 20@7+2 ", "a window holds the range's pieces");
  check(pieces(w, 3, 5, m) == "11@0+4 20@4+1 ", "a window's offsets start at its first byte");
  const Areas one(m, 64);
  check(pieces(one, 16, 32, m) == "16@0+32 ", "a contiguous buffer is one area");

  // each_pair: `a` against a buffer whose areas end elsewhere (7 + 28 bytes).
  Areas b;
  b.add(m + 60, 7);
  b.add(m + 70, 28);
  std::string pairs;
  hpcdl::each_pair(a, 0, b, 0, 35, [&](char* pa, char* pb, size_t rel, size_t n) {
    pairs += std::to_string(pa - m) + "/" + std::to_string(pb - m) + "@" + std::to_string(rel) + "+" +
             std::to_string(n) + " ";
  });
  check(pairs == "50/60@0+7 57/70@7+3 10/73@10+5 20/78@15+20 ", "each_pair splits where either buffer's areas end");
  pairs.clear();
  hpcdl::each_pair(a, 12, one, 40, 6, [&](char* pa, char* pb, size_t rel, size_t n) {
    pairs += std::to_string(pa - m) + "/" + std::to_string(pb - m) + "@" + std::to_string(rel) + "+" +
             std::to_string(n) + " ";
  });
  check(pairs == "12/40@0+3 20/43@3+3 ", "each_pair at offsets of its own in each buffer");
  return failures == 0 ? 0 : 1;
}
