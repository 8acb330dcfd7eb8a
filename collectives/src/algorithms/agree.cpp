#include "algorithms/p2p.h"

namespace hpcdl {

Status p2p_agree(P2P& p, const OpDesc& desc, Deadline deadline, const std::string& what, std::vector<OpDesc>* all) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t wire = OpDesc::wire_size(n);
  std::vector<char> mine(wire), theirs(wire);
  desc.serialize(mine.data(), n);
  std::vector<OpDesc> descs(static_cast<size_t>(n));
  descs[size_t(r)] = OpDesc::deserialize(mine.data(), n);
  for (int s = 1; s < n; ++s) {
    int to = (r + s) % n, from = (r - s + n) % n;
    Status st = p.sendrecv(to, mine.data(), wire, from, theirs.data(), wire, deadline, what);
    if (!st.is_ok()) return st;
    descs[size_t(from)] = OpDesc::deserialize(theirs.data(), n);
  }
  Status st = check_descs(descs, p.p2p_world(), what);
  if (all) *all = std::move(descs);
  return st;
}

Status p2p_barrier(P2P& p, Deadline deadline, const std::string& what) {
  return p2p_agree(p, make_desc(HPCDL_OP_BARRIER, 0, 0, 0), deadline, what);
}

}  // namespace hpcdl
