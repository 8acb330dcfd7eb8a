// The rendezvous: every rank registers (rank, host identity, data port) with one server, which answers
// each with the table of all ranks once the whole job has arrived. Clients authenticate with the job
// secret first (net/auth.h); the table is plain "key=value" text, never code or pickles.
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
    int fd = -1;
    PeerInfo info;        // addr: what the rank pinned, or empty
    std::string seen;     // the address its connection came from
    std::string reached;  // this server's address it connected to
    bool on_server_host() const;
  };
  void on_client(int fd, const std::string& header);
  void send_progress();
  void finish_round(const std::vector<Registration>& round);
  static std::string address_problem(const std::vector<Registration>& round);

  AuthServer server_;
  int size_ = 0;
  std::string job_;
  mutable std::mutex mutex_;
  std::map<int, Registration> round_;  // by rank
  std::set<int> last_complete_;
  Clock::time_point last_progress_{};
};

// Registers `self` (self.addr: a pinned data address, or empty for the one the server sees) and returns the
// table of all `size` ranks, by rank, with the addresses this rank reaches them at.
Status rendezvous_register(const RendezvousTarget& target, const std::string& secret, const std::string& job,
                           int size, const PeerInfo& self, Deadline deadline, std::vector<PeerInfo>* peers);

}  // namespace hpcdl
