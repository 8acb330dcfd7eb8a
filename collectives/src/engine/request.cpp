#include "engine/request.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <string_view>

#include "hpcdl/c_api.h"

namespace hpcdl {

int64_t OpRequest::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t OpRequest::row_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

bool OpRequest::same_as(const OpRequest& o) const {
  return name == o.name && op_type == o.op_type && process_set == o.process_set && dtype == o.dtype &&
         reduce_op == o.reduce_op && root == o.root && group_id == o.group_id && group_size == o.group_size &&
         placement == o.placement && prescale == o.prescale && postscale == o.postscale && shape == o.shape &&
         splits == o.splits && members == o.members;
}

void OpRequest::encode(ByteWriter& out) const {
  out.put_string(name);
  out.put(op_type);
  out.put(process_set);
  out.put(dtype);
  out.put(reduce_op);
  out.put(root);
  out.put(group_id);
  out.put(group_size);
  out.put(placement);
  out.put(prescale);
  out.put(postscale);
  out.put_i64s(shape);
  out.put_i64s(splits);
  out.put<uint32_t>(static_cast<uint32_t>(members.size()));
  for (int32_t m : members) out.put(m);
}

bool OpRequest::decode(ByteReader& in) {
  return in.get_string(&name) && in.get(&op_type) && in.get(&process_set) && in.get(&dtype) &&
         in.get(&reduce_op) && in.get(&root) && in.get(&group_id) && in.get(&group_size) && in.get(&placement) &&
         in.get(&prescale) &&
         in.get(&postscale) && in.get_i64s(&shape) && in.get_i64s(&splits) && decode_members(in);
}

bool OpRequest::decode_members(ByteReader& in) {
  uint32_t n = 0;
  if (!in.get(&n) || n > (1u << 24)) return false;
  members.resize(n);
  for (uint32_t i = 0; i < n; ++i)
    if (!in.get(&members[i])) return false;
  return true;
}

int dtype_size(int dtype) {
  switch (dtype) {
    case HPCDL_UINT8:
    case HPCDL_INT8:
    case HPCDL_BOOL:
      return 1;
    case HPCDL_INT16:
    case HPCDL_FLOAT16:
    case HPCDL_BFLOAT16:
      return 2;
    case HPCDL_INT32:
    case HPCDL_FLOAT32:
      return 4;
    case HPCDL_INT64:
    case HPCDL_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

const char* dtype_name(int dtype) {
  static const char* names[] = {"uint8",   "int8",     "int16",   "int32",   "int64",
                                "float16", "bfloat16", "float32", "float64", "bool"};
  return dtype >= 0 && dtype <= 9 ? names[dtype] : "unknown dtype";
}

const char* op_type_name(int op_type) {
  static const char* names[] = {"allreduce", "allgather", "broadcast", "alltoall",
                                "reducescatter", "barrier", "join"};
  return op_type >= 0 && op_type <= 6 ? names[op_type] : "unknown op";
}

const char* op_type_upper(int op_type) {
  static const char* names[] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                                "REDUCESCATTER", "BARRIER", "JOIN"};
  return op_type >= 0 && op_type <= 6 ? names[op_type] : "UNKNOWN";
}

namespace {
constexpr char kUnnamed[] = ".noname.";
}

std::string unnamed_name(int op_type, int64_t n) {
  return std::string(op_type_name(op_type)) + kUnnamed + std::to_string(n);
}

int64_t unnamed_number(int op_type, const std::string& name) {
  const std::string_view type = op_type_name(op_type), infix = kUnnamed;
  const size_t digits = type.size() + infix.size();
  if (name.size() <= digits || name.size() > digits + 18 || name.compare(0, type.size(), type) != 0 ||
      name.compare(type.size(), infix.size(), infix) != 0)
    return -1;
  int64_t n = 0;
  for (size_t i = digits; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

const char* placement_name(int placement) {
  return placement == HPCDL_PLACEMENT_DEVICE ? "a device tensor (GPU path)" : "a host tensor (engine data plane)";
}

const char* reduce_op_name(int reduce_op) {
  static const char* names[] = {"sum", "average", "min", "max", "product"};
  return reduce_op >= 0 && reduce_op <= 4 ? names[reduce_op] : "unknown reduction";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  return s.str();
}

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (i ? ", " : "") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return text;
}

std::string describe(int32_t op_type, const std::string& name, int32_t process_set) {
  std::string text = std::string(op_type_name(op_type)) + " '" + name + "'";
  if (process_set != 0) text += " (process set " + std::to_string(process_set) + ")";
  return text;
}

std::string describe(const OpRequest& r) { return describe(r.op_type, r.name, r.process_set); }

std::string track_of(const OpRequest& r) {
  return r.process_set == 0 ? r.name : r.name + " [set " + std::to_string(r.process_set) + "]";
}

std::string wire_problem(const OpRequest& r, int world_size) {
  if (r.op_type < HPCDL_OP_ALLREDUCE || r.op_type > HPCDL_OP_JOIN)
    return "unknown operation type " + std::to_string(r.op_type);
  if (dtype_size(r.dtype) == 0) return "unknown dtype " + std::to_string(r.dtype);
  if (r.placement != HPCDL_PLACEMENT_HOST && r.placement != HPCDL_PLACEMENT_DEVICE)
    return "unknown placement " + std::to_string(r.placement);
  const bool reduces = r.op_type == HPCDL_OP_ALLREDUCE || r.op_type == HPCDL_OP_REDUCESCATTER;
  if (reduces && (r.reduce_op < HPCDL_SUM || r.reduce_op > HPCDL_PRODUCT))
    return "unknown reduction " + std::to_string(r.reduce_op);
  if (r.group_id < 0 || r.group_size < 0 || (r.group_id != 0 && r.group_size < 1))
    return "group " + std::to_string(r.group_id) + " of " + std::to_string(r.group_size);
  // Bytes stay below 2^62, so that sums of a few of them and their products with small factors do not overflow.
  const int64_t limit = (int64_t(1) << 62) / dtype_size(r.dtype);
  int64_t elements = 1;
  for (int64_t d : r.shape) {
    if (d < 0 || (d > 0 && elements > limit / d)) return "shape " + shape_text(r.shape);
    elements *= d;
  }
  int n = world_size;
  if (r.process_set == 0) {
    if (!r.members.empty()) return "a member list for the global process set";
  } else {
    for (size_t i = 0; i < r.members.size(); ++i)
      if (r.members[i] < 0 || r.members[i] >= world_size || (i > 0 && r.members[i] <= r.members[i - 1]))
        return "process set members that are not distinct ranks of the job in order";
    if (r.members.empty()) return "an empty process set";
    n = int(r.members.size());
  }
  if (r.op_type == HPCDL_OP_BROADCAST) {
    const bool member = r.process_set == 0 ? r.root >= 0 && r.root < world_size
                                           : std::find(r.members.begin(), r.members.end(), r.root) != r.members.end();
    if (!member) return "broadcast root " + std::to_string(r.root) + " outside the process set";
  }
  const bool rows_op = r.op_type == HPCDL_OP_ALLGATHER || r.op_type == HPCDL_OP_ALLTOALL ||
                       r.op_type == HPCDL_OP_REDUCESCATTER;
  if (rows_op && r.shape.empty()) return "a scalar for an operation on rows";
  if (r.op_type != HPCDL_OP_ALLTOALL) return r.splits.empty() ? "" : "splits for an operation that takes none";
  if (r.splits.empty()) return r.rows() % n == 0 ? "" : "rows that do not divide among the set without splits";
  if (int(r.splits.size()) != n)
    return std::to_string(r.splits.size()) + " splits for a process set of " + std::to_string(n) + " members";
  int64_t sum = 0;
  for (int64_t s : r.splits) {
    if (s < 0 || s > r.rows() - sum) return "splits " + shape_text(r.splits) + " for " + std::to_string(r.rows()) + " rows";
    sum += s;
  }
  return sum == r.rows() ? "" : "splits " + shape_text(r.splits) + " for " + std::to_string(r.rows()) + " rows";
}

namespace {

// Groups members by the text of one property; returns "X on ranks 0, 2, Y on rank 1" when they differ.
template <typename Text>
bool differs(const std::vector<const OpRequest*>& requests, const std::vector<int>& world_ranks, Text text,
             std::string* detail) {
  std::map<std::string, std::vector<int>> by_value;
  std::vector<std::string> order;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == nullptr) continue;
    std::string value = text(*requests[i]);
    if (by_value.find(value) == by_value.end()) order.push_back(value);
    by_value[value].push_back(world_ranks[i]);
  }
  if (order.size() <= 1) return false;
  std::ostringstream s;
  for (size_t i = 0; i < order.size(); ++i) s << (i ? ", " : "") << order[i] << " on " << rank_ranges(by_value[order[i]]);
  *detail = s.str();
  return true;
}

// Allgather and alltoall: the first dimension may differ per rank, the others may not ("[*, 3]").
std::string tail_shape(const OpRequest& r) {
  std::string text = "[";
  for (size_t i = 0; i < r.shape.size(); ++i) text += (i ? ", " : "") + (i ? std::to_string(r.shape[i]) : "*");
  return text + "]";
}

std::string scale_text(const OpRequest& r) {
  std::ostringstream s;
  s << "(prescale " << r.prescale << ", postscale " << r.postscale << ")";
  return s.str();
}

bool any_op(int) { return true; }
bool whole_shape_op(int op) {
  return op == HPCDL_OP_ALLREDUCE || op == HPCDL_OP_BROADCAST || op == HPCDL_OP_REDUCESCATTER;
}
bool tail_shape_op(int op) { return op == HPCDL_OP_ALLGATHER || op == HPCDL_OP_ALLTOALL; }
bool reducing_op(int op) { return op == HPCDL_OP_ALLREDUCE || op == HPCDL_OP_REDUCESCATTER; }
bool rooted_op(int op) { return op == HPCDL_OP_BROADCAST; }

// One property every member must submit alike: for which operations it counts, how two requests compare
// (the common case, checked for every request without building any text: a step's hundreds of gradients
// pass here), and the text that names a member's value when they differ.
struct Property {
  const char* name;
  bool (*applies)(int op_type);
  bool (*same)(const OpRequest& a, const OpRequest& b);
  std::string (*text)(const OpRequest& r);
};

const Property kProperties[] = {
    {"operation", any_op, [](const OpRequest& a, const OpRequest& b) { return a.op_type == b.op_type; },
     [](const OpRequest& r) { return std::string(op_type_name(r.op_type)); }},
    {"placement", any_op, [](const OpRequest& a, const OpRequest& b) { return a.placement == b.placement; },
     [](const OpRequest& r) { return std::string(placement_name(r.placement)); }},
    {"dtype", any_op, [](const OpRequest& a, const OpRequest& b) { return a.dtype == b.dtype; },
     [](const OpRequest& r) { return std::string(dtype_name(r.dtype)); }},
    {"shape", whole_shape_op, [](const OpRequest& a, const OpRequest& b) { return a.shape == b.shape; },
     [](const OpRequest& r) { return shape_text(r.shape); }},
    {"shape", tail_shape_op,
     [](const OpRequest& a, const OpRequest& b) {
       return a.shape.size() == b.shape.size() &&
              std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                         b.shape.begin() + (b.shape.empty() ? 0 : 1));
     },
     tail_shape},
    {"reduction", reducing_op, [](const OpRequest& a, const OpRequest& b) { return a.reduce_op == b.reduce_op; },
     [](const OpRequest& r) { return std::string(reduce_op_name(r.reduce_op)); }},
    {"scaling", reducing_op,
     [](const OpRequest& a, const OpRequest& b) { return a.prescale == b.prescale && a.postscale == b.postscale; },
     scale_text},
    {"root", rooted_op, [](const OpRequest& a, const OpRequest& b) { return a.root == b.root; },
     [](const OpRequest& r) { return std::to_string(r.root); }},
    {"group", any_op,
     [](const OpRequest& a, const OpRequest& b) { return a.group_id == b.group_id && a.group_size == b.group_size; },
     [](const OpRequest& r) {
       return r.group_id == 0 ? std::string("none")
                              : std::to_string(r.group_id) + " (of " + std::to_string(r.group_size) + ")";
     }},
};

}  // namespace

bool validate_requests(const std::vector<const OpRequest*>& requests, const std::vector<int>& world_ranks,
                       std::string* message) {
  const OpRequest* first = nullptr;
  for (const OpRequest* r : requests)
    if (r != nullptr && first == nullptr) first = r;
  if (first == nullptr) return true;
  // The properties in order; the first whose texts differ is the one the error names. (Values that compare
  // unequal but print alike, such as scale factors beyond the printed precision, are let through.)
  for (const Property& p : kProperties) {
    if (!p.applies(first->op_type)) continue;
    if (std::all_of(requests.begin(), requests.end(), [&](const OpRequest* r) { return !r || p.same(*first, *r); }))
      continue;
    std::string detail;
    if (!differs(requests, world_ranks, p.text, &detail)) continue;
    *message = std::string("mismatched ") + p.name + " for " + describe(*first) + ": " + p.name + " " + detail +
               ". Every rank must submit the same " + p.name +
               " under one name; use distinct names for different tensors.";
    return false;
  }
  return true;
}

}  // namespace hpcdl
