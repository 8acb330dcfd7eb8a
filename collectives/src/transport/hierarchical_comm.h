// For process sets that span hosts: allreduce in three stages (shared memory within each host, TCP
// between one leader per host, shared-memory broadcast back); every other op goes over the flat TCP mesh.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm.h"

namespace hpcdl {

class Runtime;
class ShmComm;
class TcpComm;

class HierarchicalComm : public Comm {
 public:
  static Status create(Runtime& runtime, const std::vector<int>& ranks, int my, const std::string& key,
                       std::shared_ptr<TcpComm> flat, Deadline deadline, std::shared_ptr<Comm>* out);

  int rank() const override;
  int size() const override;
  const std::vector<int>& world_ranks() const override;

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
  void notify_peers(uint32_t cycle) override;
  void notify_self() override;
  Bell wait_notify(uint32_t cycle, Deadline until) override;

 private:
  std::shared_ptr<TcpComm> flat_;
  std::shared_ptr<Comm> local_;    // members on this host (ShmComm, or a TcpComm of one)
  std::shared_ptr<TcpComm> leaders_;  // the first member of each host; null on non-leaders
};

}  // namespace hpcdl
