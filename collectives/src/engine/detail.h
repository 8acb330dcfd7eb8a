// Constants and small helpers shared by the engine's translation units (not part of any interface).
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "comm.h"
#include "engine/request.h"

namespace hpcdl {
namespace engine_detail {

constexpr size_t kSlotBytes = 512;  // fixed part of each rank's control message (one allgather when it fits)
// The most one rank's control message may hold (thousands of operations with long names take a few MB): a
// larger announced length is a broken peer, refused before anything is allocated for it.
constexpr uint32_t kMaxControlBytes = 64u << 20;
// On a communicator that reduces segments natively (shared memory, TCP, the hierarchical path across hosts), a
// fused allreduce reduces its tensors where they are, one segment each, except those at most kPackTensorMaxBytes:
// they are copied into the fusion buffer, which is one segment, since for them a copy is cheaper than a piece
// of every kernel call, copy or system call of the collective. Elsewhere (MPI) a segmented allreduce would
// copy anyway, so only allreduces at most
// kFuseTensorMaxBytes are fused, all through the fusion buffer; larger ones run alone, in place, because
// copying them in and out costs more than the per-operation overhead fusion saves.
constexpr int64_t kFuseTensorMaxBytes = 256 * 1024;
constexpr int64_t kPackTensorMaxBytes = 4 * 1024;
constexpr uint32_t kFlagShutdown = 1, kFlagKnobs = 2, kFlagAborts = 4;
// A rank asks others for their reports (stack and last submissions), and a rank sends its report.
constexpr uint32_t kFlagReportRequest = 8, kFlagReport = 16;
// How long a stall report or a timeout waits for the reports of the ranks it names.
constexpr std::chrono::seconds kReportWait{2};
// The innermost frames of a missing rank's main thread that a report shows.
constexpr int kReportFrames = 12;
constexpr uint8_t kFullRequest = 0, kCachedRequest = 1;
constexpr int64_t kInlineMaxBytes = 64;  // allreduces this small carry their data in the control message
constexpr int64_t kWideBytes = 1 << 20;  // batches this large may run on any core (see place_thread)
// Engine::settle: a caller that enqueued within the last kSettle (counted while the engine thread sleeps when
// it shares the caller's core) is taken to be in the middle of a burst; while one lasts, the engine thread
// looks again every kSettleRecheck (each look is a wake-up on a caller's core). kSettle must cover a Python
// caller's return and next call with cold caches.
// In ResNet-50 steps (161 gradients after a 100 MB transfer, 2 ranks), at 20 us the engine ran each step's
// first two gradients in cycles of their own, on the core the caller was submitting the rest from (the
// submissions took 1.5 ms instead of 0.45 ms); at 50 us, about one step in 25.
constexpr std::chrono::microseconds kSettle{100};
// A rank that starts a cycle rings its peers only when they have not arrived on their own after a while
// (Comm::ring_if_late): ranks in step (a blocking allreduce called on every rank, a training step's burst)
// meet without a wake-up. How long depends on what the cycle brings. A cycle that completes an operation
// (its peers submitted it and wait), or carries news (a shutdown, cancellations, reports, a heartbeat)
// rings after kRingAfter. A cycle that only brings submissions its peers have not made yet cannot complete
// them before they do; their callers are usually on their way, and meeting those (rather than engine threads
// woken to take part with nothing) keeps every rank on the direct path: it rings after kRingAfterEarly.
constexpr std::chrono::microseconds kRingAfter{20};
constexpr std::chrono::microseconds kRingAfterEarly{200};
// A submission this small, made while the engine sleeps and nothing else waits in its queue, does not wake
// it: its caller usually waits for it next and then runs the cycle itself (the direct path). A group's
// members, submitted back to back, count as one submission of their bytes together. The engine
// thread still runs it when anything else wakes it, at the latest within a second. A larger one wakes it, to
// start while its caller goes on (the overlap asynchronous submission is for), unless the caller waits for
// it at once (hpcdl_run): at 1 MiB that wake-up, one context switch a call, cost 5-9 us.
constexpr int64_t kDeferMaxBytes = 64 * 1024;
// Buffers of released allgather and alltoall results kept for the next results (at most this many, of at
// least kSpareResultMinBytes each, kSpareResultBytes in all): a loop of such calls would otherwise allocate
// and free a large block every time, and glibc gives the heap's top back to the kernel and takes it again
// (a 1 MiB allgather at 2 ranks took 2 ms, 1 ms of it in the kernel, against 0.65 ms with the block kept).
constexpr size_t kSpareResults = 4;
constexpr size_t kSpareResultMinBytes = 64 << 10;
constexpr size_t kSpareResultBytes = 64 << 20;
// The longest an engine thread woken by a peer's ring lets its caller come and run that cycle itself (see
// Engine::yield_to_caller).
constexpr std::chrono::microseconds kYieldToCaller{50};
// The longest a rank that shuts down waits for its peers to hear it (see Engine::run_cycle).
constexpr std::chrono::seconds kShutdownGrace{2};
constexpr std::chrono::microseconds kSettleRecheck{100};

// The longest a rank that waits for an operation (its peers' submissions, or a device batch's end) stays
// idle without a cycle: each such cycle is a heartbeat, in which a dead peer shows as a failed negotiation
// (its process gone, its connection closed). The survivors then fail at once, rather than at their
// deadline, also when the collective they wait for runs on a GPU that will never finish it.
constexpr std::chrono::milliseconds kHeartbeat{250};
// How long a failed device batch looks for the member whose death caused it (a killed peer's sockets close
// just before its process becomes a zombie; see Engine::device_failure).
constexpr std::chrono::milliseconds kDeathGrace{50};

// True on the engine thread (set as it starts): it alone may move itself between cores, and operations it
// runs are not the direct path's.
extern thread_local bool t_engine_thread;

// Bytes of data an allreduce carries inside its control message (0: none). Never for device data: the
// engine cannot read it.
inline int64_t inline_bytes(const OpRequest& r) {
  if (r.op_type != HPCDL_OP_ALLREDUCE || r.placement == HPCDL_PLACEMENT_DEVICE) return 0;
  int64_t bytes = r.num_elements() * dtype_size(r.dtype);
  return bytes > 0 && bytes <= kInlineMaxBytes ? bytes : 0;
}

// Horovod scales each rank's input by the prescale factor before the reduction and stores it in the
// tensor's own type (integers truncate, float16/bfloat16 round), and the sum adds those values. The kernels
// scale inside the reduction, in a wider type: for these dtypes the engine scales each input first, as
// Horovod does, and reduces it unscaled (float32/float64 give the same either way; bool ignores scaling).
inline bool prescale_rounds(const OpRequest& r) {
  return r.prescale != 1.0 && r.dtype != HPCDL_FLOAT32 && r.dtype != HPCDL_FLOAT64 && r.dtype != HPCDL_BOOL;
}

// A deadline already passed: wait_notify then only consumes a pending ring.
inline Deadline past() { return Clock::now() - std::chrono::seconds(1); }

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline std::set<std::string> split_commas(const std::string& text) {
  std::set<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.insert(item);
  return out;
}

inline std::string ranks_json(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

// Position of a world rank in a member list, -1 when absent.
inline int index_of(const std::vector<int>& members, int world_rank) {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == world_rank) return static_cast<int>(i);
  return -1;
}

}  // namespace engine_detail
}  // namespace hpcdl
