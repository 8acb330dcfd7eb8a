#include "algorithms/p2p.h"

namespace hpcdl {

Status P2P::sendrecv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
                     Deadline deadline, const std::string& what) {
  Schedule s;
  if (to >= 0) s.send(to, send, send_bytes);
  if (from >= 0) s.recv(from, recv, recv_bytes);
  return run(s, deadline, what);
}

}  // namespace hpcdl
