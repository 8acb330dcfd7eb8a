// The rendezvous: every rank registers (rank, host identity, data port) with one server, which answers
// each with the table of all ranks once the whole job has arrived. Clients authenticate with the job
// secret first (net/auth.h), and every frame the server sends after that carries a MAC under the
// connection's session key (net/session.h); the table is plain "key=value" text, never code or pickles.
// Each completed round gets a fresh random nonce in its table, from which the job's ranks derive keys that
// are new with every rendezvous (the object-payload key, see Runtime::object_key).
//
// One registration per rank: a second process registering a rank whose first registration is still
// connected is refused (two processes claim one rank: a launch error, or someone else's process), not
// preferred; a registration whose connection has closed is replaced, and is left out of a round that would
// complete without its new one.
//
// Addresses: a rank's data address is the one the server saw its registration come from, unless the rank
// pinned one (HPCDL_IFACE). That address is on the interface the rank's host routes towards the server,
// resolved on that host, whatever name the rank was given. Ranks on the server's own host may reach it over
// loopback (a host name that resolves to 127.0.1.1 there, as Debian writes /etc/hosts); peers on other
// hosts then reach them at the address they themselves used to reach the server's host.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "net/auth.h"
#include "net/session.h"
#include "runtime.h"

namespace hpcdl {

// Where a rank looks for the rendezvous: each address with each port, in this order. With one candidate
// the rank waits for it until the deadline. With several it walks them: the server listens on one, the
// others may be anyone's (a listener that is not this job's rendezvous fails the authenticated handshake
// or names another job, and the rank moves on), until the deadline.
struct RendezvousTarget {
  std::vector<std::string> addrs;
  std::vector<int> ports;
  std::string origin;  // what named the rendezvous, for messages (e.g. "MASTER_ADDR/MASTER_PORT")
};

class RendezvousServer {
 public:
  RendezvousServer() = default;
  ~RendezvousServer() { stop(); }
  // Listens on `host` at the first of `ports` that is free (0: any free port). Clients must send `job`
  // (empty: any), which tells this job's ranks from another job's that walk the same ports.
  Status start(const std::string& host, const std::vector<int>& ports, const std::string& secret, int size,
               const std::string& job = "", const std::string& origin = "");
  int port() const { return server_.port(); }
  // World ranks registered in the current round (all of them once the round completed).
  std::vector<int> arrived() const;
  void stop();

 private:
  struct Registration {
    Session session;      // the rank's connection, kept open until the round completes
    PeerInfo info;        // addr: what the rank pinned, or empty
    std::string seen;     // the address its connection came from
    std::string reached;  // this server's address it connected to
    bool on_server_host() const;
  };
  void on_client(int fd, const std::string& header, const Digest& session);
  void send_progress();
  void finish_round(std::vector<Registration>& round);
  static std::string address_problem(const std::vector<Registration>& round);

  AuthServer server_;
  int size_ = 0;
  std::string job_;
  mutable std::mutex mutex_;
  std::map<int, Registration> round_;  // by rank
  std::set<int> last_complete_;
  Clock::time_point last_progress_{};
};

// What a rank learns at the rendezvous: every rank of the job, by rank, with the address this rank reaches
// it at, and the round's nonce (32 random bytes, the same for every rank of the round).
struct Meeting {
  std::vector<PeerInfo> peers;
  std::string nonce;
};

// Registers `self` (self.addr: a pinned data address, or empty for the one the server sees) and waits for
// the table of all `size` ranks.
Status rendezvous_register(const RendezvousTarget& target, const std::string& secret, const std::string& job,
                           int size, const PeerInfo& self, Deadline deadline, Meeting* meeting);

}  // namespace hpcdl
