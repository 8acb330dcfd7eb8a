// For process sets that span hosts with several members on a host: allreduce of large tensors (at least
// `min_bytes`) in stages (shared memory within each host, TCP between hosts); smaller ones and every other
// collective go over the flat TCP mesh, where every collective also starts with the agreement on its
// arguments.
//
// When every host has the same number L of members (the usual job), member i of each host works with
// member i of every other host ("cross" links): a tensor is reduce-scattered within the host into L slices,
// each slice allreduced by its owners over their own TCP ring (L rings at once, so every member's core and
// connection carries 1/L of the traffic), and the slices gathered back. Hosts with different numbers of
// members fall back to one leader per host. Either path reads and writes a fused batch's tensors where they
// are (allreduce_segments), so the engine fuses tensors of every size here as on one host.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm.h"

namespace hpcdl {

class Areas;
class Runtime;
class ShmComm;
class TcpComm;

class HierarchicalComm : public Comm {
 public:
  static Status create(Runtime& runtime, const std::vector<int>& ranks, int my, const std::string& key,
                       std::shared_ptr<TcpComm> flat, size_t min_bytes, Deadline deadline,
                       std::shared_ptr<Comm>* out);

  int rank() const override;
  int size() const override;
  const std::vector<int>& world_ranks() const override;
  std::string path(size_t bytes) const override { return bytes >= min_bytes_ ? "hierarchical" : "flat"; }

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

 private:
  // Whether an allreduce goes over the flat mesh (see allreduce).
  bool goes_flat(int64_t count, int dtype, double prescale) const;
  Status allreduce_sliced(const Areas& send, const Areas& recv, int64_t count, int dtype, int op, double prescale,
                          double postscale, Deadline deadline, const std::string& what);
  Status allreduce_leaders(const std::vector<Segment>& segments, int64_t count, int dtype, int op, double prescale,
                           double postscale, Deadline deadline, const std::string& what);
  // Whether every member of this host got through `status` without error, as one shared-memory step.
  Status host_verdict(const Status& status, Deadline deadline, const std::string& what);

  std::shared_ptr<TcpComm> flat_;
  std::shared_ptr<Comm> local_;      // members on this host (ShmComm, or a TcpComm of one)
  std::shared_ptr<ShmComm> local_shm_;  // the same when it is a ShmComm (several members on this host)
  std::shared_ptr<TcpComm> cross_;   // member i of every host (equal members per host), else null
  std::shared_ptr<TcpComm> leaders_;  // unequal hosts: the first member of each host; null on the others
  std::vector<std::vector<int>> members_;  // comm ranks of each host, hosts in order of their first member
  size_t min_bytes_ = 0;  // allreduces of fewer bytes go flat (see hierarchical_min_bytes in runtime.cpp)
};

}  // namespace hpcdl
