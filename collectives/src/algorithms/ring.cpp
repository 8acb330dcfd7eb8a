#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Ring::Ring(const P2P& p, std::vector<size_t> offs, size_t chunk_bytes)
    : n(p.p2p_size()), r(p.p2p_rank()), next((r + 1) % n), prev((r - 1 + n) % n), offsets(std::move(offs)),
      chunk(chunk_bytes), chunks(0) {
  size_t largest = 0;
  for (int i = 0; i < n; ++i) largest = std::max(largest, seg_len(i));
  chunks = (largest + chunk - 1) / chunk;
}

std::vector<int> ring_reduce_scatter(Schedule& s, const Ring& ring, const Areas& in, const Areas& acc,
                                     const Areas& mine, char* tmp, int dtype, int op, double postscale,
                                     int64_t divisor) {
  const size_t es = dtype_bytes(dtype);
  const int partial = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
  const int n = ring.n;
  std::vector<int> last(ring.chunks, -1);  // receives of the previous step, per chunk
  // Step k sends segment r-k-1 (this rank's input at k = 0, else what it combined at step k-1) and
  // combines segment r-k-2 with what arrives.
  for (int k = 0; k < n - 1; ++k) {
    const int out_seg = ring.seg(k + 1), in_seg = ring.seg(k + 2);
    const bool final_step = k == n - 2;
    const Areas& from = k == 0 ? in : acc;
    std::vector<int> got(ring.chunks, -1);
    for (size_t c = 0; c < ring.chunks; ++c) {
      const int after = last[c];
      from.each(ring.offsets[size_t(out_seg)] + ring.chunk_at(out_seg, c), ring.chunk_len(out_seg, c),
                [&](char* data, size_t, size_t len) { s.send(ring.next, data, len, after); });
      const size_t at = ring.chunk_at(in_seg, c), len = ring.chunk_len(in_seg, c);
      const size_t own = ring.offsets[size_t(in_seg)] + at;
      const Areas* dst = final_step ? &mine : &acc;
      const size_t dst_at = final_step ? at : own;
      const Areas* src = &in;
      got[c] = s.recv(ring.prev, tmp, len, [=]() {
        each_pair(*dst, dst_at, *src, own, len, [&](char* to, char* from_in, size_t rel, size_t bytes) {
          const void* srcs[2] = {from_in, tmp + rel};
          reduce(to, srcs, 2, int64_t(bytes / es), dtype, final_step ? op : partial, 1.0,
                 final_step ? postscale : 1.0, divisor);
        });
        return Status::ok();
      });
    }
    last = std::move(got);
  }
  return last;
}

void ring_allgather(Schedule& s, const Ring& ring, const Areas& out, const std::vector<int>& ready) {
  std::vector<int> last(ring.chunks, -1);
  for (size_t c = 0; c < ready.size() && c < last.size(); ++c) last[c] = ready[c];
  // Step k forwards segment r-k (its own at k = 0, else the one that arrived at step k-1).
  for (int k = 0; k < ring.n - 1; ++k) {
    const int out_seg = ring.seg(k), in_seg = ring.seg(k + 1);
    std::vector<int> got(ring.chunks, -1);
    for (size_t c = 0; c < ring.chunks; ++c) {
      const int after = last[c];
      out.each(ring.offsets[size_t(out_seg)] + ring.chunk_at(out_seg, c), ring.chunk_len(out_seg, c),
               [&](char* data, size_t, size_t len) { s.send(ring.next, data, len, after); });
      // A chunk over several areas is received piece by piece; its last piece completes it (a peer's
      // receives complete in order).
      out.each(ring.offsets[size_t(in_seg)] + ring.chunk_at(in_seg, c), ring.chunk_len(in_seg, c),
               [&](char* data, size_t, size_t len) { got[c] = s.recv(ring.prev, data, len); });
    }
    last = std::move(got);
  }
}

}  // namespace hpcdl
