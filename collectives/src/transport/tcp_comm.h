// TCP communicator: a full mesh of authenticated connections between the members (one per pair for
// data, one per pair for the engine's doorbell), with the ring/exchange algorithms of algorithms/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithms/p2p.h"
#include "comm.h"
#include "runtime.h"
#include "transport/wait.h"

namespace hpcdl {

class Endpoint;

class TcpComm : public Comm, public P2P {
 public:
  struct Params {
    size_t small_message_bytes = 65536;  // up to this, the one-round exchange; above, rings
    std::chrono::microseconds spin{0};  // how long a wait polls its sockets first (SocketSpin)
    int send_buffer_bytes = 0;           // SO_SNDBUF of the data connections (0: the endpoint's)
  };
  // Collective over the members: `key` must be the same on all of them and unique per communicator.
  static Status create(Endpoint& endpoint, const std::vector<PeerInfo>& world, const std::vector<int>& world_ranks,
                       int my_rank, const std::string& key, const Params& params, Deadline deadline,
                       std::shared_ptr<TcpComm>* out);
  ~TcpComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_; }
  std::string path(size_t) const override { return spans_hosts_ ? "flat" : ""; }

  Status allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale, double postscale,
                   Deadline deadline, const std::string& what) override;
  bool native_segments() const override { return true; }
  Status allreduce_segments(const std::vector<Segment>& segments, int dtype, int op, double prescale,
                            double postscale, Deadline deadline, const std::string& what) override;
  Status allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype, Deadline deadline,
                    const std::string& what) override;
  Status broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline, const std::string& what) override;
  Status alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                   const std::string& what) override;
  Status reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype, int op,
                       double prescale, double postscale, Deadline deadline, const std::string& what) override;
  Status barrier(Deadline deadline, const std::string& what) override;

  void notify_peers(uint32_t cycle) override;
  void notify_self() override;
  Bell wait_notify(uint32_t cycle, Deadline until) override;
  void ring_if_late(uint32_t cycle, std::chrono::nanoseconds after) override { late_ring_.arm(cycle, after); }

  // P2P
  int p2p_rank() const override { return rank_; }
  int p2p_size() const override { return size_; }
  const std::vector<int>& p2p_world() const override { return world_; }
  Status run(Schedule& schedule, Deadline deadline, const std::string& what) override;
  char* scratch(size_t bytes) override;

 private:
  TcpComm() = default;
  Status check_usable() const;
  Status guard(Status status);
  std::string peer_name(int r) const;

  int rank_ = 0, size_ = 1;
  std::vector<int> world_;
  std::vector<std::string> hosts_;
  bool spans_hosts_ = false;
  std::vector<int> fds_, bell_fds_;
  std::vector<bool> bell_quiet_;  // doorbells whose peer hung up (only wait_notify's thread touches it)
  int self_bell_ = -1;
  uint32_t bell_ = 0;  // the latest cycle a peer rang for (only wait_notify's thread touches it)
  size_t small_message_bytes_ = 65536;
  SocketSpin spin_;  // waits poll their sockets first while that pays (run() is never concurrent)
  LateRing late_ring_;  // ring_if_late's, rung by the next schedule (run() is never concurrent)
  std::vector<char> scratch_;
  // Bytes read from a peer's data connection ahead of the receive they belong to (see run()): a small
  // receive reads whatever the socket holds, so that a descriptor and the data behind it take one recv().
  struct ReadAhead {
    std::vector<char> buf;
    size_t at = 0, len = 0;
  };
  std::vector<ReadAhead> ahead_;
  Status broken_;
};

}  // namespace hpcdl
