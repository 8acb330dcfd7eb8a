#include "transport/hierarchical_comm.h"

#include <algorithm>
#include <map>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"
#include "runtime.h"
#include "transport/shm_comm.h"
#include "transport/tcp_comm.h"

namespace hpcdl {

Status HierarchicalComm::create(Runtime& runtime, const std::vector<int>& ranks, int my, const std::string& key,
                                std::shared_ptr<TcpComm> flat, Deadline deadline, std::shared_ptr<Comm>* out) {
  std::shared_ptr<HierarchicalComm> c(new HierarchicalComm());
  c->flat_ = std::move(flat);
  const auto& peers = runtime.peers();
  const std::string& my_host = peers[size_t(ranks[size_t(my)])].host;
  std::vector<int> local, leaders;
  std::map<std::string, bool> seen;
  for (int r : ranks) {
    const std::string& h = peers[size_t(r)].host;
    if (h == my_host) local.push_back(r);
    if (!seen[h]) {
      seen[h] = true;
      leaders.push_back(r);
    }
  }
  int local_rank = int(std::find(local.begin(), local.end(), ranks[size_t(my)]) - local.begin());
  if (local.size() > 1) {
    std::shared_ptr<ShmComm> shm;
    Status st = runtime.make_shm_comm(local, local_rank, key + "/local", Channel::kDirect, deadline, &shm);
    if (!st.is_ok()) return st;
    c->local_ = shm;
  } else {
    std::shared_ptr<TcpComm> self;
    Status st = runtime.make_tcp_comm(local, 0, key + "/local", deadline, &self);
    if (!st.is_ok()) return st;
    c->local_ = self;
  }
  if (local_rank == 0) {
    int leader_rank = int(std::find(leaders.begin(), leaders.end(), ranks[size_t(my)]) - leaders.begin());
    Status st = runtime.make_tcp_comm(leaders, leader_rank, key + "/leaders", deadline, &c->leaders_);
    if (!st.is_ok()) return st;
  }
  *out = c;
  return Status::ok();
}

int HierarchicalComm::rank() const { return flat_->rank(); }
int HierarchicalComm::size() const { return flat_->size(); }
const std::vector<int>& HierarchicalComm::world_ranks() const { return flat_->world_ranks(); }

Status HierarchicalComm::allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                                   double postscale, Deadline deadline, const std::string& what) {
  // Integers scaled before the sum would be truncated once per stage: keep those on the flat ring.
  const bool is_float = dtype == HPCDL_FLOAT16 || dtype == HPCDL_BFLOAT16 || dtype == HPCDL_FLOAT32 ||
                        dtype == HPCDL_FLOAT64;
  if (!is_float && prescale != 1.0)
    return flat_->allreduce(send, recv, count, dtype, op, prescale, postscale, deadline, what);
  // Agree across the whole set first, so a disagreement fails every rank at once instead of leaving the
  // leaders of agreeing hosts waiting for a host whose ranks already gave up.
  Status st = p2p_agree(*flat_, make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what);
  if (!st.is_ok()) return st;
  const int partial = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
  st = local_->allreduce(send, recv, count, dtype, partial, prescale, 1.0, deadline, what + " [within host]");
  if (!st.is_ok()) return st;
  int32_t code = HPCDL_OK;
  Status cross;
  if (leaders_) {
    cross = leaders_->allreduce(recv, recv, count, dtype, partial, 1.0, 1.0, deadline, what + " [across hosts]");
    code = cross.code;
  }
  // Non-leaders learn the outcome first, so that a failure across hosts never leaves them waiting.
  st = local_->broadcast(&code, 1, HPCDL_INT32, 0, deadline, what + " [host result]");
  if (!st.is_ok()) return st;
  if (code != HPCDL_OK) {
    if (leaders_) return cross;
    return Status::error(code, what + ": failed across hosts on this host's leader, rank " +
                                   std::to_string(local_->world_ranks()[0]) + " (see its error)");
  }
  st = local_->broadcast(recv, count, dtype, 0, deadline, what + " [within host]");
  if (!st.is_ok()) return st;
  if (op == HPCDL_AVERAGE || postscale != 1.0) {
    const void* self[1] = {recv};
    reduce(recv, self, 1, count, dtype, op, 1.0, postscale, size());
  }
  return Status::ok();
}

Status HierarchicalComm::allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                                    Deadline deadline, const std::string& what) {
  return flat_->allgatherv(send, recv, counts, dtype, deadline, what);
}
Status HierarchicalComm::broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                                   const std::string& what) {
  return flat_->broadcast(buf, count, dtype, root, deadline, what);
}
Status HierarchicalComm::alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                   const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                                   const std::string& what) {
  return flat_->alltoallv(send, send_counts, recv, recv_counts, dtype, deadline, what);
}
Status HierarchicalComm::reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                                       int dtype, int op, double prescale, double postscale, Deadline deadline,
                                       const std::string& what) {
  return flat_->reducescatter(send, recv, recv_counts, dtype, op, prescale, postscale, deadline, what);
}
Status HierarchicalComm::barrier(Deadline deadline, const std::string& what) { return flat_->barrier(deadline, what); }
void HierarchicalComm::notify_peers(uint32_t cycle) { flat_->notify_peers(cycle); }
void HierarchicalComm::notify_self() { flat_->notify_self(); }
Comm::Bell HierarchicalComm::wait_notify(uint32_t cycle, Deadline until) { return flat_->wait_notify(cycle, until); }

}  // namespace hpcdl
