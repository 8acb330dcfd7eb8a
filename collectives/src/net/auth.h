// Mutual challenge-response authentication with the job secret (HMAC-SHA-256), used by the rendezvous
// server and by every rank's data listener. Nothing a peer sends is interpreted before its MAC checks
// out, apart from one bounded length field; connections that fail, stall or send garbage are dropped.
//
//   server -> client  "HPCDLAU1" nonce_s[32]
//   client -> server  "HPCDLAU1" nonce_c[32] mac_c[32] header_len[u32 le] header[header_len <= 4096]
//                     mac_c = HMAC(secret, "client" nonce_s nonce_c header)
//   server -> client  mac_s[32] = HMAC(secret, "server" nonce_c nonce_s header)
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "comm.h"

namespace hpcdl {

constexpr size_t kMaxAuthHeader = 4096;

// Client side: authenticates on a connected socket and sends `header` to the server.
Status auth_client(int fd, const std::string& secret, const std::string& header, Deadline deadline,
                   const std::string& peer);

// Server side: a listening socket and a thread that runs handshakes without blocking on any one client.
class AuthServer {
 public:
  // Receives each authenticated connection (blocking fd ownership passes to it) and the client's header.
  // Runs on the server thread.
  using Handler = std::function<void(int fd, const std::string& header)>;
  // Called on the server thread about every 50 ms (e.g. to drop clients whose round expired).
  using Tick = std::function<void()>;

  AuthServer() = default;
  ~AuthServer();
  AuthServer(const AuthServer&) = delete;
  AuthServer& operator=(const AuthServer&) = delete;

  Status start(const std::string& host, int port, const std::string& secret, Handler handler, Tick tick = nullptr);
  int port() const { return port_; }
  void stop();
  // Connections dropped because they failed to authenticate (tests and logs).
  long rejected() const { return rejected_.load(); }

 private:
  void loop();

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that interrupts poll() on stop()
  int port_ = 0;
  std::string secret_;
  Handler handler_;
  Tick tick_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<long> rejected_{0};
};

}  // namespace hpcdl
