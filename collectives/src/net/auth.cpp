#include "net/auth.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "crypto/sha256.h"
#include "net/socket.h"

namespace hpcdl {
namespace {

constexpr char kMagic[8] = {'H', 'P', 'C', 'D', 'L', 'A', 'U', '1'};
constexpr size_t kClientFixed = 8 + 32 + 32 + 4;
constexpr auto kHandshakeLimit = std::chrono::seconds(10);
constexpr size_t kMaxPending = 128;

std::string bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

Digest client_mac(const std::string& secret, const uint8_t* nonce_s, const uint8_t* nonce_c,
                  const std::string& header) {
  return hmac_sha256(secret, "client" + bytes(nonce_s, 32) + bytes(nonce_c, 32) + header);
}

Digest server_mac(const std::string& secret, const uint8_t* nonce_s, const uint8_t* nonce_c,
                  const std::string& header) {
  return hmac_sha256(secret, "server" + bytes(nonce_c, 32) + bytes(nonce_s, 32) + header);
}

// One connection being authenticated by the server.
struct Pending {
  int fd;
  Clock::time_point started;
  uint8_t nonce_s[32];
  std::vector<uint8_t> in;  // bytes received so far
  std::vector<uint8_t> out;  // bytes still to send (challenge, then response)
  size_t out_sent = 0;
  bool verified = false;
  std::string header;
};

}  // namespace

Status auth_client(int fd, const std::string& secret, const std::string& header, Deadline deadline,
                   const std::string& peer) {
  const std::string what = "authenticating with " + peer;
  if (header.size() > kMaxAuthHeader) return Status::error(HPCDL_ERR_INVALID, what + ": header too long");
  uint8_t challenge[40];
  Status st = recv_all(fd, challenge, sizeof(challenge), deadline, peer, what);
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
  if (!st.is_ok()) return st;
  uint8_t reply[32];
  st = recv_all(fd, reply, sizeof(reply), deadline, peer, what);
  if (st.code == HPCDL_ERR_PEER_LOST)
    return Status::error(HPCDL_ERR_AUTH, what + ": the server closed the connection; it does not accept this "
                                                "job's secret (HPCDL_SECRET differs between this rank and the "
                                                "launcher/rendezvous)");
  if (!st.is_ok()) return st;
  Digest expected = server_mac(secret, challenge + 8, nonce_c, header);
  if (!digest_equal(reply, expected.data(), 32))
    return Status::error(HPCDL_ERR_AUTH, what + ": the server does not know this job's secret; refusing to talk "
                                                "to it (check HPCDL_SECRET and the rendezvous address)");
  return Status::ok();
}

AuthServer::~AuthServer() { stop(); }

Status AuthServer::start(const std::string& host, int port, const std::string& secret, Handler handler, Tick tick) {
  std::string error;
  listen_fd_ = listen_tcp(host, port, &port_, &error);
  if (listen_fd_ < 0) return Status::error(HPCDL_ERR_INVALID, error);
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

void AuthServer::loop() {
  std::vector<Pending> pending;
  auto drop = [&](size_t i) {
    close(pending[i].fd);
    pending.erase(pending.begin() + long(i));
    ++rejected_;
  };
  while (!stopping_) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& p : pending) {
      short events = POLLIN;
      if (p.out_sent < p.out.size()) events |= POLLOUT;
      fds.push_back({p.fd, events, 0});
    }
    int rc = poll(fds.data(), nfds_t(fds.size()), 50);
    if (stopping_) break;
    if (tick_) tick_();
    if (rc < 0) continue;
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (pending.size() >= kMaxPending) {  // a flood: shed the oldest half-open handshake
          drop(0);
        }
        Pending p;
        if (!random_bytes(p.nonce_s, 32).is_ok()) {  // no challenge can be made: turn the client away
          close(fd);
          continue;
        }
        p.fd = fd;
        p.started = Clock::now();
        p.out.assign(kMagic, kMagic + 8);
        p.out.insert(p.out.end(), p.nonce_s, p.nonce_s + 32);
        pending.push_back(std::move(p));
      }
    }
    auto now = Clock::now();
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      bool bad = false;
      // Send what is queued.
      while (p.out_sent < p.out.size()) {
        ssize_t n = send(p.fd, p.out.data() + p.out_sent, p.out.size() - p.out_sent, MSG_NOSIGNAL);
        if (n > 0) {
          p.out_sent += size_t(n);
        } else {
          if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
          bad = true;
          break;
        }
      }
      if (!bad && !p.verified) {
        uint8_t buf[1024];
        while (true) {
          ssize_t n = recv(p.fd, buf, sizeof(buf), 0);
          if (n > 0) {
            p.in.insert(p.in.end(), buf, buf + n);
            if (p.in.size() > kClientFixed + kMaxAuthHeader) {
              bad = true;
              break;
            }
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) bad = true;
          break;
        }
        if (!bad && p.in.size() >= kClientFixed) {
          if (std::memcmp(p.in.data(), kMagic, 8) != 0) {
            bad = true;
          } else {
            const uint8_t* l = p.in.data() + 72;
            uint32_t len = uint32_t(l[0]) | uint32_t(l[1]) << 8 | uint32_t(l[2]) << 16 | uint32_t(l[3]) << 24;
            if (len > kMaxAuthHeader) {
              bad = true;
            } else if (p.in.size() > kClientFixed + len) {
              bad = true;  // the client may not talk before the server answered
            } else if (p.in.size() == kClientFixed + len) {
              std::string header(reinterpret_cast<const char*>(p.in.data() + kClientFixed), len);
              Digest expected = client_mac(secret_, p.nonce_s, p.in.data() + 8, header);
              if (!digest_equal(expected.data(), p.in.data() + 40, 32)) {
                bad = true;
              } else {
                Digest reply = server_mac(secret_, p.nonce_s, p.in.data() + 8, header);
                p.out.assign(reply.begin(), reply.end());
                p.out_sent = 0;
                p.verified = true;
                p.header = std::move(header);
                while (p.out_sent < p.out.size()) {
                  ssize_t n = send(p.fd, p.out.data() + p.out_sent, p.out.size() - p.out_sent, MSG_NOSIGNAL);
                  if (n > 0) {
                    p.out_sent += size_t(n);
                  } else if (n < 0 && errno == EAGAIN) {
                    break;
                  } else {
                    bad = true;
                    break;
                  }
                }
              }
            }
          }
        }
      }
      if (!bad && now - p.started > kHandshakeLimit) bad = true;
      if (bad) {
        drop(i);
        continue;
      }
      if (p.verified && p.out_sent == p.out.size()) {
        int fd = p.fd;
        std::string header = std::move(p.header);
        pending.erase(pending.begin() + long(i));
        handler_(fd, header);
      }
    }
  }
  for (auto& p : pending) close(p.fd);
}

}  // namespace hpcdl
