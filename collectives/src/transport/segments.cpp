// The default segmented allreduce of Comm: copy the segments into one buffer, reduce, copy back.
#include <cstring>
#include <vector>

#include "comm.h"
#include "kernels/reduce.h"

namespace hpcdl {

Status Comm::allreduce_segments(const std::vector<Segment>& segments, int dtype, int op, double prescale,
                                double postscale, Deadline deadline, const std::string& what) {
  const size_t es = dtype_bytes(dtype);
  int64_t total = 0;
  for (const Segment& s : segments) total += s.count;
  std::vector<char> buffer(size_t(total) * es);
  size_t at = 0;
  for (const Segment& s : segments) {
    if (s.count > 0) std::memcpy(buffer.data() + at, s.send, size_t(s.count) * es);
    at += size_t(s.count) * es;
  }
  Status st = allreduce(buffer.data(), buffer.data(), total, dtype, op, prescale, postscale, deadline, what);
  if (!st.is_ok()) return st;
  at = 0;
  for (const Segment& s : segments) {
    if (s.count > 0) std::memcpy(s.recv, buffer.data() + at, size_t(s.count) * es);
    at += size_t(s.count) * es;
  }
  return Status::ok();
}

}  // namespace hpcdl
