// Frames after the handshake (net/auth.h), in both directions, each authenticated with the connection's
// session key so that nothing on the network between the two sides can alter, replay, drop or reorder one
// unnoticed:
//
//   len[u32 le] body[len] mac[32]     mac = HMAC(session, label seq[u64 le] len[u32 le] body)
//
// label is "to-client" or "to-server"; seq counts the frames sent in that direction from 0. The receiver
// checks the length against its bound before reading the body and the MAC before reading anything in it.
#pragma once

#include <cstdint>
#include <string>

#include "comm.h"
#include "crypto/sha256.h"

namespace hpcdl {

class Session {
 public:
  enum class Side { kClient, kServer };
  Session() = default;
  Session(int fd, const Digest& key, Side side) : fd_(fd), key_(key), side_(side) {}

  int fd() const { return fd_; }
  Status send(const std::string& body, Deadline deadline, const std::string& peer, const std::string& what);
  // Fails with HPCDL_ERR_AUTH when the frame's MAC is wrong, HPCDL_ERR_INVALID when it is longer than
  // max_bytes (nothing of it is read then).
  Status recv(std::string* body, uint32_t max_bytes, Deadline deadline, const std::string& peer,
              const std::string& what);

 private:
  int fd_ = -1;
  Digest key_{};
  Side side_ = Side::kClient;
  uint64_t sent_ = 0, received_ = 0;
};

}  // namespace hpcdl
