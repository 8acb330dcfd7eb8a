#include "algorithms/op_desc.h"

#include <cstring>

#include "kernels/reduce.h"

namespace hpcdl {

void OpDesc::serialize(void* out, int nranks) const {
  auto* p = static_cast<char*>(out);
  std::memset(p, 0, wire_size(nranks));
  std::memcpy(p, &type, 4);
  std::memcpy(p + 4, &dtype, 4);
  std::memcpy(p + 8, &op, 4);
  std::memcpy(p + 16, &count, 8);
  size_t n = std::min(vec.size(), size_t(2 * nranks));
  if (n) std::memcpy(p + 24, vec.data(), n * 8);
}

OpDesc OpDesc::deserialize(const void* in, int nranks) {
  const auto* p = static_cast<const char*>(in);
  OpDesc d;
  std::memcpy(&d.type, p, 4);
  std::memcpy(&d.dtype, p + 4, 4);
  std::memcpy(&d.op, p + 8, 4);
  std::memcpy(&d.count, p + 16, 8);
  d.vec.resize(size_t(2 * nranks));
  std::memcpy(d.vec.data(), p + 24, d.vec.size() * 8);
  return d;
}

OpDesc make_desc(int type, int dtype, int op, int64_t count, std::vector<int64_t> vec) {
  OpDesc d;
  d.type = type;
  d.dtype = dtype;
  d.op = op;
  d.count = count;
  d.vec = std::move(vec);
  return d;
}

std::string collective_name(int type) {
  switch (type) {
    case HPCDL_OP_ALLREDUCE: return "allreduce";
    case HPCDL_OP_ALLGATHER: return "allgather";
    case HPCDL_OP_BROADCAST: return "broadcast";
    case HPCDL_OP_ALLTOALL: return "alltoall";
    case HPCDL_OP_REDUCESCATTER: return "reducescatter";
    case HPCDL_OP_BARRIER: return "barrier";
    case HPCDL_OP_JOIN: return "join";
    default: return "op#" + std::to_string(type);
  }
}

static std::string vec_text(const std::vector<int64_t>& v, size_t from, size_t n) {
  std::string s = "[";
  for (size_t i = from; i < from + n && i < v.size(); ++i) s += (i > from ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string describe(const OpDesc& d) {
  std::string s = collective_name(d.type);
  if (d.type == HPCDL_OP_BARRIER) return s;
  s += std::string(" ") + dtype_label(d.dtype);
  size_t n = d.vec.size() / 2;
  switch (d.type) {
    case HPCDL_OP_ALLREDUCE: return s + " " + reduce_op_label(d.op) + ", " + std::to_string(d.count) + " elements";
    case HPCDL_OP_BROADCAST:
      return s + ", " + std::to_string(d.count) + " elements from root " + std::to_string(d.op);
    case HPCDL_OP_ALLGATHER: return s + ", counts " + vec_text(d.vec, 0, n);
    case HPCDL_OP_REDUCESCATTER: return s + " " + reduce_op_label(d.op) + ", counts " + vec_text(d.vec, 0, n);
    case HPCDL_OP_ALLTOALL: return s + ", send " + vec_text(d.vec, 0, n) + " recv " + vec_text(d.vec, n, n);
    default: return s;
  }
}

Status check_descs(const std::vector<OpDesc>& descs, const std::vector<int>& world, const std::string& what) {
  const OpDesc& a = descs[0];
  size_t n = descs.size();
  bool ok = true;
  for (size_t i = 1; i < n && ok; ++i) {
    const OpDesc& b = descs[i];
    ok = a.type == b.type && a.dtype == b.dtype;
    if (!ok) break;
    switch (a.type) {
      case HPCDL_OP_ALLREDUCE: ok = a.op == b.op && a.count == b.count; break;
      case HPCDL_OP_BROADCAST: ok = a.op == b.op && a.count == b.count; break;
      case HPCDL_OP_ALLGATHER: ok = std::equal(a.vec.begin(), a.vec.begin() + long(n), b.vec.begin()); break;
      case HPCDL_OP_REDUCESCATTER:
        ok = a.op == b.op && a.count == b.count && std::equal(a.vec.begin(), a.vec.begin() + long(n), b.vec.begin());
        break;
      default: break;
    }
  }
  if (ok && a.type == HPCDL_OP_ALLTOALL) {
    // rank i sends send_i[j] elements to rank j, which expects recv_j[i].
    for (size_t i = 0; i < n && ok; ++i)
      for (size_t j = 0; j < n && ok; ++j) ok = descs[i].vec[j] == descs[j].vec[n + i];
  }
  if (ok) return Status::ok();
  std::string msg = what + ": ranks called it with different arguments (";
  for (size_t i = 0; i < n; ++i)
    msg += (i ? "; " : "") + std::string("rank ") + std::to_string(world[i]) + ": " + describe(descs[i]);
  msg += "). Every rank of the process set must call the same collective with the same dtype, op, root and "
         "matching sizes, in the same order.";
  return Status::error(HPCDL_ERR_MISMATCH, msg);
}

}  // namespace hpcdl
