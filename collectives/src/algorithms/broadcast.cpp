#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_broadcast(P2P& p, void* buf, int64_t count, int dtype, int root, Deadline deadline,
                     const std::string& what) {
  Status st = p2p_agree(p, make_desc(HPCDL_OP_BROADCAST, dtype, root, count), deadline, what);
  if (!st.is_ok()) return st;
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t bytes = size_t(count) * dtype_bytes(dtype);
  if (bytes == 0 || n == 1) return Status::ok();
  // A chain from the root, chunk by chunk: each rank forwards a chunk as soon as it has it, so the root
  // sends the data once and every link carries it at the same time.
  const int pos = (r - root + n) % n;
  const int next = pos + 1 < n ? (r + 1) % n : -1;
  const int prev = pos > 0 ? (r - 1 + n) % n : -1;
  auto* data = static_cast<char*>(buf);
  Schedule s;
  for (size_t at = 0; at < bytes; at += kRingChunkBytes) {
    const size_t len = std::min(kRingChunkBytes, bytes - at);
    const int got = prev >= 0 ? s.recv(prev, data + at, len) : -1;
    if (next >= 0) s.send(next, data + at, len, got);
  }
  return p.run(s, deadline, what);
}

}  // namespace hpcdl
