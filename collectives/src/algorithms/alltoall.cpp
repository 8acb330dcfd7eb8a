#include <cstring>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_alltoallv(P2P& p, const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline, const std::string& what) {
  std::vector<int64_t> vec(send_counts);
  vec.insert(vec.end(), recv_counts.begin(), recv_counts.end());
  Status st = p2p_agree(p, make_desc(HPCDL_OP_ALLTOALL, dtype, 0, 0, vec), deadline, what);
  if (!st.is_ok()) return st;
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype);
  std::vector<size_t> soff(size_t(n) + 1, 0), roff(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    soff[size_t(i) + 1] = soff[size_t(i)] + size_t(send_counts[size_t(i)]) * es;
    roff[size_t(i) + 1] = roff[size_t(i)] + size_t(recv_counts[size_t(i)]) * es;
  }
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  if (recv_counts[size_t(r)]) std::memmove(out + roff[size_t(r)], in + soff[size_t(r)], size_t(recv_counts[size_t(r)]) * es);
  // Every pair at once, starting with the next rank so that no rank is everybody's first peer.
  Schedule s;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    s.send(to, in + soff[size_t(to)], soff[size_t(to) + 1] - soff[size_t(to)]);
    s.recv(from, out + roff[size_t(from)], roff[size_t(from) + 1] - roff[size_t(from)]);
  }
  return p.run(s, deadline, what);
}

}  // namespace hpcdl
