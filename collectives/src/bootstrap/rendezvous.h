// The rendezvous: every rank registers (rank, host identity, data address) with one server, which
// answers each with the table of all ranks once the whole job has arrived. Clients authenticate with
// the job secret first (net/auth.h); the table is plain "key=value" text, never code or pickles.
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

class RendezvousServer {
 public:
  RendezvousServer() = default;
  ~RendezvousServer() { stop(); }
  Status start(const std::string& host, int port, const std::string& secret, int size);
  int port() const { return server_.port(); }
  // World ranks registered in the current round (all of them once the round completed).
  std::vector<int> arrived() const;
  long rejected() const { return server_.rejected(); }
  void stop();

 private:
  void on_client(int fd, const std::string& header);
  void send_progress();

  AuthServer server_;
  int size_ = 0;
  mutable std::mutex mutex_;
  std::map<int, std::pair<int, PeerInfo>> round_;  // rank -> (fd, what it registered)
  std::set<int> last_complete_;
  Clock::time_point last_progress_{};
};

// Registers `self` with the server at addr:port and returns the table of all `size` ranks, by rank.
Status rendezvous_register(const std::string& addr, int port, const std::string& secret, int size,
                           const PeerInfo& self, Deadline deadline, std::vector<PeerInfo>* peers);

}  // namespace hpcdl
