#include "net/endpoint.h"

#include <unistd.h>

#include <sstream>

#include "net/socket.h"

namespace hpcdl {

Endpoint::~Endpoint() {
  server_.stop();
  for (auto& entry : inbox_) close(entry.second);
}

Status Endpoint::start(const std::string& bind_host, const std::string& secret, int my_rank,
                       const std::string& congestion) {
  secret_ = secret;
  my_rank_ = my_rank;
  congestion_ = congestion;
  auto handler = [this](int fd, const std::string& header, const Digest&) {
    std::istringstream in(header);
    std::string line, key;
    int rank = -1;
    while (std::getline(in, line)) {
      if (line.rfind("rank=", 0) == 0) rank = std::atoi(line.c_str() + 5);
      if (line.rfind("key=", 0) == 0) key = line.substr(4);
    }
    if (rank < 0 || key.empty()) {
      close(fd);
      return;
    }
    configure_data_socket(fd);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = inbox_.find({rank, key});
    if (it != inbox_.end()) close(it->second);
    inbox_[{rank, key}] = fd;
    arrived_.notify_all();
  };
  return server_.start(bind_host, 0, secret, handler, nullptr, nullptr, congestion);
}

Status Endpoint::connect(const PeerInfo& peer, const std::string& key, Deadline deadline, int* fd) {
  const std::string who = "rank " + std::to_string(peer.rank) + " at " + peer.addr + ":" + std::to_string(peer.port);
  return connect_authenticated(peer.addr, peer.port, secret_,
                               "purpose=link\nrank=" + std::to_string(my_rank_) + "\nkey=" + key + "\n", deadline, who,
                               fd, nullptr, congestion_);
}

Status Endpoint::accept(const PeerInfo& peer, const std::string& key, Deadline deadline, int* fd) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool ok = arrived_.wait_until(lock, deadline, [&] { return inbox_.count({peer.rank, key}) != 0; });
  if (!ok)
    return Status::error(HPCDL_ERR_TIMEOUT, "timed out waiting for rank " + std::to_string(peer.rank) + " (host " +
                                                peer.host + ") to connect (" + key +
                                                "); it is hung, dead, or cannot reach this host (check HPCDL_IFACE "
                                                "and firewalls)");
  auto it = inbox_.find({peer.rank, key});
  *fd = it->second;
  inbox_.erase(it);
  return Status::ok();
}

}  // namespace hpcdl
