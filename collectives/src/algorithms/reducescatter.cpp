#include <cstring>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_reducescatter(P2P& p, const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype,
                         int op, double prescale, double postscale, Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  std::vector<int64_t> vec(recv_counts);
  vec.resize(size_t(2 * n), 0);
  int64_t total = 0;
  for (int64_t c : recv_counts) total += c;
  Status st = p2p_agree(p, make_desc(HPCDL_OP_REDUCESCATTER, dtype, op, total, vec), deadline, what);
  if (!st.is_ok()) return st;
  const size_t es = dtype_bytes(dtype);
  if (!is_float_dtype(dtype) && prescale != 1.0) {  // see p2p_allreduce: no truncated pre-scaled copies
    std::vector<char> all(size_t(total) * es);
    const void* srcs[1] = {send};
    std::vector<char> raw(all.size());
    if (!raw.empty()) reduce(raw.data(), srcs, 1, total, dtype, HPCDL_SUM, 1.0, 1.0, 1);
    std::vector<char> gathered(all.size() * size_t(n));
    for (int s = 0; s < n; ++s) {
      int to = (r + s) % n, from = (r - s + n) % n;
      if (s == 0) {
        if (!raw.empty()) std::memcpy(gathered.data() + all.size() * size_t(r), raw.data(), raw.size());
        continue;
      }
      st = p.sendrecv(to, raw.data(), raw.size(), from, gathered.data() + all.size() * size_t(from), raw.size(),
                      deadline, what);
      if (!st.is_ok()) return st;
    }
    int64_t at = 0;
    for (int i = 0; i < r; ++i) at += recv_counts[size_t(i)];
    std::vector<const void*> parts(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) parts[size_t(i)] = gathered.data() + all.size() * size_t(i) + size_t(at) * es;
    reduce(recv, parts.data(), n, recv_counts[size_t(r)], dtype, op, prescale, postscale, n);
    return Status::ok();
  }
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) offsets[size_t(i) + 1] = offsets[size_t(i)] + size_t(recv_counts[size_t(i)]) * es;
  const void* self[1] = {send};
  if (n == 1) {
    reduce(recv, self, 1, total, dtype, op, prescale, postscale, 1);
    return Status::ok();
  }
  const char* in = static_cast<const char*>(send);
  std::vector<char> scaled;
  if (prescale != 1.0) {
    scaled.resize(offsets.back());
    reduce(scaled.data(), self, 1, total, dtype, HPCDL_SUM, prescale, 1.0, 1);
    in = scaled.data();
  }
  // Pipelined ring: partial results of the other segments go to `work` on their way; segment r to recv.
  const Ring ring(p, std::move(offsets), kRingChunkBytes);
  std::vector<char> work(ring.offsets.back());
  Schedule s;
  const Areas input(in, work.size()), partials(work.data(), work.size()), mine(recv, ring.seg_len(r));
  ring_reduce_scatter(s, ring, input, partials, mine, p.scratch(ring.chunk), dtype, op, postscale, n);
  return p.run(s, deadline, what);
}

}  // namespace hpcdl
