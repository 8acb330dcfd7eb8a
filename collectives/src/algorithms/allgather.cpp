#include <cstring>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_allgatherv(P2P& p, const void* send, void* recv, const std::vector<int64_t>& counts, int dtype,
                      size_t small_message_bytes, Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype);
  std::vector<size_t> offsets(size_t(n) + 1, 0), lens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    lens[size_t(i)] = size_t(counts[size_t(i)]) * es;
    offsets[size_t(i) + 1] = offsets[size_t(i)] + lens[size_t(i)];
  }
  auto* out = static_cast<char*>(recv);
  // Small: every rank's block travels with its descriptor, straight to its place in the output.
  const bool exchange = offsets.back() <= small_message_bytes;
  Inline data{send, lens[size_t(r)], out, offsets, lens};
  std::vector<int64_t> vec(counts);
  vec.resize(size_t(2 * n), 0);
  Status st = p2p_agree(p, make_desc(HPCDL_OP_ALLGATHER, dtype, 0, counts[size_t(r)], vec), deadline, what, nullptr,
                        exchange ? &data : nullptr);
  if (!st.is_ok()) return st;
  const size_t mine = lens[size_t(r)];
  if (mine && out + offsets[size_t(r)] != send) std::memmove(out + offsets[size_t(r)], send, mine);
  if (n == 1 || exchange) return Status::ok();
  const Ring ring(p, std::move(offsets), kRingChunkBytes);
  Schedule s;
  ring_allgather(s, ring, Areas(out, ring.offsets.back()), {});
  return p.run(s, deadline, what);
}

}  // namespace hpcdl
