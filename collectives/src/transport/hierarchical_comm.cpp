#include "transport/hierarchical_comm.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"
#include "runtime.h"
#include "transport/shm_comm.h"
#include "transport/tcp_comm.h"

namespace hpcdl {
namespace {

bool is_float(int dtype) {
  return dtype == HPCDL_FLOAT16 || dtype == HPCDL_BFLOAT16 || dtype == HPCDL_FLOAT32 || dtype == HPCDL_FLOAT64;
}

// A member's outcome of a stage, passed to the other members of its host in one shared-memory step: its code
// and the start of its message, so that each of them can say what failed (which rank was lost, which timed
// out) rather than only that a host-mate failed.
struct Outcome {
  int32_t code = HPCDL_OK;
  char message[508] = {};
};

Outcome outcome_of(const Status& status) {
  Outcome o;
  o.code = status.code;
  status.message.copy(o.message, sizeof(o.message) - 1);
  return o;
}

// A host-mate's failure, told by another member: `what`, who saw it, and the rest of its message.
Status retold(const Outcome& o, const std::string& what, int world_rank, const std::string& who) {
  const std::string message(o.message, strnlen(o.message, sizeof(o.message)));
  const std::string rest = message.compare(0, what.size(), what) == 0 ? message.substr(what.size()) : ": " + message;
  return Status::error(o.code, what + " (seen by " + who + ", rank " + std::to_string(world_rank) + ")" + rest);
}

}  // namespace

Status HierarchicalComm::create(Runtime& runtime, const std::vector<int>& ranks, int my, const std::string& key,
                                std::shared_ptr<TcpComm> flat, size_t min_bytes, Deadline deadline,
                                std::shared_ptr<Comm>* out) {
  std::shared_ptr<HierarchicalComm> c(new HierarchicalComm());
  c->flat_ = std::move(flat);
  c->min_bytes_ = min_bytes;
  const auto& peers = runtime.peers();
  std::map<std::string, size_t> host_index;
  for (int i = 0; i < int(ranks.size()); ++i) {
    const std::string& h = peers[size_t(ranks[size_t(i)])].host;
    auto it = host_index.emplace(h, c->members_.size()).first;
    if (it->second == c->members_.size()) c->members_.emplace_back();
    c->members_[it->second].push_back(i);
  }
  const size_t my_host = host_index[peers[size_t(ranks[size_t(my)])].host];
  const std::vector<int>& mine = c->members_[my_host];
  const int local_rank = int(std::find(mine.begin(), mine.end(), my) - mine.begin());
  std::vector<int> local;
  for (int i : mine) local.push_back(ranks[size_t(i)]);
  if (local.size() > 1) {
    std::shared_ptr<ShmComm> shm;
    Status st = runtime.make_shm_comm(local, local_rank, key + "/local", Channel::kDirect, deadline, &shm);
    if (!st.is_ok()) return st;
    c->local_ = shm;
    c->local_shm_ = shm;
  } else {
    std::shared_ptr<TcpComm> self;
    Status st = runtime.make_tcp_comm(local, 0, key + "/local", deadline, &self);
    if (!st.is_ok()) return st;
    c->local_ = self;
  }
  bool equal = true;
  for (const auto& host : c->members_) equal = equal && host.size() == mine.size();
  std::vector<int> links;  // member local_rank of every host (equal hosts), or the first of every host
  for (const auto& host : c->members_) links.push_back(ranks[size_t(host[equal ? size_t(local_rank) : 0])]);
  if (equal || local_rank == 0) {
    std::shared_ptr<TcpComm> tcp;
    Status st = runtime.make_tcp_comm(links, int(my_host), key + (equal ? "/cross" : "/leaders"), deadline, &tcp);
    if (!st.is_ok()) return st;
    (equal ? c->cross_ : c->leaders_) = tcp;
  }
  *out = c;
  return Status::ok();
}

int HierarchicalComm::rank() const { return flat_->rank(); }
int HierarchicalComm::size() const { return flat_->size(); }
const std::vector<int>& HierarchicalComm::world_ranks() const { return flat_->world_ranks(); }

Status HierarchicalComm::allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                                   double postscale, Deadline deadline, const std::string& what) {
  // Smaller tensors: the flat mesh (one round with every rank when small, arguments and data together). The
  // shared-memory steps of the hierarchical path wait by spinning and yielding, which costs more than the
  // TCP messages they save wherever ranks outnumber cores (benchmarks/README.md). Integers scaled before the
  // sum would be truncated once per stage: those stay on the flat mesh too.
  if (goes_flat(count, dtype, prescale))
    return flat_->allreduce(send, recv, count, dtype, op, prescale, postscale, deadline, what);
  // The whole set agrees first over the flat mesh, where every other collective starts too, so that ranks
  // that called different collectives, or one with other arguments, all fail at once with one message.
  Status st = p2p_agree(*flat_, make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what);
  if (!st.is_ok()) return st;
  if (!cross_) return allreduce_leaders({Segment{send, recv, count}}, count, dtype, op, prescale, postscale, deadline,
                                        what);
  const size_t bytes = size_t(count) * dtype_bytes(dtype);
  return allreduce_sliced(Areas(send, bytes), Areas(recv, bytes), count, dtype, op, prescale, postscale, deadline,
                          what);
}

bool HierarchicalComm::goes_flat(int64_t count, int dtype, double prescale) const {
  return size_t(count) * dtype_bytes(dtype) < min_bytes_ || count < int64_t(size()) ||
         (!is_float(dtype) && prescale != 1.0);
}

// A fused batch: its tensors are read and written where they are, on the flat mesh as on either staged path.
Status HierarchicalComm::allreduce_segments(const std::vector<Segment>& segments, int dtype, int op,
                                            double prescale, double postscale, Deadline deadline,
                                            const std::string& what) {
  int64_t count = 0;
  for (const Segment& s : segments) count += s.count;
  if (goes_flat(count, dtype, prescale))
    return flat_->allreduce_segments(segments, dtype, op, prescale, postscale, deadline, what);
  Status st = p2p_agree(*flat_, make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what);
  if (!st.is_ok()) return st;
  if (!cross_) return allreduce_leaders(segments, count, dtype, op, prescale, postscale, deadline, what);
  const auto [send, recv] = segment_areas(segments, dtype_bytes(dtype));
  return allreduce_sliced(send, recv, count, dtype, op, prescale, postscale, deadline, what);
}

Status HierarchicalComm::host_verdict(const Status& status, Deadline deadline, const std::string& what) {
  const int n = local_->size();
  std::vector<Outcome> all(static_cast<size_t>(n));
  const Outcome mine = outcome_of(status);
  Status st = local_->allgather_slots(&mine, all.data(), sizeof(Outcome), deadline, what + " [outcome within host]");
  if (!st.is_ok()) return st;
  if (!status.is_ok()) return status;
  for (int i = 0; i < n; ++i)
    if (all[size_t(i)].code != HPCDL_OK)
      return retold(all[size_t(i)], what, local_->world_ranks()[size_t(i)], "a member of this host");
  return Status::ok();
}

// Large, equal hosts: reduce-scatter within the host into one slice per member, allreduce each slice over its
// owners' ring across hosts (all slices at once, each member's core and connection carrying 1/L of the
// traffic), gather the slices within the host.
Status HierarchicalComm::allreduce_sliced(const Areas& send, const Areas& recv, int64_t count, int dtype, int op,
                                          double prescale, double postscale, Deadline deadline,
                                          const std::string& what) {
  if (!local_shm_)  // one member per host: the ring across hosts is the whole allreduce
    return p2p_ring_allreduce(*cross_, send, recv, count, dtype, op, prescale, postscale, size(), deadline,
                              what + " [across hosts]");
  const int members = local_->size(), me = local_->rank();
  const size_t es = dtype_bytes(dtype);
  const int partial = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
  // Slices start on 64-byte boundaries, so that the kernels run aligned on each of them.
  const int64_t align = std::max<int64_t>(1, int64_t(64 / es));
  const int64_t slice = (count + members - 1) / members;
  const int64_t step = (slice + align - 1) / align * align;
  std::vector<int64_t> counts(static_cast<size_t>(members));
  for (int i = 0; i < members; ++i)
    counts[size_t(i)] = std::max<int64_t>(0, std::min<int64_t>(step, count - int64_t(i) * step));
  // This member's slice, in place in the output (over as many of its areas as it spans).
  const Areas mine = recv.window(size_t(std::min<int64_t>(int64_t(me) * step, count)) * es,
                                 size_t(counts[size_t(me)]) * es);
  Status st = local_shm_->reducescatter_areas(send, mine, counts, dtype, partial, prescale, 1.0, deadline,
                                              what + " [within host]");
  if (!st.is_ok()) return st;
  Status across = Status::ok();
  if (counts[size_t(me)] > 0)
    across = p2p_ring_allreduce(*cross_, mine, mine, counts[size_t(me)], dtype, op, 1.0, postscale, size(), deadline,
                                what + " [across hosts]");
  // Every member learns whether every slice made it before waiting for them in the gather.
  st = host_verdict(across, deadline, what);
  if (!st.is_ok()) return st;
  return local_shm_->allgatherv_areas(mine, recv, counts, dtype, deadline, what + " [within host]");
}

// Hosts with different numbers of members: sum within the host, allreduce between one leader per host,
// broadcast within the host; each stage reads and writes the segments where they are.
Status HierarchicalComm::allreduce_leaders(const std::vector<Segment>& segments, int64_t count, int dtype, int op,
                                           double prescale, double postscale, Deadline deadline,
                                           const std::string& what) {
  const int partial = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
  Status st = local_->allreduce_segments(segments, dtype, partial, prescale, 1.0, deadline, what + " [within host]");
  if (!st.is_ok()) return st;
  std::vector<Segment> sums;  // the host's sums, reduced across hosts in place
  for (const Segment& s : segments) sums.push_back(Segment{s.recv, s.recv, s.count});
  Status cross;
  if (leaders_)
    cross = leaders_->allreduce_segments(sums, dtype, partial, 1.0, 1.0, deadline, what + " [across hosts]");
  // Non-leaders learn the outcome first, so that a failure across hosts never leaves them waiting.
  Outcome outcome = outcome_of(cross);
  st = local_->broadcast(&outcome, int64_t(sizeof(outcome)), HPCDL_UINT8, 0, deadline, what + " [host result]");
  if (!st.is_ok()) return st;
  if (outcome.code != HPCDL_OK)
    return leaders_ ? cross : retold(outcome, what, local_->world_ranks()[0], "this host's leader");
  const Areas result = segment_areas(sums, dtype_bytes(dtype)).second;
  if (local_shm_) {
    st = local_shm_->broadcast_areas(result, count, dtype, 0, deadline, what + " [within host]");
    if (!st.is_ok()) return st;
  }
  if (op == HPCDL_AVERAGE || postscale != 1.0) {
    const size_t es = dtype_bytes(dtype);
    result.each(0, result.bytes(), [&](char* data, size_t, size_t len) {
      const void* self[1] = {data};
      reduce(data, self, 1, int64_t(len / es), dtype, op, 1.0, postscale, size());
    });
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
