#include <algorithm>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

namespace {
// Whether an allreduce takes the exchange (every input to every rank with the agreement) rather than a ring:
// small ones, fewer elements than ranks, and integers with a prescale, which are summed in double from the
// raw inputs (a pre-scaled integer copy would truncate each contribution).
bool takes_exchange(int n, int64_t count, int dtype, double prescale, size_t small_message_bytes) {
  return size_t(count) * dtype_bytes(dtype) <= small_message_bytes || count < n ||
         (!is_float_dtype(dtype) && prescale != 1.0);
}
}  // namespace

Status p2p_allreduce(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                     double postscale, size_t small_message_bytes, Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype), bytes = size_t(count) * es;
  auto* out = static_cast<char*>(recv);
  if (n == 1) {  // a one-rank job: nobody to agree with, nothing to exchange (and no buffer to clear per call)
    reduce(out, &send, 1, count, dtype, op, prescale, postscale, 1);
    return Status::ok();
  }
  const bool exchange = takes_exchange(n, count, dtype, prescale, small_message_bytes);

  // One round with every rank at once: the agreement on the arguments and, on the exchange path, the
  // whole inputs behind it.
  std::vector<char> all(exchange ? bytes * size_t(n) : 0);
  Inline data;
  if (exchange) {
    data = {send, bytes, all.data(), {}, std::vector<size_t>(size_t(n), bytes)};
    for (int q = 0; q < n; ++q) data.at.push_back(bytes * size_t(q));
  }
  Status st = p2p_agree(p, make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what, nullptr,
                        exchange ? &data : nullptr);
  if (!st.is_ok()) return st;
  if (exchange) {  // everybody reduces everything in rank order: bitwise identical results
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) srcs[size_t(q)] = q == r ? send : all.data() + bytes * size_t(q);
    reduce(out, srcs.data(), n, count, dtype, op, prescale, postscale, n);
    return Status::ok();
  }
  return p2p_ring_allreduce(p, Areas(send, bytes), Areas(recv, bytes), count, dtype, op, prescale, postscale, n,
                            deadline, what);
}

Status p2p_allreduce_segments(P2P& p, const std::vector<Segment>& segments, int dtype, int op, double prescale,
                              double postscale, size_t small_message_bytes, Deadline deadline,
                              const std::string& what) {
  if (segments.size() == 1) {
    const Segment& only = segments.front();
    return p2p_allreduce(p, only.send, only.recv, only.count, dtype, op, prescale, postscale, small_message_bytes,
                         deadline, what);
  }
  const size_t es = dtype_bytes(dtype);
  int64_t count = 0;
  for (const Segment& s : segments) count += s.count;
  const int n = p.p2p_size();
  const auto [send, recv] = segment_areas(segments, es);
  // One rank (a host of one on the hierarchical path) reduces each segment into its output, no buffer between.
  if (n == 1) return p2p_ring_allreduce(p, send, recv, count, dtype, op, prescale, postscale, 1, deadline, what);
  // What takes no ring is packed into one buffer: the exchange's data travels as one block.
  if (takes_exchange(n, count, dtype, prescale, small_message_bytes)) {
    std::vector<char> packed(size_t(count) * es);
    send.pack(packed.data());
    Status st = p2p_allreduce(p, packed.data(), packed.data(), count, dtype, op, prescale, postscale,
                              small_message_bytes, deadline, what);
    if (st.is_ok()) recv.unpack(packed.data());
    return st;
  }
  Status st = p2p_agree(p, make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what);
  if (!st.is_ok()) return st;
  return p2p_ring_allreduce(p, send, recv, count, dtype, op, prescale, postscale, n, deadline, what);
}

namespace {
// Pipelined ring: reduce-scatter, then allgather, chunk by chunk, straight from the input into the output.
Status ring_piece(P2P& p, const Areas& send, const Areas& recv, int64_t count, int dtype, int op, double prescale,
                  double postscale, int64_t divisor, Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype), bytes = size_t(count) * es;
  const Areas* in = &send;
  if (n == 1 || prescale != 1.0) {  // one rank: the result; else the scaled input, reduced in place from here
    each_pair(recv, 0, send, 0, bytes, [&](char* out, char* input, size_t, size_t len) {
      const void* self[1] = {input};
      if (n == 1) reduce(out, self, 1, int64_t(len / es), dtype, op, prescale, postscale, divisor);
      else reduce(out, self, 1, int64_t(len / es), dtype, HPCDL_SUM, prescale, 1.0, 1);
    });
    if (n == 1) return Status::ok();
    in = &recv;
  }
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    int64_t len = count / n + (i < count % n ? 1 : 0);
    offsets[size_t(i) + 1] = offsets[size_t(i)] + size_t(len) * es;
  }
  const Ring ring(p, std::move(offsets), kRingChunkBytes);
  char* tmp = p.scratch(std::min(ring.chunk, ring.seg_len(0)));
  const Areas mine = recv.window(ring.offsets[size_t(r)], ring.seg_len(r));
  Schedule s;
  const std::vector<int> ready = ring_reduce_scatter(s, ring, *in, recv, mine, tmp, dtype, op, postscale, divisor);
  ring_allgather(s, ring, recv, ready);
  return p.run(s, deadline, what);
}

}  // namespace

Status p2p_ring_allreduce(P2P& p, const Areas& send, const Areas& recv, int64_t count, int dtype, int op,
                          double prescale, double postscale, int64_t divisor, Deadline deadline,
                          const std::string& what) {
  const size_t es = dtype_bytes(dtype);
  const int64_t piece = std::max<int64_t>(1, int64_t(kRingPieceBytes / es));
  if (count <= piece) return ring_piece(p, send, recv, count, dtype, op, prescale, postscale, divisor, deadline, what);
  for (int64_t at = 0; at < count; at += piece) {
    const size_t from = size_t(at) * es, len = size_t(std::min(piece, count - at)) * es;
    Status st = ring_piece(p, send.window(from, len), recv.window(from, len), int64_t(len / es), dtype, op, prescale,
                           postscale, divisor, deadline, what);
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

}  // namespace hpcdl
