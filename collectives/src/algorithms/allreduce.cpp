#include <algorithm>
#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status p2p_allreduce(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                     double postscale, size_t small_message_bytes, Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype), bytes = size_t(count) * es;
  auto* out = static_cast<char*>(recv);
  // Integers with a prescale are summed in double from the raw inputs (a pre-scaled integer copy would
  // truncate each contribution), so they always take the exchange.
  const bool int_scaled = !is_float_dtype(dtype) && prescale != 1.0;
  if (n == 1) {  // a one-rank job: nobody to agree with, nothing to exchange (and no buffer to clear per call)
    reduce(out, &send, 1, count, dtype, op, prescale, postscale, 1);
    return Status::ok();
  }
  const bool exchange = bytes <= small_message_bytes || count < n || int_scaled;

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
  return p2p_ring_allreduce(p, send, recv, count, dtype, op, prescale, postscale, n, deadline, what);
}

namespace {
// Pipelined ring: reduce-scatter, then allgather, chunk by chunk, straight from the input into the output.
Status ring_piece(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                  double postscale, int64_t divisor, Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t es = dtype_bytes(dtype);
  auto* out = static_cast<char*>(recv);
  const char* in = static_cast<const char*>(send);
  if (n == 1) {
    const void* self[1] = {send};
    reduce(out, self, 1, count, dtype, op, prescale, postscale, divisor);
    return Status::ok();
  }
  if (prescale != 1.0) {
    const void* self[1] = {send};
    reduce(out, self, 1, count, dtype, HPCDL_SUM, prescale, 1.0, 1);
    in = out;
  }
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    int64_t len = count / n + (i < count % n ? 1 : 0);
    offsets[size_t(i) + 1] = offsets[size_t(i)] + size_t(len) * es;
  }
  const Ring ring(p, std::move(offsets), kRingChunkBytes);
  char* tmp = p.scratch(std::min(ring.chunk, ring.seg_len(0)));
  Schedule s;
  const std::vector<int> ready = ring_reduce_scatter(s, ring, in, out, out + ring.offsets[size_t(r)], tmp, dtype, op,
                                                     postscale, divisor);
  ring_allgather(s, ring, out, ready);
  return p.run(s, deadline, what);
}

}  // namespace

Status p2p_ring_allreduce(P2P& p, const void* send, void* recv, int64_t count, int dtype, int op, double prescale,
                          double postscale, int64_t divisor, Deadline deadline, const std::string& what) {
  const size_t es = dtype_bytes(dtype);
  const int64_t piece = std::max<int64_t>(1, int64_t(kRingPieceBytes / es));
  for (int64_t at = 0; at < count; at += piece) {
    const int64_t len = std::min(piece, count - at);
    Status st = ring_piece(p, static_cast<const char*>(send) + size_t(at) * es, static_cast<char*>(recv) + size_t(at) * es,
                           len, dtype, op, prescale, postscale, divisor, deadline, what);
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

}  // namespace hpcdl
