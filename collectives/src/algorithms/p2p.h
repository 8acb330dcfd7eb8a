// Collective algorithms over point-to-point links (TCP): one function per collective, each in its own
// file, each describing its data movement as a Schedule that the transport runs with every link busy at
// once. Large messages use pipelined rings (bandwidth-optimal), small ones a single exchange with every
// rank that carries the agreement on the arguments and the data together.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "algorithms/areas.h"
#include "algorithms/op_desc.h"
#include "algorithms/schedule.h"
#include "comm.h"

namespace hpcdl {

class P2P {
 public:
  virtual ~P2P() = default;
  virtual int p2p_rank() const = 0;
  virtual int p2p_size() const = 0;
  virtual const std::vector<int>& p2p_world() const = 0;
  // Runs every item of the schedule (comm ranks as peers) and returns when all are done, or with the first
  // error: a lost peer or the deadline, naming the peer, or a receive action's status.
  virtual Status run(Schedule& schedule, Deadline deadline, const std::string& what) = 0;
  // A buffer of at least `bytes` that the communicator keeps from one collective to the next (it runs one
  // at a time): a ring's chunk in flight without an allocation, zeroing and page faults on every call.
  virtual char* scratch(size_t bytes) = 0;
  // Sends to comm rank `to` while receiving from comm rank `from` (-1 skips either side).
  Status sendrecv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
                  Deadline deadline, const std::string& what);
};

// Data that travels with the agreement (see p2p_agree): this rank's `bytes` at `mine`, sent to every other
// rank; rank q's, `len[q]` bytes, lands at `into + at[q]` (this rank's own place is left alone).
struct Inline {
  const void* mine = nullptr;
  size_t bytes = 0;
  char* into = nullptr;
  std::vector<size_t> at, len;
};

// Opens every collective: exchanges descriptors with every rank at once and checks they agree (all ranks
// fail alike on mismatch). With `data`, each rank's payload travels behind its descriptor: one round trip
// for a small collective's arguments and data together.
Status p2p_agree(P2P& p, const OpDesc& desc, Deadline deadline, const std::string& what,
                 std::vector<OpDesc>* all = nullptr, const Inline* data = nullptr);

Status p2p_allreduce(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                     double postscale, size_t small_message_bytes, Deadline deadline, const std::string& what);
// p2p_allreduce of segments (see Comm::allreduce_segments): large ones run as one ring that sends from and
// receives into the segments where they are; small ones are packed into one buffer for the exchange.
Status p2p_allreduce_segments(P2P& p, const std::vector<Segment>& segments, int dtype, int op, double prescale,
                              double postscale, size_t small_message_bytes, Deadline deadline,
                              const std::string& what);
// The bandwidth-optimal part of p2p_allreduce alone, for callers that agreed on the arguments already:
// every member passes the same count (>= 1), dtype and op; AVERAGE divides by `divisor`. `send` and `recv`
// hold `count` elements each (they may be the same). Runs as rings over consecutive pieces of kRingPieceBytes.
Status p2p_ring_allreduce(P2P& p, const Areas& send, const Areas& recv, int64_t count, int dtype, int op,
                          double prescale, double postscale, int64_t divisor, Deadline deadline,
                          const std::string& what);
Status p2p_allgatherv(P2P& p, const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                      size_t small_message_bytes, Deadline deadline, const std::string& what);
Status p2p_broadcast(P2P& p, void* buf, int64_t count, int dtype, int root, Deadline deadline,
                     const std::string& what);
Status p2p_alltoallv(P2P& p, const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline, const std::string& what);
Status p2p_reducescatter(P2P& p, const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype,
                         int op, double prescale, double postscale, Deadline deadline, const std::string& what);
Status p2p_barrier(P2P& p, Deadline deadline, const std::string& what);

// A ring over the comm's ranks whose buffer is cut into one segment per rank (`offsets`: size + 1 byte
// offsets) and each segment into chunks of at most `chunk` bytes: the unit that is sent, received and
// reduced, so that a chunk moves on as soon as it is ready instead of waiting for its whole segment.
struct Ring {
  Ring(const P2P& p, std::vector<size_t> offsets, size_t chunk);
  int n, r, next, prev;
  std::vector<size_t> offsets;
  size_t chunk;
  size_t chunks;  // per segment (the largest segment's count; shorter segments have empty tail chunks)
  size_t seg_len(int seg) const { return offsets[size_t(seg) + 1] - offsets[size_t(seg)]; }
  size_t chunk_at(int seg, size_t c) const { return std::min(c * chunk, seg_len(seg)); }
  size_t chunk_len(int seg, size_t c) const { return std::min((c + 1) * chunk, seg_len(seg)) - chunk_at(seg, c); }
  int seg(int step_back) const { return ((r - step_back) % n + n) % n; }
};

// The bytes a ring moves at once per chunk: large enough for few system calls, small enough that a received
// chunk is still in cache when it is reduced. With 256 KiB send buffers, 128 KiB chunks made 512 KiB-1 MiB
// allreduces between two hosts 10-15 % faster than 256 KiB ones, and 2-16 MiB ones as fast (within 3 %).
constexpr size_t kRingChunkBytes = 128 << 10;
// A ring allreduce larger than this runs as consecutive rings over pieces of this size. A lane sends its
// items in order, so in one ring over the whole buffer the allgather's first chunk waits behind the whole
// reduce-scatter, and the chunks it sends have long left the cache; pieces bound that distance. Between two
// namespace hosts, 8 MiB pieces made 64 MiB allreduces 1.3-1.4x and 256 MiB ones 1.4-1.5x faster than one
// ring, and did better than 4 or 16 MiB pieces (benchmarks/README.md).
constexpr size_t kRingPieceBytes = 8 << 20;

// Adds a reduce-scatter to `s`: rank r ends with segment r reduced over every rank, written to `mine`.
// Each other segment this rank reduces on the way is `in`'s segment combined with what the previous
// rank sent, written to the same offset of `acc` (which may be `in`); `tmp` holds one chunk. The last
// combination (segment r) applies `op` in full (average: divides by `divisor`) and `postscale`; the others
// sum partially. Returns, per chunk of segment r, the receive after which that chunk is final. The receives'
// actions read `in`, `acc` and `mine`: they must outlive the schedule's run.
std::vector<int> ring_reduce_scatter(Schedule& s, const Ring& ring, const Areas& in, const Areas& acc,
                                     const Areas& mine, char* tmp, int dtype, int op, double postscale,
                                     int64_t divisor);
// Adds an allgather to `s` on `out`, where this rank holds segment r; `ready[c]` (empty: none) is the
// receive after which chunk c of segment r may be sent.
void ring_allgather(Schedule& s, const Ring& ring, const Areas& out, const std::vector<int>& ready);

}  // namespace hpcdl
