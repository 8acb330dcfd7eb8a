// Mutual challenge-response authentication with the job secret (HMAC-SHA-256), used by the rendezvous
// server and by every rank's data listener. Nothing a peer sends is interpreted before its MAC checks
// out, apart from one bounded length field; connections that stall or send garbage are dropped.
//
//   server -> client  "HPCDLAU1" nonce_s[32]
//   client -> server  "HPCDLAU1" nonce_c[32] mac_c[32] header_len[u32 le] header[header_len <= 4096]
//                     mac_c = HMAC(secret, "client" nonce_s nonce_c header)
//   server -> client  mac_s[32] = HMAC(secret, "server" nonce_c nonce_s header)
//                     or, when mac_c is wrong, the 32-byte refusal kAuthRefusal, then close
//
// Both sides then hold the connection's session key, HMAC(secret, "session" nonce_s nonce_c), which
// authenticates every frame that follows (net/session.h): fresh nonces make it new on every connection.
//
// A client can therefore tell a wrong secret (the refusal, or a wrong mac_s) from a connection the server
// dropped (closed before answering: it was overloaded or restarting), which is worth retrying.
//
// Many clients at once: the server runs up to kMaxPendingHandshakes handshakes side by side. When that
// many are open it stops accepting (later clients wait in the kernel's listen queue) and sheds only a
// handshake whose client has held its challenge for kShedGrace without answering; a handshake is never
// evicted before its client had that chance. A handshake open for kHandshakeLimit is dropped.
//
// Out of descriptors: the process's open files are shared with the rest of the runtime (or of the launcher,
// whose Python services keep the same reserve: hpcdl/runner/service.py). The server leaves the last
// descriptor_reserve() of them to the job's own connections: a connection accepted into that reserve makes
// it drop its oldest unauthenticated handshake. A failed accept (EMFILE, or any other error) drops one too,
// is reported once per cause on stderr, and pauses accepting with back-off (kAcceptBackoff...) instead of
// polling a listen socket that stays readable while nothing can be accepted from it.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "comm.h"
#include "crypto/sha256.h"

namespace hpcdl {

constexpr size_t kMaxAuthHeader = 4096;
// Fewer characters than this are guessable by trying them against a listener (64 bits of hex).
constexpr size_t kMinSecretLength = 16;

// A secret a job may use: not empty, not shorter than kMinSecretLength. The error says how to make one.
Status check_job_secret(const std::string& secret);
constexpr size_t kMaxPendingHandshakes = 1024;
constexpr auto kShedGrace = std::chrono::seconds(2);
constexpr auto kHandshakeLimit = std::chrono::seconds(20);
constexpr auto kAcceptBackoffFirst = std::chrono::milliseconds(10);
constexpr auto kAcceptBackoffLongest = std::chrono::milliseconds(500);

// Descriptors a process allowed `limit` open files keeps for the job's own connections: an eighth, at least 32.
size_t descriptor_reserve(size_t limit);

// Client side: authenticates on a connected socket and sends `header` to the server. Fails with
// HPCDL_ERR_AUTH when the other side is not an hpcdl server of this job (wrong protocol, wrong secret) and
// with HPCDL_ERR_PEER_LOST when the server dropped the connection before answering (worth a retry).
// `session` (when given) receives the connection's session key.
Status auth_client(int fd, const std::string& secret, const std::string& header, Deadline deadline,
                   const std::string& peer, Digest* session = nullptr);

// Connects to host:port and authenticates with `header`, retrying until the deadline while nothing listens
// there yet or the server drops the handshake (it is overloaded); fails at once on HPCDL_ERR_AUTH.
// `congestion`: see set_congestion_control.
Status connect_authenticated(const std::string& host, int port, const std::string& secret, const std::string& header,
                             Deadline deadline, const std::string& peer, int* fd, Digest* session = nullptr,
                             const std::string& congestion = "");

// Server side: a listening socket and a thread that runs handshakes without blocking on any one client.
class AuthServer {
 public:
  // Receives each authenticated connection (blocking fd ownership passes to it), the client's header and
  // the connection's session key. Runs on the server thread.
  using Handler = std::function<void(int fd, const std::string& header, const Digest& session)>;
  // Called on the server thread about every 50 ms (e.g. to drop clients whose round expired).
  using Tick = std::function<void()>;

  AuthServer() = default;
  ~AuthServer();
  AuthServer(const AuthServer&) = delete;
  AuthServer& operator=(const AuthServer&) = delete;

  // Listens on host:port (0: any free port); an empty secret is refused. On failure, *listen_errno (when given) says why (EADDRINUSE...).
  // Accepted connections use the congestion control `congestion` (see set_congestion_control).
  Status start(const std::string& host, int port, const std::string& secret, Handler handler, Tick tick = nullptr,
               int* listen_errno = nullptr, const std::string& congestion = "");
  int port() const { return port_; }
  void stop();

 private:
  struct Pending;
  enum class Step { kWaiting, kDone, kDrop };
  void loop();
  Step advance(Pending& p, Clock::time_point now);
  // Accepts what the handshake table has room for; sheds one stalled handshake per client beyond that.
  void accept_clients(std::vector<Pending>& pending, Clock::time_point now);
  // After accept() failed with `err`: report it once, shed a handshake when out of descriptors, back off.
  void accept_failed(int err, std::vector<Pending>& pending, Clock::time_point now);
  void warn_once(const std::string& key, const std::string& message);
  // The handshake open longest whose client has not proven the secret (end(): none).
  static std::vector<Pending>::iterator oldest_unverified(std::vector<Pending>& pending);

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that interrupts poll() on stop()
  int port_ = 0;
  std::string secret_;
  Handler handler_;
  Tick tick_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  // Server-thread state: accepting paused until this time after a failed accept, and the next pause.
  Clock::time_point accept_paused_until_{};
  Clock::duration accept_backoff_ = kAcceptBackoffFirst;
  std::set<std::string> warned_;  // causes already reported
};

}  // namespace hpcdl
