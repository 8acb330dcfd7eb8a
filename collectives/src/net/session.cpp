#include "net/session.h"

#include "net/socket.h"

namespace hpcdl {
namespace {

std::string le_bytes(uint64_t value, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += char(uint8_t(value >> (8 * i)));
  return out;
}

Digest frame_mac(const Digest& key, const char* label, uint64_t seq, const std::string& body) {
  const std::string k(reinterpret_cast<const char*>(key.data()), key.size());
  return hmac_sha256(k, label + le_bytes(seq, 8) + le_bytes(body.size(), 4) + body);
}

const char* label_towards(Session::Side receiver) {
  return receiver == Session::Side::kClient ? "to-client" : "to-server";
}

}  // namespace

Status Session::send(const std::string& body, Deadline deadline, const std::string& peer, const std::string& what) {
  if (body.size() > UINT32_MAX) return Status::error(HPCDL_ERR_INVALID, what + ": message too long");
  const Side receiver = side_ == Side::kClient ? Side::kServer : Side::kClient;
  const Digest mac = frame_mac(key_, label_towards(receiver), sent_++, body);
  const std::string frame = le_bytes(body.size(), 4) + body + std::string(mac.begin(), mac.end());
  return send_all(fd_, frame.data(), frame.size(), deadline, peer, what);
}

Status Session::recv(std::string* body, uint32_t max_bytes, Deadline deadline, const std::string& peer,
                     const std::string& what) {
  uint8_t len_le[4];
  Status st = recv_all(fd_, len_le, 4, deadline, peer, what);
  if (!st.is_ok()) return st;
  const uint32_t len = uint32_t(len_le[0]) | uint32_t(len_le[1]) << 8 | uint32_t(len_le[2]) << 16 |
                       uint32_t(len_le[3]) << 24;
  if (len > max_bytes)
    return Status::error(HPCDL_ERR_INVALID, what + ": " + peer + " announced a message of " + std::to_string(len) +
                                                " bytes, more than the " + std::to_string(max_bytes) +
                                                " it may send; refusing it");
  body->assign(len, '\0');
  uint8_t mac[32];
  st = recv_all(fd_, len ? &(*body)[0] : nullptr, len, deadline, peer, what);
  if (st.is_ok()) st = recv_all(fd_, mac, sizeof(mac), deadline, peer, what);
  if (!st.is_ok()) return st;
  const Digest expected = frame_mac(key_, label_towards(side_), received_++, *body);
  if (!digest_equal(expected.data(), mac, sizeof(mac))) {
    body->clear();
    return Status::error(HPCDL_ERR_AUTH, what + ": a message from " + peer +
                                             " failed its integrity check (it was altered, replayed or reordered "
                                             "on the way: something on the network between the two interferes "
                                             "with the connection); refusing it");
  }
  return Status::ok();
}

}  // namespace hpcdl
