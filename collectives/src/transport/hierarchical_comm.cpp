#include "transport/hierarchical_comm.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"
#include "runtime.h"
#include "transport/shm_comm.h"
#include "transport/tcp_comm.h"

namespace hpcdl {
namespace {

// A member's descriptor as four int64 words: what the shared-memory gather and the cross links carry.
constexpr int kDescWords = 4;

void put_desc(const OpDesc& d, int64_t* words) {
  words[0] = d.type;
  words[1] = d.dtype;
  words[2] = d.op;
  words[3] = d.count;
}

OpDesc get_desc(const int64_t* words) {
  return make_desc(int(words[0]), int(words[1]), int(words[2]), words[3]);
}

bool is_float(int dtype) {
  return dtype == HPCDL_FLOAT16 || dtype == HPCDL_BFLOAT16 || dtype == HPCDL_FLOAT32 || dtype == HPCDL_FLOAT64;
}

}  // namespace

// What a host sends every other host at the start of an allreduce: 16 bytes, its members' descriptors,
// then its payload.
struct HierarchicalComm::HostReport {
  int64_t local_ok;
  int64_t payload;
};

Status HierarchicalComm::create(Runtime& runtime, const std::vector<int>& ranks, int my, const std::string& key,
                                std::shared_ptr<TcpComm> flat, size_t small_message_bytes, Deadline deadline,
                                std::shared_ptr<Comm>* out) {
  std::shared_ptr<HierarchicalComm> c(new HierarchicalComm());
  c->flat_ = std::move(flat);
  c->small_message_bytes_ = small_message_bytes;
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
  // Integers scaled before the sum would be truncated once per stage: keep those on the flat ring.
  if (!is_float(dtype) && prescale != 1.0)
    return flat_->allreduce(send, recv, count, dtype, op, prescale, postscale, deadline, what);
  if (!cross_) return allreduce_leaders(send, recv, count, dtype, op, prescale, postscale, deadline, what);
  if (size_t(count) * dtype_bytes(dtype) <= small_message_bytes_ || count < int64_t(members_[0].size()))
    return allreduce_small(send, recv, count, dtype, op, prescale, postscale, deadline, what);
  return allreduce_sliced(send, recv, count, dtype, op, prescale, postscale, deadline, what);
}

Status HierarchicalComm::local_descs(const OpDesc& mine, std::vector<OpDesc>* descs, Deadline deadline,
                                     const std::string& what) {
  const int n = local_->size(), me = local_->rank();
  std::vector<int64_t> words(size_t(n * kDescWords), 0);
  put_desc(mine, words.data() + me * kDescWords);
  // Every member fills only its own words: the sum is everybody's descriptor, with identical arguments on
  // every member, so this step itself always agrees.
  Status st = local_->allreduce(words.data(), words.data(), int64_t(words.size()), HPCDL_INT64, HPCDL_SUM, 1.0, 1.0,
                                deadline, what + " [arguments within host]");
  if (!st.is_ok()) return st;
  descs->clear();
  for (int i = 0; i < n; ++i) descs->push_back(get_desc(words.data() + i * kDescWords));
  return Status::ok();
}

Status HierarchicalComm::exchange_reports(const std::vector<OpDesc>& descs, bool local_ok, const void* payload,
                                          const std::vector<size_t>& expect, char* into, Deadline deadline,
                                          const std::string& what) {
  const int hosts = cross_->size(), me = cross_->rank();
  const size_t per_host = members_[0].size(), words = per_host * kDescWords;
  std::vector<size_t> at(size_t(hosts) + 1, 0);
  for (int h = 0; h < hosts; ++h) at[size_t(h) + 1] = at[size_t(h)] + expect[size_t(h)];
  std::vector<HostReport> reports(static_cast<size_t>(hosts));
  std::vector<int64_t> all(words * size_t(hosts), 0);
  reports[size_t(me)] = {local_ok ? 1 : 0, local_ok ? int64_t(expect[size_t(me)]) : 0};
  for (size_t i = 0; i < descs.size() && i < per_host; ++i)
    put_desc(descs[i], all.data() + size_t(me) * words + i * kDescWords);
  std::vector<std::vector<char>> stray(static_cast<size_t>(hosts));
  Schedule s;
  for (int h = 0; h < hosts; ++h) {
    if (h == me) continue;
    s.send(h, &reports[size_t(me)], sizeof(HostReport));
    s.send(h, all.data() + size_t(me) * words, words * sizeof(int64_t));
    if (reports[size_t(me)].payload) s.send(h, payload, expect[size_t(me)]);
    const int payload_item = int(s.recvs().size()) + 2;
    s.recv(h, &reports[size_t(h)], sizeof(HostReport), [&, h, payload_item]() {
      const size_t theirs = size_t(std::max<int64_t>(0, reports[size_t(h)].payload));
      if (theirs == expect[size_t(h)] && into) {
        s.set_recv(payload_item, into + at[size_t(h)], theirs);
        return Status::ok();
      }
      try {
        stray[size_t(h)].resize(theirs);
      } catch (const std::bad_alloc&) {
        return Status::error(HPCDL_ERR_INTERNAL, what + ": the host of rank " +
                                                     std::to_string(world_ranks()[size_t(members_[size_t(h)][0])]) +
                                                     " announced " + std::to_string(theirs) + " bytes");
      }
      s.set_recv(payload_item, stray[size_t(h)].data(), theirs);
      return Status::ok();
    });
    s.recv(h, all.data() + size_t(h) * words, words * sizeof(int64_t));
    s.recv(h, nullptr, 0);
  }
  Status st = cross_->run(s, deadline, what + " [across hosts]");
  if (!st.is_ok()) return st;
  // Every member's descriptor, in the order of the set: the verdict (and its message) is the same everywhere.
  std::vector<OpDesc> everyone(static_cast<size_t>(size()));
  for (int h = 0; h < hosts; ++h)
    for (size_t i = 0; i < per_host; ++i)
      everyone[size_t(members_[size_t(h)][i])] = get_desc(all.data() + size_t(h) * words + i * kDescWords);
  for (OpDesc& d : everyone) d.vec.assign(size_t(2 * size()), 0);
  st = check_descs(everyone, world_ranks(), what);
  if (!st.is_ok()) return st;
  for (int h = 0; h < hosts; ++h) {
    if (!reports[size_t(h)].local_ok)
      return Status::error(HPCDL_ERR_INTERNAL, what + ": the shared-memory stage failed on the host of rank " +
                                                   std::to_string(world_ranks()[size_t(members_[size_t(h)][0])]) +
                                                   " (see its error)");
    if (size_t(reports[size_t(h)].payload) != expect[size_t(h)])
      return Status::error(HPCDL_ERR_MISMATCH, what + ": the ranks on the host of rank " +
                                                   std::to_string(world_ranks()[size_t(members_[size_t(h)][0])]) +
                                                   " sent " + std::to_string(reports[size_t(h)].payload) +
                                                   " bytes where " + std::to_string(expect[size_t(h)]) +
                                                   " were expected; every rank must pass the same counts");
  }
  return Status::ok();
}

Status HierarchicalComm::report(const OpDesc& desc, const Status& local, const void* payload,
                                const std::vector<size_t>& expect, char* into, Deadline deadline,
                                const std::string& what) {
  if (!local.is_ok() && local.code != HPCDL_ERR_MISMATCH) return local;
  // Members that got through the step called the same operation: no need to say what each called.
  std::vector<OpDesc> descs(members_[0].size(), desc);
  if (!local.is_ok()) {
    Status st = local_descs(desc, &descs, deadline, what);
    if (!st.is_ok()) return st;
  }
  return exchange_reports(descs, local.is_ok(), payload, expect, into, deadline, what);
}

Status HierarchicalComm::agree(const OpDesc& desc, Deadline deadline, const std::string& what) {
  std::vector<OpDesc> descs;
  Status local = local_descs(desc, &descs, deadline, what);
  if (local.code == HPCDL_ERR_MISMATCH) {  // a member of this host called another operation: gather again
    Status st = local_descs(desc, &descs, deadline, what);
    if (!st.is_ok()) return st;
  } else if (!local.is_ok()) {
    return local;
  }
  const std::vector<size_t> none(static_cast<size_t>(cross_->size()), 0);
  return exchange_reports(descs, local.is_ok(), nullptr, none, nullptr, deadline, what);
}

Status HierarchicalComm::host_verdict(const Status& status, Deadline deadline, const std::string& what) {
  const int n = local_->size(), me = local_->rank();
  std::vector<int64_t> codes(static_cast<size_t>(n), 0);
  codes[size_t(me)] = status.code;
  Status st = local_->allreduce(codes.data(), codes.data(), n, HPCDL_INT64, HPCDL_SUM, 1.0, 1.0, deadline,
                                what + " [outcome within host]");
  if (!st.is_ok()) return st;
  if (!status.is_ok()) return status;
  for (int i = 0; i < n; ++i)
    if (codes[size_t(i)] != HPCDL_OK)
      return Status::error(int(codes[size_t(i)]), what + ": failed across hosts on rank " +
                                                      std::to_string(local_->world_ranks()[size_t(i)]) +
                                                      " of this host (see its error)");
  return Status::ok();
}

// Small: one shared-memory step sums the host, one round over the cross links swaps the host sums (and the
// members' descriptors), and every member reduces the host sums in host order (bitwise the same everywhere).
Status HierarchicalComm::allreduce_small(const void* send, void* recv, int64_t count, int dtype, int op,
                                         double prescale, double postscale, Deadline deadline,
                                         const std::string& what) {
  const int hosts = cross_->size(), me = cross_->rank();
  const size_t bytes = size_t(count) * dtype_bytes(dtype);
  const int partial = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
  Status local = local_->allreduce(send, recv, count, dtype, partial, prescale, 1.0, deadline, what + " [within host]");
  std::vector<char> sums(bytes * size_t(hosts));
  Status st = report(make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), local, recv,
                     std::vector<size_t>(size_t(hosts), bytes), sums.data(), deadline, what);
  if (!st.is_ok()) return st;
  std::vector<const void*> srcs(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) srcs[size_t(h)] = h == me ? recv : sums.data() + bytes * size_t(h);
  reduce(recv, srcs.data(), hosts, count, dtype, op, 1.0, postscale, size());
  return Status::ok();
}

// Large: reduce-scatter within the host into one slice per member, agree across hosts (one round), allreduce
// each slice over its owners' ring across hosts (all slices at once), gather the slices within the host.
Status HierarchicalComm::allreduce_sliced(const void* send, void* recv, int64_t count, int dtype, int op,
                                          double prescale, double postscale, Deadline deadline,
                                          const std::string& what) {
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
  char* mine = static_cast<char*>(recv) + size_t(std::min<int64_t>(int64_t(me) * step, count)) * es;
  Status local = local_->reducescatter(send, mine, counts, dtype, partial, prescale, 1.0, deadline,
                                       what + " [within host]");
  Status st = report(make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), local, nullptr,
                     std::vector<size_t>(size_t(cross_->size()), 0), nullptr, deadline, what);
  if (!st.is_ok()) return st;
  Status across = Status::ok();
  if (counts[size_t(me)] > 0)
    across = p2p_ring_allreduce(*cross_, mine, mine, counts[size_t(me)], dtype, op, 1.0, postscale, size(), deadline,
                                what + " [across hosts]");
  // Every member learns whether every slice made it before waiting for them in the gather.
  st = host_verdict(across, deadline, what);
  if (!st.is_ok()) return st;
  return local_->allgatherv(mine, recv, counts, dtype, deadline, what + " [within host]");
}

// Hosts with different numbers of members: sum within the host, allreduce between one leader per host,
// broadcast within the host. The whole set agrees first, so that a disagreement fails every rank at once
// instead of leaving the leaders of agreeing hosts waiting for a host whose ranks already gave up.
Status HierarchicalComm::allreduce_leaders(const void* send, void* recv, int64_t count, int dtype, int op,
                                           double prescale, double postscale, Deadline deadline,
                                           const std::string& what) {
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
  if (!cross_) return flat_->allgatherv(send, recv, counts, dtype, deadline, what);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (size_t(total) * dtype_bytes(dtype) <= small_message_bytes_)
    return allgather_small(send, recv, counts, dtype, deadline, what);
  Status st = agree(make_desc(HPCDL_OP_ALLGATHER, dtype, 0, counts[size_t(rank())]), deadline, what);
  return st.is_ok() ? flat_->allgatherv(send, recv, counts, dtype, deadline, what) : st;
}

// Small: gather within the host over shared memory, swap the hosts' blocks over the cross links in one
// round, and put every member's piece in its place.
Status HierarchicalComm::allgather_small(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                                         Deadline deadline, const std::string& what) {
  const int hosts = cross_->size(), me = cross_->rank();
  const size_t es = dtype_bytes(dtype);
  std::vector<size_t> expect(static_cast<size_t>(hosts), 0), at(static_cast<size_t>(hosts) + 1, 0);
  for (int h = 0; h < hosts; ++h) {
    for (int m : members_[size_t(h)]) expect[size_t(h)] += size_t(counts[size_t(m)]) * es;
    at[size_t(h) + 1] = at[size_t(h)] + expect[size_t(h)];
  }
  std::vector<char> blocks(at.back());
  std::vector<int64_t> local_counts;
  for (int m : members_[size_t(me)]) local_counts.push_back(counts[size_t(m)]);
  Status local = local_->allgatherv(send, blocks.data() + at[size_t(me)], local_counts, dtype, deadline,
                                    what + " [within host]");
  Status st = report(make_desc(HPCDL_OP_ALLGATHER, dtype, 0, counts[size_t(rank())]), local,
                     blocks.data() + at[size_t(me)], expect, blocks.data(), deadline, what);
  if (!st.is_ok()) return st;
  std::vector<size_t> offset(static_cast<size_t>(size()) + 1, 0);
  for (int q = 0; q < size(); ++q) offset[size_t(q) + 1] = offset[size_t(q)] + size_t(counts[size_t(q)]) * es;
  auto* out = static_cast<char*>(recv);
  for (int h = 0; h < hosts; ++h) {
    size_t from = at[size_t(h)];
    for (int m : members_[size_t(h)]) {
      const size_t len = size_t(counts[size_t(m)]) * es;
      if (len) std::memcpy(out + offset[size_t(m)], blocks.data() + from, len);
      from += len;
    }
  }
  return Status::ok();
}

// The other collectives move their data over the flat mesh, after the same agreement as allreduce's (so
// that a rank calling one of them while the others allreduce fails with them instead of waiting).
Status HierarchicalComm::broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                                   const std::string& what) {
  if (cross_) {
    Status st = agree(make_desc(HPCDL_OP_BROADCAST, dtype, root, count), deadline, what);
    if (!st.is_ok()) return st;
  }
  return flat_->broadcast(buf, count, dtype, root, deadline, what);
}
Status HierarchicalComm::alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                   const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                                   const std::string& what) {
  if (cross_) {
    Status st = agree(make_desc(HPCDL_OP_ALLTOALL, dtype, 0, 0), deadline, what);
    if (!st.is_ok()) return st;
  }
  return flat_->alltoallv(send, send_counts, recv, recv_counts, dtype, deadline, what);
}
Status HierarchicalComm::reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                                       int dtype, int op, double prescale, double postscale, Deadline deadline,
                                       const std::string& what) {
  if (cross_) {
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    Status st = agree(make_desc(HPCDL_OP_REDUCESCATTER, dtype, op, total), deadline, what);
    if (!st.is_ok()) return st;
  }
  return flat_->reducescatter(send, recv, recv_counts, dtype, op, prescale, postscale, deadline, what);
}
// Equal hosts: the agreement itself is a barrier (a host reports only once all its members arrived).
Status HierarchicalComm::barrier(Deadline deadline, const std::string& what) {
  if (!cross_) return flat_->barrier(deadline, what);
  return agree(make_desc(HPCDL_OP_BARRIER, 0, 0, 0), deadline, what);
}
void HierarchicalComm::notify_peers() { flat_->notify_peers(); }
void HierarchicalComm::notify_self() { flat_->notify_self(); }
bool HierarchicalComm::wait_notify(Deadline until) { return flat_->wait_notify(until); }

}  // namespace hpcdl
