// A rank's data-plane endpoint: an authenticated listener that peers connect to, and a connector.
// Connections are matched by (peer rank, link key) so that every communicator and channel gets its own.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "net/auth.h"
#include "runtime.h"

namespace hpcdl {

class Endpoint {
 public:
  ~Endpoint();
  // `congestion`: the congestion control of the connections it makes and accepts ("": the system's).
  Status start(const std::string& bind_host, const std::string& secret, int my_rank, const std::string& congestion);
  int port() const { return server_.port(); }
  Status connect(const PeerInfo& peer, const std::string& key, Deadline deadline, int* fd);
  Status accept(const PeerInfo& peer, const std::string& key, Deadline deadline, int* fd);

 private:
  AuthServer server_;
  std::string secret_;
  int my_rank_ = 0;
  std::string congestion_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::pair<int, std::string>, int> inbox_;
};

}  // namespace hpcdl
