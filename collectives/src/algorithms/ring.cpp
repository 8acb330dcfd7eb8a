#include <vector>

#include "algorithms/p2p.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status ring_reduce_scatter(P2P& p, char* work, const std::vector<size_t>& offsets, int dtype, int op,
                           Deadline deadline, const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  if (n == 1) return Status::ok();
  const size_t es = dtype_bytes(dtype);
  size_t largest = 0;
  for (int i = 0; i < n; ++i) largest = std::max(largest, offsets[size_t(i) + 1] - offsets[size_t(i)]);
  std::vector<char> tmp(largest);
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const int partial_op = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
  for (int s = 0; s < n - 1; ++s) {
    size_t send_seg = size_t(((r - s - 1) % n + n) % n), recv_seg = size_t(((r - s - 2) % n + 2 * n) % n);
    size_t send_len = offsets[send_seg + 1] - offsets[send_seg];
    size_t recv_len = offsets[recv_seg + 1] - offsets[recv_seg];
    Status st = p.sendrecv(next, work + offsets[send_seg], send_len, prev, tmp.data(), recv_len, deadline, what);
    if (!st.is_ok()) return st;
    char* acc = work + offsets[recv_seg];
    const void* srcs[2] = {acc, tmp.data()};
    reduce(acc, srcs, 2, int64_t(recv_len / es), dtype, partial_op, 1.0, 1.0, 1);
  }
  return Status::ok();
}

Status ring_allgather(P2P& p, char* work, const std::vector<size_t>& offsets, Deadline deadline,
                      const std::string& what) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    size_t send_seg = size_t(((r - s) % n + n) % n), recv_seg = size_t(((r - s - 1) % n + n) % n);
    Status st = p.sendrecv(next, work + offsets[send_seg], offsets[send_seg + 1] - offsets[send_seg], prev,
                           work + offsets[recv_seg], offsets[recv_seg + 1] - offsets[recv_seg], deadline, what);
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

}  // namespace hpcdl
