#include <cstring>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_allgatherv(P2P& p, const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                      Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  std::vector<int64_t> vec(counts);
  vec.resize(size_t(2 * n), 0);
  Status st = p2p_agree(p, make_desc(HPCDL_OP_ALLGATHER, dtype, 0, counts[size_t(r)], vec), deadline, what);
  if (!st.is_ok()) return st;
  const size_t es = dtype_bytes(dtype);
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) offsets[size_t(i) + 1] = offsets[size_t(i)] + size_t(counts[size_t(i)]) * es;
  auto* out = static_cast<char*>(recv);
  size_t mine = offsets[size_t(r) + 1] - offsets[size_t(r)];
  if (mine && out + offsets[size_t(r)] != send) std::memmove(out + offsets[size_t(r)], send, mine);
  if (n == 1) return Status::ok();
  const Ring ring(p, std::move(offsets), kRingChunkBytes);
  Schedule s;
  ring_allgather(s, ring, out, {});
  return p.run(s, deadline, what);
}

}  // namespace hpcdl
