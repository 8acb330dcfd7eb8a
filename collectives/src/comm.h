// The internal seam between the data plane (transports, algorithms, kernels) and the engine.
//
// A Comm is an ordered group of world ranks on one channel. The engine only ever talks to peers through
// a Comm; it never sees sockets or shared memory. Channels isolate traffic: the direct C API, the engine's
// data and the engine's control messages each use their own Comm, so they can never cross-talk.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hpcdl/c_api.h"

namespace hpcdl {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A steady-clock time as ns since the clock's epoch: how operation records and the timeline store times.
inline int64_t steady_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Result of an operation that can fail: a status code from c_api.h and a message for the user.
struct Status {
  int code = HPCDL_OK;
  std::string message;

  static Status ok() { return {}; }
  static Status error(int code, std::string message) { return {code, std::move(message)}; }
  bool is_ok() const { return code == HPCDL_OK; }
};

// One piece of a segmented allreduce: `count` elements read from `send`, results written to `recv`
// (which may equal `send`). Segments of one call must not overlap each other.
struct Segment {
  const void* send;
  void* recv;
  int64_t count;
};

enum class Channel : int { kDirect = 0, kEngineData = 1, kEngineControl = 2 };

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;                            // rank within this comm
  virtual int size() const = 0;
  virtual const std::vector<int>& world_ranks() const = 0;  // comm rank -> world rank
  // How an allreduce of `bytes` crosses hosts here, for the timeline and logs: "hierarchical" (shared memory
  // within hosts, TCP between them), "flat" (one TCP mesh over members on several hosts), "" (one host, MPI).
  virtual std::string path(size_t bytes) const { return ""; }

  // `what` names the operation in timeout/peer-loss messages (e.g. "allreduce 'grad.fc1.weight'").
  virtual Status allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                           double postscale, Deadline deadline, const std::string& what) = 0;
  // Reduces the segments as if they were one buffer holding their concatenation: every member passes
  // segments with the same total count, and element k of that concatenation is reduced with element k of
  // everyone else's, reading and writing the segments in place. Only transports that can stage straight
  // from the segments (native_segments()) offer it; on the others the engine packs tensors into its
  // fusion buffer itself, where the timeline can show the copies.
  virtual bool native_segments() const { return false; }
  virtual Status allreduce_segments(const std::vector<Segment>& segments, int dtype, int op, double prescale,
                                    double postscale, Deadline deadline, const std::string& what) {
    return Status::error(HPCDL_ERR_UNSUPPORTED, what + ": this transport has no in-place segmented allreduce");
  }
  // counts[i] = elements contributed by comm rank i; recv holds their concatenation in rank order.
  virtual Status allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                            Deadline deadline, const std::string& what) = 0;
  virtual Status broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                           const std::string& what) = 0;
  virtual Status alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                           const std::string& what) = 0;
  virtual Status reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                               int dtype, int op, double prescale, double postscale, Deadline deadline,
                               const std::string& what) = 0;
  virtual Status barrier(Deadline deadline, const std::string& what) = 0;

  // Every member contributes `slot_bytes` bytes; `all` receives them in rank order (slot_bytes x size). The
  // engine's control messages travel so; transports that can do it in one step override it.
  virtual Status allgather_slots(const void* mine, void* all, size_t slot_bytes, Deadline deadline,
                                 const std::string& what) {
    return allgatherv(mine, all, std::vector<int64_t>(static_cast<size_t>(size()), static_cast<int64_t>(slot_bytes)),
                      HPCDL_UINT8, deadline, what);
  }

  // The engine's doorbell. The engine's cycles are numbered alike on every member; a member that starts
  // cycle c while its peers may be idle rings them for c. wait_notify(c, until) returns kRung when a peer
  // rang for cycle c or a later one, kPoked when notify_self() was called, kTimeout when `until` passed;
  // rings for earlier cycles (which the waiter took part in already) are dropped, so a ring never needs
  // clearing. Waiting yields the CPU (no busy spin beyond a short bounded poll).
  enum class Bell { kTimeout = 0, kRung = 1, kPoked = 2 };
  virtual void notify_peers(uint32_t cycle) = 0;
  virtual void notify_self() = 0;
  virtual Bell wait_notify(uint32_t cycle, Deadline until) = 0;
  // Rings the peers for `cycle` if the next collective on this communicator has not found them all within
  // `after`: the common case, peers that arrive on their own, then costs no wake-up. Transports that cannot
  // watch their waits ring at once.
  virtual void ring_if_late(uint32_t cycle, std::chrono::nanoseconds /*after*/) { notify_peers(cycle); }
};

}  // namespace hpcdl
