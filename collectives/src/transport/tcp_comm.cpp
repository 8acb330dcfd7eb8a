#include "transport/tcp_comm.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/endpoint.h"
#include "net/socket.h"

namespace hpcdl {

Status TcpComm::create(Endpoint& endpoint, const std::vector<PeerInfo>& world, const std::vector<int>& world_ranks,
                       int my_rank, const std::string& key, size_t small_message_bytes, Deadline deadline,
                       std::shared_ptr<TcpComm>* out) {
  std::shared_ptr<TcpComm> c(new TcpComm());
  c->rank_ = my_rank;
  c->size_ = int(world_ranks.size());
  c->world_ = world_ranks;
  c->small_message_bytes_ = small_message_bytes;
  c->fds_.assign(world_ranks.size(), -1);
  c->bell_fds_.assign(world_ranks.size(), -1);
  for (int w : world_ranks) c->hosts_.push_back(world[size_t(w)].host);
  c->self_bell_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // The higher comm rank connects, the lower accepts (the listener thread queues early arrivals).
  for (int j = 0; j < my_rank; ++j) {
    const PeerInfo& peer = world[size_t(world_ranks[size_t(j)])];
    Status st = endpoint.connect(peer, key + "/data", deadline, &c->fds_[size_t(j)]);
    if (st.is_ok()) st = endpoint.connect(peer, key + "/bell", deadline, &c->bell_fds_[size_t(j)]);
    if (!st.is_ok()) return st;
  }
  for (int j = my_rank + 1; j < c->size_; ++j) {
    const PeerInfo& peer = world[size_t(world_ranks[size_t(j)])];
    Status st = endpoint.accept(peer, key + "/data", deadline, &c->fds_[size_t(j)]);
    if (st.is_ok()) st = endpoint.accept(peer, key + "/bell", deadline, &c->bell_fds_[size_t(j)]);
    if (!st.is_ok()) return st;
  }
  *out = std::move(c);
  return Status::ok();
}

TcpComm::~TcpComm() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
  for (int fd : bell_fds_)
    if (fd >= 0) close(fd);
  if (self_bell_ >= 0) close(self_bell_);
}

std::string TcpComm::peer_name(int r) const {
  return "rank " + std::to_string(world_[size_t(r)]) + " (host " + hosts_[size_t(r)] + ")";
}

Status TcpComm::check_usable() const {
  if (broken_.is_ok()) return Status::ok();
  return Status::error(broken_.code, "this communicator failed earlier and cannot be used any more (" +
                                         broken_.message + "); shut hpcdl down and restart the job");
}

Status TcpComm::guard(Status status) {
  if (status.code == HPCDL_ERR_TIMEOUT || status.code == HPCDL_ERR_PEER_LOST) broken_ = status;
  return status;
}

Status TcpComm::sendrecv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
                         Deadline deadline, const std::string& what) {
  int sfd = to >= 0 ? fds_[size_t(to)] : -1;
  int rfd = from >= 0 ? fds_[size_t(from)] : -1;
  return send_recv(sfd, send, send_bytes, to >= 0 ? peer_name(to) : "", rfd, recv, recv_bytes,
                   from >= 0 ? peer_name(from) : "", deadline, what);
}

#define HPCDL_TCP_OP(call)                  \
  do {                                      \
    Status usable = check_usable();         \
    if (!usable.is_ok()) return usable;     \
    return guard(call);                     \
  } while (0)

Status TcpComm::allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                          double postscale, Deadline deadline, const std::string& what) {
  HPCDL_TCP_OP(p2p_allreduce(*this, send, recv, count, dtype, op, prescale, postscale, small_message_bytes_,
                             deadline, what));
}
Status TcpComm::allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                           Deadline deadline, const std::string& what) {
  HPCDL_TCP_OP(p2p_allgatherv(*this, send, recv, counts, dtype, deadline, what));
}
Status TcpComm::broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                          const std::string& what) {
  HPCDL_TCP_OP(p2p_broadcast(*this, buf, count, dtype, root, deadline, what));
}
Status TcpComm::alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                          const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                          const std::string& what) {
  HPCDL_TCP_OP(p2p_alltoallv(*this, send, send_counts, recv, recv_counts, dtype, deadline, what));
}
Status TcpComm::reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype,
                              int op, double prescale, double postscale, Deadline deadline,
                              const std::string& what) {
  HPCDL_TCP_OP(p2p_reducescatter(*this, send, recv, recv_counts, dtype, op, prescale, postscale, deadline, what));
}
Status TcpComm::barrier(Deadline deadline, const std::string& what) {
  HPCDL_TCP_OP(p2p_barrier(*this, deadline, what));
}

// A ring is one byte: the low byte of the cycle it is for. A waiter for cycle c can only find rings for
// c - 127 .. c + 1 (no peer starts cycle c + 2 before this member took part in c + 1), so the byte tells the
// whole cycle number; the latest one rung is remembered in bell_.
void TcpComm::notify_peers(uint32_t cycle) {
  const char byte = static_cast<char>(cycle & 0xff);
  for (int fd : bell_fds_)
    if (fd >= 0) (void)!send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);  // a full pipe already rings
}

void TcpComm::notify_self() {
  uint64_t one = 1;
  (void)!write(self_bell_, &one, sizeof(one));
}

Comm::Bell TcpComm::wait_notify(uint32_t cycle, Deadline until) {
  std::vector<pollfd> fds;
  std::vector<size_t> owner;  // index into bell_fds_ of each polled doorbell (self: npos)
  fds.push_back({self_bell_, POLLIN, 0});
  owner.push_back(size_t(-1));
  if (bell_quiet_.size() != bell_fds_.size()) bell_quiet_.assign(bell_fds_.size(), false);
  for (size_t i = 0; i < bell_fds_.size(); ++i) {
    if (bell_fds_[i] < 0 || bell_quiet_[i]) continue;
    fds.push_back({bell_fds_[i], POLLIN, 0});
    owner.push_back(i);
  }
  auto rung_for = [&]() { return static_cast<int32_t>(bell_ - cycle) >= 0; };
  while (true) {
    if (rung_for()) return Bell::kRung;
    int rc = poll(fds.data(), nfds_t(fds.size()), poll_timeout_ms(until));
    if (rc > 0) {
      bool rung = false, poked = false;
      uint8_t buf[256];
      for (size_t k = 0; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        if (fds[k].fd == self_bell_) {
          uint64_t v;
          (void)!read(self_bell_, &v, sizeof(v));
          poked = true;
          continue;
        }
        const ssize_t n = recv(fds[k].fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0) {
          // The peer is gone: stop listening to its doorbell (the data ops report the loss by name), and
          // let the engine look (its next cycle fails, naming the peer).
          bell_quiet_[owner[k]] = true;
          rung = true;
        }
        for (ssize_t i = 0; i < n; ++i) {
          const uint32_t full = cycle + static_cast<int8_t>(static_cast<uint8_t>(buf[i] - (cycle & 0xff)));
          if (static_cast<int32_t>(full - bell_) > 0) bell_ = full;
        }
      }
      if (rung || rung_for()) return Bell::kRung;
      if (poked) return Bell::kPoked;
    }
    if (Clock::now() >= until) return Bell::kTimeout;
  }
}

}  // namespace hpcdl
