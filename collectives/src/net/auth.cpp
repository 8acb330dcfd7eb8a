#include "net/auth.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <vector>

#include "crypto/sha256.h"
#include "net/socket.h"

namespace hpcdl {
namespace {

constexpr char kMagic[8] = {'H', 'P', 'C', 'D', 'L', 'A', 'U', '1'};
constexpr size_t kClientFixed = 8 + 32 + 32 + 4;
// What the server sends instead of its MAC when the client's MAC is wrong (32 bytes with the final NUL).
constexpr char kAuthRefusal[32] = "HPCDL refuses: wrong job secret";
static_assert(sizeof(kAuthRefusal) == 32, "the refusal takes the place of a 32-byte MAC");

std::string bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

Digest client_mac(const std::string& secret, const uint8_t* nonce_s, const uint8_t* nonce_c,
                  const std::string& header) {
  return hmac_sha256(secret, "client" + bytes(nonce_s, 32) + bytes(nonce_c, 32) + header);
}

Digest server_mac(const std::string& secret, const uint8_t* nonce_s, const uint8_t* nonce_c,
                  const std::string& header) {
  return hmac_sha256(secret, "server" + bytes(nonce_c, 32) + bytes(nonce_s, 32) + header);
}

Digest session_key(const std::string& secret, const uint8_t* nonce_s, const uint8_t* nonce_c) {
  return hmac_sha256(secret, "session" + bytes(nonce_s, 32) + bytes(nonce_c, 32));
}

size_t descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > INT_MAX)
    return size_t(INT_MAX);
  return size_t(limit.rlim_cur);
}

bool out_of_descriptors(int err) { return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM; }

}  // namespace

size_t descriptor_reserve(size_t limit) { return std::max<size_t>(32, limit / 8); }

Status check_job_secret(const std::string& secret) {
  const std::string how = "'hpcdl run' and the scripts of 'hpcdl submit' make one; otherwise export the same random "
                          "value to every rank, e.g. export HPCDL_SECRET=$(python3 -c 'import secrets; "
                          "print(secrets.token_hex(32))')";
  if (secret.empty())
    return Status::error(HPCDL_ERR_INVALID, "the job has no secret: ranks that meet over TCP prove to each other "
                                            "that they hold the job's secret (HPCDL_SECRET). " + how);
  if (secret.size() < kMinSecretLength)
    return Status::error(HPCDL_ERR_INVALID, "the job's secret (HPCDL_SECRET) has " + std::to_string(secret.size()) +
                                                " characters: fewer than " + std::to_string(kMinSecretLength) +
                                                " can be guessed by trying them. " + how);
  return Status::ok();
}

Status auth_client(int fd, const std::string& secret, const std::string& header, Deadline deadline,
                   const std::string& peer, Digest* session) {
  const std::string what = "authenticating with " + peer;
  Status usable = check_job_secret(secret);
  if (!usable.is_ok()) return usable;
  if (header.size() > kMaxAuthHeader) return Status::error(HPCDL_ERR_INVALID, what + ": header too long");
  auto dropped = [&what](const char* when) {
    return Status::error(HPCDL_ERR_PEER_LOST, what + ": the server closed the connection " + when +
                                                  " (it was overloaded, restarting or shutting down)");
  };
  uint8_t challenge[40];
  Status st = recv_all(fd, challenge, sizeof(challenge), deadline, peer, what);
  if (st.code == HPCDL_ERR_PEER_LOST) return dropped("before sending its challenge");
  if (!st.is_ok()) return st;
  if (std::memcmp(challenge, kMagic, 8) != 0)
    return Status::error(HPCDL_ERR_AUTH, what + ": it does not speak hpcdl's protocol (wrong address or port?)");
  uint8_t nonce_c[32];
  st = random_bytes(nonce_c, sizeof(nonce_c));
  if (!st.is_ok()) return st;
  Digest mac = client_mac(secret, challenge + 8, nonce_c, header);
  std::string msg = bytes(kMagic, 8) + bytes(nonce_c, 32) + bytes(mac.data(), 32);
  uint32_t len = uint32_t(header.size());
  uint8_t len_le[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
  msg += bytes(len_le, 4) + header;
  st = send_all(fd, msg.data(), msg.size(), deadline, peer, what);
  if (st.code == HPCDL_ERR_PEER_LOST) return dropped("while this rank answered its challenge");
  if (!st.is_ok()) return st;
  uint8_t reply[32];
  st = recv_all(fd, reply, sizeof(reply), deadline, peer, what);
  if (st.code == HPCDL_ERR_PEER_LOST) return dropped("before answering");
  if (!st.is_ok()) return st;
  if (std::memcmp(reply, kAuthRefusal, sizeof(reply)) == 0)
    return Status::error(HPCDL_ERR_AUTH, what + ": it does not accept this job's secret (HPCDL_SECRET differs "
                                                "between this rank and the launcher/rendezvous)");
  Digest expected = server_mac(secret, challenge + 8, nonce_c, header);
  if (!digest_equal(reply, expected.data(), 32))
    return Status::error(HPCDL_ERR_AUTH, what + ": the server does not know this job's secret; refusing to talk "
                                                "to it (check HPCDL_SECRET and the rendezvous address)");
  if (session) *session = session_key(secret, challenge + 8, nonce_c);
  return Status::ok();
}

Status connect_authenticated(const std::string& host, int port, const std::string& secret, const std::string& header,
                             Deadline deadline, const std::string& peer, int* fd, Digest* session,
                             const std::string& congestion) {
  auto backoff = std::chrono::milliseconds(5);
  Status dropped;  // the last handshake the server dropped: the cause to report when the deadline comes
  auto gave_up = [&dropped] {
    return Status::error(dropped.code, dropped.message + "; retried until the deadline (HPCDL_TIMEOUT)");
  };
  while (true) {
    Status st = connect_tcp(host, port, deadline, "connecting to " + peer, fd, true, congestion);
    if (st.is_ok()) {
      st = auth_client(*fd, secret, header, deadline, peer, session);
      if (st.is_ok()) return st;
      close(*fd);
      *fd = -1;
    }
    if (st.code == HPCDL_ERR_TIMEOUT && !dropped.is_ok()) return gave_up();
    if (st.code != HPCDL_ERR_PEER_LOST) return st;
    dropped = st;
    if (Clock::now() + backoff >= deadline) return gave_up();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

// One connection being authenticated by the server.
struct AuthServer::Pending {
  int fd = -1;
  Clock::time_point accepted;
  Clock::time_point challenged{};  // when the whole challenge was sent (epoch: not yet)
  uint8_t nonce_s[32];
  std::vector<uint8_t> in;   // bytes received so far
  std::vector<uint8_t> out;  // bytes still to send (the challenge, then the MAC or the refusal)
  size_t out_sent = 0;
  bool verified = false;  // the client's MAC checked out; `out` holds our MAC
  bool refusing = false;  // the client's MAC was wrong; `out` holds the refusal
  std::string header;
  Digest session{};

  bool stalled(Clock::time_point now) const {
    return !verified && !refusing && challenged != Clock::time_point{} && now - challenged > kShedGrace;
  }
};

std::vector<AuthServer::Pending>::iterator AuthServer::oldest_unverified(std::vector<Pending>& pending) {
  auto oldest = pending.end();
  for (auto it = pending.begin(); it != pending.end(); ++it)
    if (!it->verified && (oldest == pending.end() || it->accepted < oldest->accepted)) oldest = it;
  return oldest;
}

AuthServer::~AuthServer() { stop(); }

Status AuthServer::start(const std::string& host, int port, const std::string& secret, Handler handler, Tick tick,
                         int* listen_errno, const std::string& congestion) {
  Status usable = check_job_secret(secret);
  if (!usable.is_ok()) return usable;
  std::string error;
  listen_fd_ = listen_tcp(host, port, &port_, &error, listen_errno);
  if (listen_fd_ < 0) return Status::error(HPCDL_ERR_INVALID, error);
  set_congestion_control(listen_fd_, congestion);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  secret_ = secret;
  handler_ = std::move(handler);
  tick_ = std::move(tick);
  thread_ = std::thread([this] { loop(); });
  return Status::ok();
}

void AuthServer::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void AuthServer::accept_clients(std::vector<Pending>& pending, Clock::time_point now) {
  while (true) {
    auto shed = pending.end();
    if (pending.size() >= kMaxPendingHandshakes) {
      shed = std::find_if(pending.begin(), pending.end(), [now](const Pending& p) { return p.stalled(now); });
      if (shed == pending.end()) return;  // every open handshake is within its grace: the rest stay queued
    }
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) accept_failed(errno, pending, now);
      return;
    }
    accept_backoff_ = kAcceptBackoffFirst;
    // accept() returns the lowest free descriptor: one this high means no lower one was free.
    const size_t limit = descriptor_limit();
    if (shed == pending.end() && size_t(fd) >= limit - std::min(limit, descriptor_reserve(limit))) {
      warn_once("reserve", "fewer than " + std::to_string(descriptor_reserve(limit)) + " of the " +
                               std::to_string(limit) + " files this process may open are left: connections "
                               "that have not proven the job's secret are dropped to keep them for the job's "
                               "ranks (many connections to this port: another user's, or a stuck client's?)");
      shed = oldest_unverified(pending);
    }
    if (shed != pending.end()) {
      close(shed->fd);
      pending.erase(shed);
    }
    Pending p;
    if (!random_bytes(p.nonce_s, 32).is_ok()) {  // no challenge can be made: turn the client away
      close(fd);
      continue;
    }
    p.fd = fd;
    p.accepted = now;
    p.out.assign(kMagic, kMagic + 8);
    p.out.insert(p.out.end(), p.nonce_s, p.nonce_s + 32);
    pending.push_back(std::move(p));
  }
}

void AuthServer::accept_failed(int err, std::vector<Pending>& pending, Clock::time_point now) {
  if (out_of_descriptors(err)) {
    warn_once("errno " + std::to_string(err),
              "cannot accept a connection (" + std::string(std::strerror(err)) + "; this process may open " +
                  std::to_string(descriptor_limit()) + " files): it drops connections that have not proven "
                  "the job's secret and tries again; if the job needs more, raise the limit where it starts "
                  "(ulimit -n)");
    auto oldest = oldest_unverified(pending);
    if (oldest != pending.end()) {
      close(oldest->fd);
      pending.erase(oldest);
    }
  } else {
    warn_once("errno " + std::to_string(err),
              "cannot accept a connection (" + std::string(std::strerror(err)) + "); it tries again");
  }
  // The listen socket stays readable while nothing can be accepted from it: stop polling it for a while.
  accept_paused_until_ = now + accept_backoff_;
  accept_backoff_ = std::min<Clock::duration>(2 * accept_backoff_, kAcceptBackoffLongest);
}

void AuthServer::warn_once(const std::string& key, const std::string& message) {
  if (!warned_.insert(key).second) return;
  std::fprintf(stderr, "hpcdl WARNING: the listener on port %d: %s\n", port_, message.c_str());
  std::fflush(stderr);
}

// Moves one handshake as far as its socket allows without blocking.
AuthServer::Step AuthServer::advance(Pending& p, Clock::time_point now) {
  while (p.out_sent < p.out.size()) {
    ssize_t n = send(p.fd, p.out.data() + p.out_sent, p.out.size() - p.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      p.out_sent += size_t(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      break;
    } else {
      return Step::kDrop;
    }
  }
  const bool sent = p.out_sent == p.out.size();
  if (sent && p.verified) return Step::kDone;
  if (sent && p.refusing) return Step::kDrop;
  if (sent && p.challenged == Clock::time_point{}) p.challenged = now;
  if (now - p.accepted > kHandshakeLimit) return Step::kDrop;
  if (p.verified || p.refusing) return Step::kWaiting;
  uint8_t buf[1024];
  while (true) {
    ssize_t n = recv(p.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      p.in.insert(p.in.end(), buf, buf + n);
      if (p.in.size() > kClientFixed + kMaxAuthHeader) return Step::kDrop;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) return Step::kDrop;
    break;
  }
  if (p.in.size() < kClientFixed) return Step::kWaiting;
  if (std::memcmp(p.in.data(), kMagic, 8) != 0) return Step::kDrop;
  const uint8_t* l = p.in.data() + 72;
  uint32_t len = uint32_t(l[0]) | uint32_t(l[1]) << 8 | uint32_t(l[2]) << 16 | uint32_t(l[3]) << 24;
  if (len > kMaxAuthHeader || p.in.size() > kClientFixed + len) return Step::kDrop;  // may not talk first
  if (p.in.size() < kClientFixed + len) return Step::kWaiting;
  std::string header(reinterpret_cast<const char*>(p.in.data() + kClientFixed), len);
  Digest expected = client_mac(secret_, p.nonce_s, p.in.data() + 8, header);
  if (digest_equal(expected.data(), p.in.data() + 40, 32)) {
    Digest reply = server_mac(secret_, p.nonce_s, p.in.data() + 8, header);
    p.out.assign(reply.begin(), reply.end());
    p.verified = true;
    p.header = std::move(header);
    p.session = session_key(secret_, p.nonce_s, p.in.data() + 8);
  } else {
    p.out.assign(kAuthRefusal, kAuthRefusal + sizeof(kAuthRefusal));
    p.refusing = true;
  }
  p.out_sent = 0;
  return advance(p, now);
}

void AuthServer::loop() {
  std::vector<Pending> pending;
  while (!stopping_) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    // A full handshake table leaves new clients in the listen queue (polling for them would spin) unless
    // a stalled handshake can make room.
    auto now = Clock::now();
    bool room = pending.size() < kMaxPendingHandshakes ||
                std::any_of(pending.begin(), pending.end(), [now](const Pending& p) { return p.stalled(now); });
    const bool paused = now < accept_paused_until_;  // after a failed accept
    fds.push_back({listen_fd_, short(room && !paused ? POLLIN : 0), 0});
    for (auto& p : pending) fds.push_back({p.fd, short(p.out_sent < p.out.size() ? POLLIN | POLLOUT : POLLIN), 0});
    int rc = poll(fds.data(), nfds_t(fds.size()), 50);
    if (stopping_) break;
    if (tick_) tick_();
    if (rc < 0) continue;
    now = Clock::now();
    if (fds[1].revents & POLLIN) accept_clients(pending, now);
    for (size_t i = pending.size(); i-- > 0;) {
      Step step = advance(pending[i], now);
      if (step == Step::kWaiting) continue;
      int fd = pending[i].fd;
      std::string header = std::move(pending[i].header);
      const Digest session = pending[i].session;
      pending.erase(pending.begin() + long(i));
      if (step == Step::kDone)
        handler_(fd, header, session);
      else
        close(fd);
    }
  }
  for (auto& p : pending) close(p.fd);
}

}  // namespace hpcdl
