#include <cstring>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_allreduce(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                     double postscale, size_t small_message_bytes, Deadline deadline, const std::string& what) {
  Status st = p2p_agree(p, make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what);
  if (!st.is_ok()) return st;
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype), bytes = size_t(count) * es;
  auto* out = static_cast<char*>(recv);
  // Integers with a prescale are summed in double from the raw inputs (a pre-scaled integer copy would
  // truncate each contribution), so they always take the exchange.
  const bool int_scaled = !is_float_dtype(dtype) && prescale != 1.0;
  if (bytes <= small_message_bytes || count < n || int_scaled) {
    // Latency-optimal: one exchange of whole inputs, then everybody reduces in rank order.
    std::vector<char> all(bytes * size_t(n));
    if (bytes) std::memcpy(all.data() + bytes * size_t(r), send, bytes);
    for (int s = 1; s < n; ++s) {
      int to = (r + s) % n, from = (r - s + n) % n;
      st = p.sendrecv(to, send, bytes, from, all.data() + bytes * size_t(from), bytes, deadline, what);
      if (!st.is_ok()) return st;
    }
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) srcs[size_t(i)] = all.data() + bytes * size_t(i);
    reduce(out, srcs.data(), n, count, dtype, op, prescale, postscale, n);
    return Status::ok();
  }
  // Bandwidth-optimal ring: reduce-scatter, then allgather, on the output buffer.
  const void* self[1] = {send};
  reduce(out, self, 1, count, dtype, HPCDL_SUM, prescale, 1.0, 1);
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    int64_t len = count / n + (i < count % n ? 1 : 0);
    offsets[size_t(i) + 1] = offsets[size_t(i)] + size_t(len) * es;
  }
  st = ring_reduce_scatter(p, out, offsets, dtype, op, deadline, what);
  if (!st.is_ok()) return st;
  char* mine = out + offsets[size_t(r)];
  const void* seg[1] = {mine};
  int64_t mine_count = int64_t((offsets[size_t(r) + 1] - offsets[size_t(r)]) / es);
  if (op == HPCDL_AVERAGE || postscale != 1.0) reduce(mine, seg, 1, mine_count, dtype, op, 1.0, postscale, n);
  return ring_allgather(p, out, offsets, deadline, what);
}

}  // namespace hpcdl
