// A collective's data movement as a list of sends and receives that a point-to-point transport runs all at
// once: the algorithms (one file per collective) describe what moves where and what has to happen first,
// the transport (TcpComm::run) keeps every link busy. Items of one peer and direction run in the order they
// were added; a send may wait for a receive ("after"), and a receive may run an action once its bytes are
// in (reduce a chunk, read a header), so that a ring's chunks overlap sending, receiving and reducing.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "comm.h"

namespace hpcdl {

class Schedule {
 public:
  // Runs when a receive completed; an error stops the schedule with that status. It may set the length
  // and buffer of a later receive of the same peer (set_recv), e.g. from a header it just read.
  using Action = std::function<Status()>;

  struct Item {
    int peer;
    char* data;
    size_t len;
    int after;      // sends: index of the receive that must be complete first (-1: none)
    Action action;  // receives: run when the bytes are in
  };

  // Returns the item's index among the sends (receives). `data` must stay valid, and a send's bytes
  // unchanged, until the item is done.
  int send(int peer, const void* data, size_t len, int after = -1) {
    sends_.push_back({peer, static_cast<char*>(const_cast<void*>(data)), len, after, nullptr});
    return int(sends_.size()) - 1;
  }
  int recv(int peer, void* data, size_t len, Action action = nullptr) {
    recvs_.push_back({peer, static_cast<char*>(data), len, -1, std::move(action)});
    return int(recvs_.size()) - 1;
  }
  // Changes a receive that has not started yet (from the action of an earlier receive of its peer).
  void set_recv(int index, void* data, size_t len) {
    recvs_[size_t(index)].data = static_cast<char*>(data);
    recvs_[size_t(index)].len = len;
  }

  std::vector<Item>& sends() { return sends_; }
  std::vector<Item>& recvs() { return recvs_; }
  bool empty() const { return sends_.empty() && recvs_.empty(); }

 private:
  std::vector<Item> sends_, recvs_;
};

}  // namespace hpcdl
