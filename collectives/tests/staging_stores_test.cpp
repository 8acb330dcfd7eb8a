// Checks StagingStores' choice against synthetic chunk timings, and stream_copy and line_copy against memcpy.
// Built and run by tests/unit/test_staging_stores.py; prints one "ok" or "FAIL ..." line per check.
#include <cstdio>
#include <cstring>
#include <vector>

#include "transport/staging_stores.h"

using hpcdl::StagingStores;

namespace {
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++failures;
}

// Runs `chunks` chunks whose duration depends on the store kind; returns how many used streaming stores.
template <class Cost>
int run(StagingStores& stores, int chunks, Cost cost) {
  int streamed = 0;
  for (int i = 0; i < chunks; ++i) {
    const bool streaming = stores.streaming();
    streamed += streaming;
    stores.record_chunk(cost(i, streaming), streaming);
  }
  return streamed;
}

// As the shared-memory transport reports them: a chunk's time arrives with the next chunk's step, after
// that next chunk was staged (with the kind chosen before the time arrived).
template <class Cost>
int run_late(StagingStores& stores, int chunks, Cost cost) {
  int streamed = 0;
  double pending = 0;
  bool pending_streamed = false;
  for (int i = 0; i < chunks; ++i) {
    const bool streaming = stores.streaming();
    streamed += streaming;
    if (i > 0) stores.record_chunk(pending, pending_streamed);
    pending = cost(i, streaming);
    pending_streamed = streaming;
  }
  return streamed;
}

// Costs of a machine whose cores share no cache for 3000 chunks and then do: cached stores win once their
// two cold chunks after streaming ones are past (the first of them 3x streaming's time).
struct CacheBecomesShared {
  int since_switch = 0;
  bool last = false;
  double operator()(int i, bool streaming) {
    since_switch = streaming == last ? since_switch + 1 : 0;
    last = streaming;
    if (i < 3000) return streaming ? 0.245e-3 : 1.08e-3;
    if (streaming) return 0.33e-3;
    if (since_switch == 0) return 1.0e-3;
    return since_switch == 1 ? 0.45e-3 : 0.205e-3;
  }
};
}  // namespace

int main() {
  {  // shared cache: cached stores are 1.7x faster; auto keeps them and rarely tries the other kind
    StagingStores s;
    const int streamed = run(s, 5000, [](int, bool streaming) { return streaming ? 1.7e-3 : 1e-3; });
    check(!s.streaming(), "shared cache: auto stays with cached stores");
    check(streamed > 0 && streamed < 5000 * 15 / 1000, "shared cache: under 1.5% of 5000 chunks were trials");
  }
  {  // no shared cache: streaming is 4x faster; auto switches within the first trial
    StagingStores s;
    int i = 0;
    while (!s.streaming() || i < StagingStores::kFirstInterval + StagingStores::kTrialChunks) {
      s.record_chunk(s.streaming() ? 1e-3 : 4e-3, s.streaming());
      if (++i > 100) break;
    }
    const int cached = 2000 - run(s, 2000, [](int, bool streaming) { return streaming ? 1e-3 : 4e-3; });
    check(i <= StagingStores::kFirstInterval + 2 * (StagingStores::kTrialWarmup + StagingStores::kTrialChunks),
          "no shared cache: switched early");
    check(s.streaming() && cached < 2000 / 80, "no shared cache: stays with streaming stores");
  }
  {  // the machine changes state halfway: auto follows within the longest trial interval
    StagingStores s;
    auto cost = [](int i, bool streaming) { return i < 3000 ? (streaming ? 1.7e-3 : 1e-3) : (streaming ? 1e-3 : 5e-3); };
    run(s, 3000, cost);
    check(!s.streaming(), "state change: cached before");
    int i = 3000;
    for (; i < 3000 + 2 * StagingStores::kMaxInterval && !s.streaming(); ++i)
      s.record_chunk(cost(i, s.streaming()), s.streaming());
    check(s.streaming() && i - 3000 <= StagingStores::kRecent + StagingStores::kTrialWarmup + StagingStores::kTrialChunks,
          "state change: streaming within a trial of the jump, not a trial interval later");
  }
  {  // the vCPUs come to share a cache: streaming 1.35x slower than before, cached now 0.62x of it
    StagingStores s;
    auto cost = [](int i, bool streaming) { return i < 3000 ? (streaming ? 0.245e-3 : 1.08e-3) : (streaming ? 0.33e-3 : 0.205e-3); };
    run(s, 3000, cost);
    check(s.streaming(), "cache becomes shared: streaming before");
    int i = 3000;
    for (; i < 3000 + 2 * StagingStores::kMaxInterval && s.streaming(); ++i)
      s.record_chunk(cost(i, s.streaming()), s.streaming());
    check(!s.streaming() && i - 3000 <= StagingStores::kRecent + StagingStores::kTrialWarmup + StagingStores::kTrialChunks,
          "cache becomes shared: cached within a trial of the change");
  }
  {  // a trial's first chunks are cold (the staging buffers as the other kind left them): not counted
    StagingStores s;
    CacheBecomesShared cost;
    run(s, 3000, cost);
    const int streamed = run(s, 2 * StagingStores::kMaxInterval, [&](int i, bool st) { return cost(3000 + i, st); });
    check(!s.streaming() && streamed < 2 * StagingStores::kMaxInterval / 20,
          "cold trial chunks: cached stores win the trial after the change and keep it");
  }
  {  // the host gets busier (both kinds twice as slow): one early trial, no switch, then long intervals again
    StagingStores s;
    auto cost = [](int i, bool streaming) { return (i < 3000 ? 1.0 : 2.0) * (streaming ? 1.7e-3 : 1e-3); };
    run(s, 3000, cost);
    int streamed = 0;
    for (int i = 3000; i < 6000; ++i) {
      streamed += s.streaming();
      s.record_chunk(cost(i, s.streaming()), s.streaming());
    }
    // The regular trials, one a kMaxInterval, and the one the jump started.
    const int trials = 3000 / StagingStores::kMaxInterval + 2;
    check(!s.streaming() && streamed <= trials * (StagingStores::kTrialWarmup + StagingStores::kTrialChunks),
          "busier host: stays cached, one extra trial");
  }
  {  // one chunk held up (preempted, page faults) does not flip the choice
    StagingStores s;
    run(s, 200, [](int i, bool streaming) { return i == 150 ? 0.5 : (streaming ? 1.7e-3 : 1e-3); });
    check(!s.streaming(), "an outlier chunk does not switch");
  }
  {  // equal costs: no flapping
    StagingStores s;
    int switches = 0;
    bool last = s.streaming();
    for (int i = 0; i < 3000; ++i) {
      s.record_chunk(1e-3 * (1 + 0.05 * ((i * 7919) % 11) / 10.0), s.streaming());
      if (s.streaming() != last) ++switches;
      last = s.streaming();
    }
    check(switches <= 2 * 3000 / StagingStores::kMaxInterval + 14, "equal costs: only trials change the kind");
  }
  {  // times reported a chunk late, as the transport shares them: the same choices as on time
    StagingStores shared, apart;
    const int streamed = run_late(shared, 5000, [](int, bool streaming) { return streaming ? 1.7e-3 : 1e-3; });
    check(!shared.streaming() && streamed < 5000 * 15 / 1000, "reported late, shared cache: cached, under 1.5% trials");
    run_late(apart, 100, [](int, bool streaming) { return streaming ? 1e-3 : 4e-3; });
    const int cached = 2000 - run_late(apart, 2000, [](int, bool streaming) { return streaming ? 1e-3 : 4e-3; });
    check(apart.streaming() && cached < 2000 / 80, "reported late, no shared cache: switched and stays streaming");
  }
  {  // reported late, a trial's timing still skips its cold chunks: the chunk staged before the trial began is
     // not taken for its first, so cached stores win after the cache becomes shared
    StagingStores s;
    CacheBecomesShared cost;
    run_late(s, 3000, cost);
    const int streamed = run_late(s, 2 * StagingStores::kMaxInterval, [&](int i, bool st) { return cost(3000 + i, st); });
    check(!s.streaming() && streamed < 2 * StagingStores::kMaxInterval / 20,
          "reported late, cold trial chunks: cached stores win the trial after the change");
  }
  {  // forced modes never change
    StagingStores cached(StagingStores::Mode::kCached), streaming(StagingStores::Mode::kStreaming);
    run(cached, 100, [](int, bool s) { return s ? 1e-3 : 9e-3; });
    run(streaming, 100, [](int, bool s) { return s ? 9e-3 : 1e-3; });
    check(!cached.streaming() && streaming.streaming(), "HPCDL_SHM_STORES=cached/streaming are kept");
    StagingStores::Mode m;
    check(StagingStores::parse("streaming", &m) && m == StagingStores::Mode::kStreaming &&
              StagingStores::parse("auto", &m) && m == StagingStores::Mode::kAuto && !StagingStores::parse("nt", &m),
          "parse");
  }
  {  // stream_copy copies exactly, at every alignment and around the 4 KiB and 64-byte boundaries
    std::vector<unsigned char> src(70000), dst(70000), want(70000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    bool same = true;
    for (size_t offset : {0, 1, 3, 8, 15, 16, 17, 63}) {
      for (size_t n : {0, 1, 4095, 4096, 4097, 4160, 65536, 65599}) {
        std::memset(dst.data(), 0xAB, dst.size());
        std::memset(want.data(), 0xAB, want.size());
        hpcdl::stream_copy(dst.data() + offset, src.data() + 5, n);
        std::memcpy(want.data() + offset, src.data() + 5, n);
        same = same && dst == want;
      }
    }
    check(same, "stream_copy equals memcpy");
  }
  {  // line_copy copies exactly whether source and destination share their offset in a line or not
    std::vector<unsigned char> src(70000), dst(70000), want(70000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    bool same = true;
    for (size_t from : {0, 5, 16, 64}) {
      for (size_t to : {0, 1, 16, 48, 63}) {
        for (size_t n : {0, 1, 127, 4095, 4096, 4097, 4160, 65536, 65599}) {
          std::memset(dst.data(), 0xAB, dst.size());
          std::memset(want.data(), 0xAB, want.size());
          hpcdl::line_copy(dst.data() + to, src.data() + from, n);
          std::memcpy(want.data() + to, src.data() + from, n);
          same = same && dst == want;
        }
      }
    }
    check(same, "line_copy equals memcpy");
  }
  return failures == 0 ? 0 : 1;
}
