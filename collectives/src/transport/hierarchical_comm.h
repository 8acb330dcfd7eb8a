// For process sets that span hosts with several members on a host: allreduce in stages (shared memory
// within each host, TCP between hosts); every other op goes over the flat TCP mesh.
//
// When every host has the same number L of members (the usual job), member i of each host works with
// member i of every other host ("cross" links): small tensors are reduced within the host in one shared
// memory step and the host sums exchanged over the cross links in one round; large ones are reduce-scattered
// within the host into L slices, each slice allreduced by its owners over their own TCP ring (L rings at
// once, so every member's core and connection carries 1/L of the traffic), and the slices gathered back.
// Hosts with different numbers of members fall back to one leader per host.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithms/op_desc.h"
#include "comm.h"

namespace hpcdl {

class Runtime;
class TcpComm;

class HierarchicalComm : public Comm {
 public:
  static Status create(Runtime& runtime, const std::vector<int>& ranks, int my, const std::string& key,
                       std::shared_ptr<TcpComm> flat, size_t small_message_bytes, Deadline deadline,
                       std::shared_ptr<Comm>* out);

  int rank() const override;
  int size() const override;
  const std::vector<int>& world_ranks() const override;
  std::string path() const override { return "hierarchical"; }

  Status allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale, double postscale,
                   Deadline deadline, const std::string& what) override;
  Status allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype, Deadline deadline,
                    const std::string& what) override;
  Status broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline, const std::string& what) override;
  Status alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                   const std::string& what) override;
  Status reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype, int op,
                       double prescale, double postscale, Deadline deadline, const std::string& what) override;
  Status barrier(Deadline deadline, const std::string& what) override;
  void notify_peers() override;
  void notify_self() override;
  bool wait_notify(Deadline until) override;

 private:
  // One host's word on an operation, exchanged over the cross links: whether its shared-memory stage went
  // well, the descriptor of each of its members, and (small operations) its data.
  struct HostReport;
  Status allreduce_small(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                         double postscale, Deadline deadline, const std::string& what);
  Status allreduce_sliced(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                          double postscale, Deadline deadline, const std::string& what);
  Status allreduce_leaders(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                           double postscale, Deadline deadline, const std::string& what);
  Status allgather_small(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                         Deadline deadline, const std::string& what);

  // Agreement of the whole set on an operation (equal hosts). Every operation's first shared-memory step
  // carries its arguments, so members of a host that called different operations all see a mismatch
  // there (`local`); then they gather their descriptors. report() sends the host's report to every other
  // host and checks that all members agree, so that every member reaches the same verdict with the same
  // message; host h's payload (expected: `expect[h]` bytes) lands in `into`, hosts one after the other.
  Status report(const OpDesc& desc, const Status& local, const void* payload, const std::vector<size_t>& expect,
                char* into, Deadline deadline, const std::string& what);
  // report() for operations whose data moves over the flat mesh: a shared-memory step that gathers the
  // descriptors is their first step.
  Status agree(const OpDesc& desc, Deadline deadline, const std::string& what);
  // The descriptors of this host's members, in local order (a sum-allgather over shared memory).
  Status local_descs(const OpDesc& mine, std::vector<OpDesc>* descs, Deadline deadline, const std::string& what);
  Status exchange_reports(const std::vector<OpDesc>& descs, bool local_ok, const void* payload,
                          const std::vector<size_t>& expect, char* into, Deadline deadline, const std::string& what);
  // Whether every member of this host got through `status` without error, as one shared-memory step.
  Status host_verdict(const Status& status, Deadline deadline, const std::string& what);

  std::shared_ptr<TcpComm> flat_;
  std::shared_ptr<Comm> local_;      // members on this host (ShmComm, or a TcpComm of one)
  std::shared_ptr<TcpComm> cross_;   // member i of every host (equal members per host), else null
  std::shared_ptr<TcpComm> leaders_;  // unequal hosts: the first member of each host; null on the others
  std::vector<std::vector<int>> members_;  // comm ranks of each host, hosts in order of their first member
  size_t small_message_bytes_ = 65536;
};

}  // namespace hpcdl
