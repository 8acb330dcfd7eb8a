#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_broadcast(P2P& p, void* buf, int64_t count, int dtype, int root, Deadline deadline,
                     const std::string& what) {
  Status st = p2p_agree(p, make_desc(HPCDL_OP_BROADCAST, dtype, root, count), deadline, what);
  if (!st.is_ok()) return st;
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t bytes = size_t(count) * dtype_bytes(dtype);
  if (bytes == 0) return Status::ok();
  // A chain from the root: each rank forwards what it received, so the root sends the data once.
  const int pos = (r - root + n) % n;
  const int next = pos + 1 < n ? (r + 1) % n : -1;
  const int prev = pos > 0 ? (r - 1 + n) % n : -1;
  const size_t piece = 1 << 20;
  auto* data = static_cast<char*>(buf);
  for (size_t at = 0; at < bytes; at += piece) {
    size_t len = std::min(piece, bytes - at);
    if (prev >= 0) {
      st = p.sendrecv(-1, nullptr, 0, prev, data + at, len, deadline, what);
      if (!st.is_ok()) return st;
    }
    if (next >= 0) {
      st = p.sendrecv(next, data + at, len, -1, nullptr, 0, deadline, what);
      if (!st.is_ok()) return st;
    }
  }
  return Status::ok();
}

}  // namespace hpcdl
