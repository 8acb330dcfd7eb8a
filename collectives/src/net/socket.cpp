#include "net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

namespace hpcdl {

std::string errno_text(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

int poll_timeout_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left < 0) return 0;
  if (left > INT_MAX) return INT_MAX;
  return int(left) + 1;
}

static bool resolve_ipv4(const std::string& host, sockaddr_in* out, std::string* error) {
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    out->sin_addr.s_addr = htonl(INADDR_ANY);
    return true;
  }
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    *error = "cannot resolve host '" + host + "': " + gai_strerror(rc);
    return false;
  }
  out->sin_addr = reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr;
  freeaddrinfo(result);
  return true;
}

Status resolve_address(const std::string& host, std::string* address) {
  sockaddr_in addr;
  std::string error;
  if (!resolve_ipv4(host, &addr, &error)) return Status::error(HPCDL_ERR_INVALID, error);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  *address = buf;
  return Status::ok();
}

bool is_loopback_address(const std::string& ipv4) {
  in_addr addr;
  return inet_pton(AF_INET, ipv4.c_str(), &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127;
}

int listen_tcp(const std::string& host, int port, int* bound_port, std::string* error, int* error_number) {
  sockaddr_in addr;
  if (!resolve_ipv4(host, &addr, error)) return -1;
  addr.sin_port = htons(uint16_t(port));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = "socket(): " + errno_text(errno);
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (error_number) *error_number = errno;
    *error = "cannot listen on " + host + ":" + std::to_string(port) + ": " + errno_text(errno);
    close(fd);
    return -1;
  }
  // The kernel caps the backlog at net.core.somaxconn: connections beyond what the server is handling
  // wait there (the server stops accepting while its handshake table is full) instead of being refused.
  if (listen(fd, SOMAXCONN > 4096 ? SOMAXCONN : 4096) != 0) {
    if (error_number) *error_number = errno;
    *error = "listen(): " + errno_text(errno);
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (bound_port) *bound_port = ntohs(addr.sin_port);
  return fd;
}

void configure_data_socket(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

void set_congestion_control(int fd, const std::string& name) {
  if (!name.empty() && name != "system")
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), socklen_t(name.size()));
}

std::string congestion_control_for(const std::string& name) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  set_congestion_control(fd, name);
  char got[64] = {};
  socklen_t len = sizeof(got);
  getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, got, &len);
  close(fd);
  return std::string(got, strnlen(got, sizeof(got)));
}

Status connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what, int* out,
                   bool retry_refused, const std::string& congestion) {
  sockaddr_in addr;
  std::string error;
  if (!resolve_ipv4(host, &addr, &error)) return Status::error(HPCDL_ERR_INVALID, what + ": " + error);
  addr.sin_port = htons(uint16_t(port));
  auto backoff = std::chrono::milliseconds(5);
  std::string last = "no attempt";
  while (true) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::error(HPCDL_ERR_INTERNAL, "socket(): " + errno_text(errno));
    set_congestion_control(fd, congestion);
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = poll(&p, 1, poll_timeout_ms(deadline));
      if (rc == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      configure_data_socket(fd);
      *out = fd;
      return Status::ok();
    }
    const int failure = errno;
    last = errno_text(failure);
    close(fd);
    if (!retry_refused)
      return Status::error(failure == ETIMEDOUT ? HPCDL_ERR_TIMEOUT : HPCDL_ERR_PEER_LOST,
                           what + ": cannot connect to " + host + ":" + std::to_string(port) + " (" + last + ")");
    if (Clock::now() + backoff >= deadline)
      return Status::error(HPCDL_ERR_TIMEOUT, what + ": cannot connect to " + host + ":" + std::to_string(port) +
                                                  " before the deadline (last error: " + last + ")");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

namespace {
std::string ipv4_text(const sockaddr_in& addr) {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  return buf;
}
}  // namespace

std::string socket_local_address(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  return ipv4_text(addr);
}

std::string socket_peer_address(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  return ipv4_text(addr);
}

std::vector<std::string> host_addresses() {
  std::vector<std::string> out, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {"127.0.0.1"};
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET || !(it->ifa_flags & IFF_UP)) continue;
    std::string text = ipv4_text(*reinterpret_cast<sockaddr_in*>(it->ifa_addr));
    (is_loopback_address(text) ? loopback : out).push_back(text);
  }
  freeifaddrs(list);
  out.insert(out.end(), loopback.begin(), loopback.end());
  return out;
}

Status interface_address(const std::string& iface, std::string* address) {
  in_addr probe;
  if (inet_pton(AF_INET, iface.c_str(), &probe) == 1) {
    *address = iface;
    return Status::ok();
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Status::error(HPCDL_ERR_INTERNAL, "getifaddrs(): " + errno_text(errno));
  std::string names;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    names += std::string(names.empty() ? "" : ", ") + it->ifa_name;
    if (iface == it->ifa_name) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
      *address = buf;
      freeifaddrs(list);
      return Status::ok();
    }
  }
  freeifaddrs(list);
  return Status::error(HPCDL_ERR_INVALID, "network interface '" + iface +
                                              "' (HPCDL_IFACE) has no IPv4 address on this host; interfaces "
                                              "with one: " + names);
}

Status ensure_open_files(size_t more, const std::string& what) {
  size_t open_now = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir)) ++open_now;
    closedir(dir);
  }
  const rlim_t needed = rlim_t(open_now + more + 64);
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed)
    return Status::ok();
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed)
    return Status::error(HPCDL_ERR_INVALID, "this rank needs about " + std::to_string(needed) + " open files for " +
                                                what + ", but may open at most " + std::to_string(limit.rlim_max) +
                                                " (ulimit -Hn); raise the limit where the job starts (ulimit -n " +
                                                std::to_string(needed) + ", or ask the site to)");
  limit.rlim_cur = needed;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0)
    return Status::error(HPCDL_ERR_INTERNAL, "cannot raise the open-file limit to " + std::to_string(needed) +
                                                 " for " + what + ": " + errno_text(errno));
  return Status::ok();
}

Status peer_lost(const std::string& peer, const std::string& what, const std::string& detail) {
  return Status::error(HPCDL_ERR_PEER_LOST, what + ": lost the connection to " + peer + " (" + detail +
                                                "); that rank probably exited or crashed");
}

Status peer_timed_out(const std::string& peer, const std::string& what, const char* direction) {
  return Status::error(HPCDL_ERR_TIMEOUT, what + ": timed out " + direction + " " + peer +
                                              " (HPCDL_TIMEOUT); that rank is hung, dead or not calling it");
}

namespace {

struct Transfer {
  int fd;
  char* data;
  size_t left;
  const std::string* peer;
};

// Moves as much as the kernel takes now; returns false with a status on failure.
bool pump_send(Transfer& t, const std::string& what, Status* status) {
  while (t.left > 0) {
    ssize_t n = send(t.fd, t.data, t.left, MSG_NOSIGNAL);
    if (n > 0) {
      t.data += n;
      t.left -= size_t(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    *status = peer_lost(*t.peer, what, errno_text(errno));
    return false;
  }
  return true;
}

bool pump_recv(Transfer& t, const std::string& what, Status* status) {
  while (t.left > 0) {
    ssize_t n = recv(t.fd, t.data, t.left, 0);
    if (n > 0) {
      t.data += n;
      t.left -= size_t(n);
      continue;
    }
    if (n == 0) {
      *status = peer_lost(*t.peer, what, "connection closed");
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == EINTR) continue;
    *status = peer_lost(*t.peer, what, errno_text(errno));
    return false;
  }
  return true;
}

}  // namespace

Status send_recv(int send_fd, const void* send_data, size_t send_size, const std::string& send_peer, int recv_fd,
                 void* recv_data, size_t recv_size, const std::string& recv_peer, Deadline deadline,
                 const std::string& what) {
  Transfer s{send_fd, static_cast<char*>(const_cast<void*>(send_data)), send_fd >= 0 ? send_size : 0, &send_peer};
  Transfer r{recv_fd, static_cast<char*>(recv_data), recv_fd >= 0 ? recv_size : 0, &recv_peer};
  Status status;
  while (true) {
    if (s.left && !pump_send(s, what, &status)) return status;
    if (r.left && !pump_recv(r, what, &status)) return status;
    if (!s.left && !r.left) return Status::ok();
    pollfd fds[2];
    int n = 0;
    if (s.left) fds[n++] = {s.fd, POLLOUT, 0};
    if (r.left) {
      if (n == 1 && fds[0].fd == r.fd)
        fds[0].events |= POLLIN;
      else
        fds[n++] = {r.fd, POLLIN, 0};
    }
    int timeout = poll_timeout_ms(deadline);
    if (timeout == 0) return peer_timed_out(r.left ? recv_peer : send_peer, what, r.left ? "receiving from" : "sending to");
    int rc = poll(fds, nfds_t(n), timeout);
    if (rc < 0 && errno != EINTR) return Status::error(HPCDL_ERR_INTERNAL, "poll(): " + errno_text(errno));
    if (rc == 0 && Clock::now() >= deadline)
      return peer_timed_out(r.left ? recv_peer : send_peer, what, r.left ? "receiving from" : "sending to");
  }
}

Status send_all(int fd, const void* data, size_t size, Deadline deadline, const std::string& peer,
                const std::string& what) {
  return send_recv(fd, data, size, peer, -1, nullptr, 0, peer, deadline, what);
}

Status recv_all(int fd, void* data, size_t size, Deadline deadline, const std::string& peer,
                const std::string& what) {
  return send_recv(-1, nullptr, 0, peer, fd, data, size, peer, deadline, what);
}

}  // namespace hpcdl
