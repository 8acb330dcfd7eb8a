#include "transport/tcp_comm.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/endpoint.h"
#include "net/socket.h"

namespace hpcdl {

Status TcpComm::create(Endpoint& endpoint, const std::vector<PeerInfo>& world, const std::vector<int>& world_ranks,
                       int my_rank, const std::string& key, const Params& params, Deadline deadline,
                       std::shared_ptr<TcpComm>* out) {
  std::shared_ptr<TcpComm> c(new TcpComm());
  c->rank_ = my_rank;
  c->size_ = int(world_ranks.size());
  c->world_ = world_ranks;
  c->small_message_bytes_ = params.small_message_bytes;
  c->spin_ = SocketSpin(params.spin);
  c->fds_.assign(world_ranks.size(), -1);
  c->ahead_.resize(world_ranks.size());
  c->bell_fds_.assign(world_ranks.size(), -1);
  for (int w : world_ranks) c->hosts_.push_back(world[size_t(w)].host);
  c->spans_hosts_ =
      std::any_of(c->hosts_.begin(), c->hosts_.end(), [&](const std::string& h) { return h != c->hosts_[0]; });
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
  if (params.send_buffer_bytes > 0)
    for (int fd : c->fds_)
      if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &params.send_buffer_bytes, sizeof params.send_buffer_bytes);
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

namespace {

// The items of one peer and direction, in order: a send lane or a receive lane of the schedule.
struct Lane {
  int peer;
  int fd;
  std::vector<int> items;
  size_t next = 0;   // first unfinished item
  size_t done = 0;   // bytes of it already moved
  bool waiting = false;  // the socket had no room (send) or nothing (receive) at the last try
  bool finished() const { return next == items.size(); }
};

// How much one lane moves before the others get a turn, so that a busy direction cannot starve the other.
constexpr size_t kTurnBytes = 1 << 20;
// A receive short of this many bytes reads as many into its peer's read-ahead buffer: a small payload comes
// with its descriptor, and a large one goes straight to its place after the first few bytes (read ahead
// into 64 KiB, an exchange's 64 KiB payload took 8-14 us longer for the extra copy).
constexpr size_t kReadAheadBytes = 4096;
constexpr int kMaxGather = 16;

}  // namespace

// Moves every lane as far as its socket and its dependencies allow, and sleeps in poll() only when no lane
// can move: a ring's sends, receives and reductions overlap, and a small exchange with every peer costs
// one round trip. Consecutive ready sends of a lane go out in one sendmsg() straight from their buffers.
// Before it sleeps, a wait polls its sockets for a short window while that pays (see SocketSpin). A small
// schedule (at most twice small_message_bytes to any one peer: the exchange path with its descriptor, the
// engine's control messages) waits for its peers, so an answer that comes late makes its later waits, and
// those of the next schedules, sleep at once for a while. A large one waits for the wire: a wait that
// outlasts the window sleeps, and the next polls again (between two hosts, 256 KiB allreduces 30 % faster
// and 1 MiB ones 10-15 %, 4-64 MiB the same: benchmarks/README.md).
Status TcpComm::run(Schedule& schedule, Deadline deadline, const std::string& what) {
  auto& sends = schedule.sends();
  auto& recvs = schedule.recvs();
  std::vector<Lane> out, in;
  std::vector<int> out_of(size_t(size_), -1), in_of(size_t(size_), -1);
  auto lane = [&](std::vector<Lane>& lanes, std::vector<int>& of, int peer) -> Lane& {
    if (of[size_t(peer)] < 0) {
      of[size_t(peer)] = int(lanes.size());
      lanes.push_back(Lane{peer, fds_[size_t(peer)], {}});
    }
    return lanes[size_t(of[size_t(peer)])];
  };
  for (size_t i = 0; i < sends.size(); ++i) lane(out, out_of, sends[i].peer).items.push_back(int(i));
  for (size_t i = 0; i < recvs.size(); ++i) lane(in, in_of, recvs[i].peer).items.push_back(int(i));
  std::vector<char> complete(recvs.size(), 0);
  size_t open = out.size() + in.size();

  auto pump_out = [&](Lane& l, bool* moved) -> Status {
    size_t budget = kTurnBytes;
    while (!l.finished() && budget > 0) {
      const Schedule::Item& head = sends[size_t(l.items[l.next])];
      if (head.after >= 0 && !complete[size_t(head.after)]) return Status::ok();
      if (l.done == head.len) {
        ++l.next;
        l.done = 0;
        if (l.finished()) --open;
        continue;
      }
      iovec iov[kMaxGather];
      int k = 0;
      for (size_t j = l.next; j < l.items.size() && k < kMaxGather; ++j) {
        const Schedule::Item& it = sends[size_t(l.items[j])];
        if (it.after >= 0 && !complete[size_t(it.after)]) break;
        const size_t skip = j == l.next ? l.done : 0;
        if (it.len > skip) iov[k++] = {it.data + skip, it.len - skip};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = size_t(k);
      const ssize_t sent = sendmsg(l.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          l.waiting = true;
          return Status::ok();
        }
        return peer_lost(peer_name(l.peer), what, errno_text(errno));
      }
      *moved = true;
      l.waiting = false;
      budget -= std::min(budget, size_t(sent));
      for (size_t left = size_t(sent); left > 0;) {  // advance over the items the bytes covered
        const Schedule::Item& it = sends[size_t(l.items[l.next])];
        const size_t take = std::min(left, it.len - l.done);
        l.done += take;
        left -= take;
        if (l.done == it.len) {
          ++l.next;
          l.done = 0;
        }
      }
      if (l.finished()) --open;
    }
    return Status::ok();
  };

  auto pump_in = [&](Lane& l, bool* moved) -> Status {
    size_t budget = kTurnBytes;
    while (!l.finished() && budget > 0) {
      const int index = l.items[l.next];
      Schedule::Item& head = recvs[size_t(index)];
      if (l.done == head.len) {
        if (head.action) {
          Status st = head.action();
          if (!st.is_ok()) return st;
        }
        complete[size_t(index)] = 1;
        ++l.next;
        l.done = 0;
        *moved = true;
        if (l.finished()) --open;
        continue;
      }
      const size_t want = head.len - l.done;
      ReadAhead& ahead = ahead_[size_t(l.peer)];
      if (ahead.len > 0) {  // bytes read earlier come first
        const size_t take = std::min(ahead.len, want);
        std::memcpy(head.data + l.done, ahead.buf.data() + ahead.at, take);
        ahead.at += take;
        ahead.len -= take;
        l.done += take;
        *moved = true;
        continue;
      }
      const bool read_ahead = want < kReadAheadBytes;
      if (read_ahead && ahead.buf.empty()) ahead.buf.resize(kReadAheadBytes);
      const ssize_t got = read_ahead ? recv(l.fd, ahead.buf.data(), ahead.buf.size(), MSG_DONTWAIT)
                                     : recv(l.fd, head.data + l.done, want, MSG_DONTWAIT);
      if (got > 0 && read_ahead) {
        ahead.at = 0;
        ahead.len = size_t(got);
        l.waiting = false;
        *moved = true;
        continue;
      }
      if (got > 0) {
        l.done += size_t(got);
        budget -= std::min(budget, size_t(got));
        l.waiting = false;
        *moved = true;
        continue;
      }
      if (got == 0) return peer_lost(peer_name(l.peer), what, "connection closed");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        l.waiting = true;
        return Status::ok();
      }
      return peer_lost(peer_name(l.peer), what, errno_text(errno));
    }
    return Status::ok();
  };

  size_t most_to_one = 0;  // the most this schedule sends to one peer
  for (const Lane& l : out) {
    size_t bytes = 0;
    for (int i : l.items) bytes += sends[size_t(i)].len;
    most_to_one = std::max(most_to_one, bytes);
  }
  const bool small = most_to_one <= 2 * small_message_bytes_;
  bool may_spin = true, spinning = false;
  Clock::time_point spin_start, last_look;
  struct DropRing {  // a ring not due when the schedule ends is not needed: every peer took part
    LateRing& ring;
    ~DropRing() { ring.drop(); }
  } drop_ring{late_ring_};
  std::vector<pollfd> fds;
  while (true) {
    bool moved = false;
    // Sends first: at the start nothing can have arrived yet (a receive would only say so).
    for (Lane& l : out) {
      Status st = pump_out(l, &moved);
      if (!st.is_ok()) return st;
    }
    for (Lane& l : in) {
      Status st = pump_in(l, &moved);
      if (!st.is_ok()) return st;
    }
    if (spinning && (moved || open == 0)) {
      spin_.ended(Clock::now() - last_look < SocketSpin::kPreempted ? SocketSpin::Outcome::kInTime
                                                                     : SocketSpin::Outcome::kPreempted);
      spinning = false;
    }
    if (open == 0) return Status::ok();
    if (moved) continue;
    if (may_spin && !spinning && spin_.poll_first()) {
      spinning = true;
      spin_start = last_look = Clock::now();
    }
    if (spinning) {
      const auto now = Clock::now();
      const bool preempted = now - last_look >= SocketSpin::kPreempted;
      last_look = now;
      late_ring_.ring_if_due(*this, now);
      if (!preempted && now - spin_start < spin_.window()) {
        cpu_relax();
        continue;
      }
      spinning = false;
      if (preempted || small) {
        spin_.ended(preempted ? SocketSpin::Outcome::kPreempted : SocketSpin::Outcome::kLate);
        may_spin = false;  // the rest of this schedule sleeps
      }
    }
    // Nothing could move: sleep until a socket has room for a ready send or bytes for a receive.
    late_ring_.ring_if_due(*this, Clock::time_point::max());
    fds.clear();
    for (const Lane& l : in)
      if (!l.finished()) fds.push_back({l.fd, POLLIN, 0});
    for (const Lane& l : out) {
      if (l.finished() || !l.waiting) continue;
      auto same = std::find_if(fds.begin(), fds.end(), [&](const pollfd& p) { return p.fd == l.fd; });
      if (same != fds.end())
        same->events |= POLLOUT;
      else
        fds.push_back({l.fd, POLLOUT, 0});
    }
    if (fds.empty())
      return Status::error(HPCDL_ERR_INTERNAL, what + ": the schedule waits on itself (a send after a receive "
                                                      "that never comes); this is a bug in hpcdl");
    const int timeout = poll_timeout_ms(deadline);
    const int rc = timeout == 0 ? 0 : poll(fds.data(), nfds_t(fds.size()), timeout);
    if (rc < 0 && errno != EINTR) return Status::error(HPCDL_ERR_INTERNAL, "poll(): " + errno_text(errno));
    if (rc == 0 && Clock::now() >= deadline) {
      for (const Lane& l : in)
        if (!l.finished()) return peer_timed_out(peer_name(l.peer), what, "receiving from");
      for (const Lane& l : out)
        if (!l.finished()) return peer_timed_out(peer_name(l.peer), what, "sending to");
    }
  }
}

char* TcpComm::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
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
Status TcpComm::allreduce_segments(const std::vector<Segment>& segments, int dtype, int op, double prescale,
                                   double postscale, Deadline deadline, const std::string& what) {
  HPCDL_TCP_OP(p2p_allreduce_segments(*this, segments, dtype, op, prescale, postscale, small_message_bytes_, deadline,
                                      what));
}
Status TcpComm::allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                           Deadline deadline, const std::string& what) {
  HPCDL_TCP_OP(p2p_allgatherv(*this, send, recv, counts, dtype, small_message_bytes_, deadline, what));
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
