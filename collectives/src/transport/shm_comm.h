// Shared-memory communicator for ranks on one host. One segment per (process set, channel): a control
// block per rank (progress counter, doorbell) and two staging buffers per rank. The segment is unlinked
// as soon as every member has mapped it, so nothing is left in /dev/shm even when ranks are SIGKILLed.
//
// Progress protocol: each collective is a sequence of steps; in each step a rank writes into its staging
// buffer (step & 1), publishes the step number, and waits until every member published it. A rank reads
// what peers published at step s only before it publishes s + 1, so double buffering needs no extra sync.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/areas.h"
#include "algorithms/op_desc.h"
#include "comm.h"
#include "transport/staging_stores.h"
#include "transport/wait.h"

namespace hpcdl {

struct ShmParams {
  size_t chunk_bytes = 2 << 20;       // staging buffer size per rank and step
  size_t small_message_bytes = 65536;  // allreduce below this: one step, everybody reduces everything
  StagingStores::Mode stores = StagingStores::Mode::kAuto;  // how chunks are written for the peers
};

class ShmComm : public Comm {
 public:
  // Sends the segment name from the leader (comm rank 0) to member `to` / receives it (world ranks).
  using SendName = std::function<Status(int to_world, const std::string& name)>;
  using RecvName = std::function<Status(int from_world, std::string* name)>;

  static Status create(const std::vector<int>& world_ranks, int my_rank, const std::vector<int>& pids,
                       const ShmParams& params, const std::string& label, Deadline deadline, const SendName& send,
                       const RecvName& recv, std::shared_ptr<ShmComm>* out);
  ~ShmComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_; }

  Status allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale, double postscale,
                   Deadline deadline, const std::string& what) override;
  Status allreduce_segments(const std::vector<Segment>& segments, int dtype, int op, double prescale,
                            double postscale, Deadline deadline, const std::string& what) override;
  bool native_segments() const override { return true; }
  Status allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype, Deadline deadline,
                    const std::string& what) override;
  Status broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline, const std::string& what) override;
  Status alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                   const std::string& what) override;
  Status reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype, int op,
                       double prescale, double postscale, Deadline deadline, const std::string& what) override;
  Status barrier(Deadline deadline, const std::string& what) override;
  Status allgather_slots(const void* mine, void* all, size_t slot_bytes, Deadline deadline,
                         const std::string& what) override;
  // reducescatter, allgatherv and broadcast over buffers laid over several areas (a fused batch's tensors): the
  // hierarchical path's stages within a host (HierarchicalComm::allreduce_sliced and allreduce_leaders). The
  // input of an allgatherv must not overlap the output, unless it is exactly this rank's own block, in place.
  Status reducescatter_areas(const Areas& in, const Areas& out, const std::vector<int64_t>& recv_counts, int dtype,
                             int op, double prescale, double postscale, Deadline deadline, const std::string& what);
  Status allgatherv_areas(const Areas& in, const Areas& out, const std::vector<int64_t>& counts, int dtype,
                          Deadline deadline, const std::string& what);
  Status broadcast_areas(const Areas& buf, int64_t count, int dtype, int root, Deadline deadline,
                         const std::string& what);

  void notify_peers(uint32_t cycle) override;
  void notify_self() override;
  Bell wait_notify(uint32_t cycle, Deadline until) override;
  void ring_if_late(uint32_t cycle, std::chrono::nanoseconds after) override { late_ring_.arm(cycle, after); }

  // Each kind of collective has its own staging stores: it times its own full chunks (an allgather's chunk
  // costs less than an allreduce's of the same bytes, so their times must not meet in one median) and
  // chooses its kind of store from them. Where cached stores are slow (cores that share no cache), every
  // kind finds streaming stores by itself, a job that only allgathers too.
  enum ChunkKind { kAllreduceChunk, kAllgatherChunk, kBroadcastChunk, kAlltoallChunk, kReducescatterChunk, kChunkKinds };
  const StagingStores& stores(ChunkKind kind) const { return stores_[kind]; }  // what it chose (diagnostics, tests)

 private:
  ShmComm() = default;
  struct Header;
  struct RankCtl;

  // Comm rank 0 creates the segment and sends its name to the members; they check it before they map it.
  Status make_segment(Deadline deadline, const SendName& send);
  Status join_segment(const RecvName& recv);

  RankCtl& ctl(int r) const;
  char* slot(int r, uint32_t step) const;  // staging buffer rank r uses for `step`
  char* desc_area(int r, uint32_t step) const;
  void publish();
  void ring(int r, uint32_t cycle);
  Status wait_all(Deadline deadline, const std::string& what);
  Status wait_rank(int r, Deadline deadline, const std::string& what);
  template <class Missing>
  Status wait_until(Missing missing, Deadline deadline, const std::string& what);
  // Publishes `desc` as its own step, waits for everyone, checks agreement; fills *all when non-null.
  Status agree(const OpDesc& desc, Deadline deadline, const std::string& what, std::vector<OpDesc>* all = nullptr);
  Status reduce_segments(const Segment* segments, size_t nseg, int dtype, int op, double prescale,
                         double postscale, Deadline deadline, const std::string& what);
  // reducescatter, allgatherv and broadcast, written once over a buffer in one area (OneArea) or several (Areas).
  template <class Input, class Output>
  Status reducescatter_over(const Input& in, const Output& out, const std::vector<int64_t>& recv_counts, int dtype,
                            int op, double prescale, double postscale, Deadline deadline, const std::string& what);
  template <class Input, class Output>
  Status allgatherv_over(const Input& in, const Output& out, const std::vector<int64_t>& counts, int dtype,
                         Deadline deadline, const std::string& what);
  template <class Buffer>
  Status broadcast_over(const Buffer& buf, int64_t count, int dtype, int root, Deadline deadline,
                        const std::string& what);
  // A chunk of one kind of collective, timed for its StagingStores when every member runs it in full:
  // begin_chunk at its start, publish_chunk for its first step (publish and wait, carrying the previous
  // full chunk's time to the peers and recording the slowest member's), end_chunk at its end.
  struct Chunk {
    ChunkKind kind;
    bool full;
    bool streamed;  // staged with streaming stores
    Clock::time_point start;
  };
  Chunk begin_chunk(ChunkKind kind, bool full) const;
  Status publish_chunk(Deadline deadline, const std::string& what);
  void end_chunk(const Chunk& chunk);
  Status check_usable() const;
  Status fail(Status status);

  int rank_ = 0, size_ = 1;
  std::vector<int> world_;
  std::vector<int> pids_;
  ShmParams params_;
  std::string label_;
  void* base_ = nullptr;
  size_t total_ = 0;
  size_t ctl_off_ = 0, desc_off_ = 0, slot_off_ = 0, desc_bytes_ = 0;
  uint32_t step_ = 0;
  uint32_t pokes_seen_ = 0;
  LateRing late_ring_;  // ring_if_late's, rung by the next wait
  Status broken_;
  WaitPolicy policy_;
  StagingStores stores_[kChunkKinds];
  uint64_t last_chunk_ns_ = 0;  // this rank's time for its last full chunk, not yet shared
  ChunkKind last_chunk_kind_ = kAllreduceChunk;  // that chunk's kind of collective
  bool last_chunk_streamed_ = false;             // and kind of store
};

}  // namespace hpcdl
