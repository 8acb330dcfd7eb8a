#include <cstring>
#include <new>

#include "algorithms/p2p.h"

namespace hpcdl {
namespace {

// What opens every collective on every link: the descriptor, then its count vector and the payload (the
// lengths say how many bytes follow, so a link stays in step even when ranks called different collectives).
struct Header {
  int32_t type, dtype, op, pad;
  int64_t count, vec_len, payload;
};

}  // namespace

Status p2p_agree(P2P& p, const OpDesc& desc, Deadline deadline, const std::string& what, std::vector<OpDesc>* all,
                 const Inline* data) {
  const int n = p.p2p_size(), r = p.p2p_rank();
  const size_t payload_bytes = data ? data->bytes : 0;
  auto expected = [&](int q) { return data ? data->len[size_t(q)] : 0; };
  std::vector<Header> heads(static_cast<size_t>(n));
  heads[size_t(r)] = {desc.type, desc.dtype, desc.op, 0, desc.count, int64_t(desc.vec.size()), int64_t(payload_bytes)};
  std::vector<std::vector<int64_t>> vecs(static_cast<size_t>(n));
  std::vector<std::vector<char>> stray(static_cast<size_t>(n));  // payloads of ranks that disagree
  Schedule s;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    s.send(q, &heads[size_t(r)], sizeof(Header));
    if (!desc.vec.empty()) s.send(q, desc.vec.data(), desc.vec.size() * sizeof(int64_t));
    if (payload_bytes) s.send(q, data->mine, payload_bytes);
    const int vec_item = int(s.recvs().size()) + 1, payload_item = vec_item + 1;
    s.recv(q, &heads[size_t(q)], sizeof(Header), [&, q, vec_item, payload_item]() {
      const Header& h = heads[size_t(q)];
      const size_t vec_len = size_t(std::max<int64_t>(0, h.vec_len)), theirs = size_t(std::max<int64_t>(0, h.payload));
      try {
        vecs[size_t(q)].resize(vec_len);
        s.set_recv(vec_item, vecs[size_t(q)].data(), vec_len * sizeof(int64_t));
        if (theirs == expected(q) && data) {
          s.set_recv(payload_item, data->into + data->at[size_t(q)], theirs);
        } else {
          stray[size_t(q)].resize(theirs);
          s.set_recv(payload_item, stray[size_t(q)].data(), theirs);
        }
      } catch (const std::bad_alloc&) {
        return Status::error(HPCDL_ERR_INTERNAL, what + ": rank " + std::to_string(p.p2p_world()[size_t(q)]) +
                                                     " announced more than this rank can hold");
      }
      return Status::ok();
    });
    s.recv(q, nullptr, 0);
    s.recv(q, nullptr, 0);
  }
  Status st = p.run(s, deadline, what);
  if (!st.is_ok()) return st;
  std::vector<OpDesc> descs;
  bool same_payload = true;
  for (int q = 0; q < n; ++q) {
    const Header& h = heads[size_t(q)];
    std::vector<int64_t> vec = q == r ? desc.vec : vecs[size_t(q)];
    vec.resize(size_t(2 * n), 0);
    descs.push_back(make_desc(h.type, h.dtype, h.op, h.count, std::move(vec)));
    same_payload = same_payload && h.payload == int64_t(q == r ? payload_bytes : expected(q));
  }
  st = check_descs(descs, p.p2p_world(), what);
  if (st.is_ok() && !same_payload) {
    std::string sizes;
    for (int q = 0; q < n; ++q)
      sizes += (q ? ", " : "") + std::string("rank ") + std::to_string(p.p2p_world()[size_t(q)]) + ": " +
               std::to_string(heads[size_t(q)].payload);
    st = Status::error(HPCDL_ERR_MISMATCH, what + ": ranks chose different algorithms for the same arguments "
                                                  "(bytes sent inline: " + sizes + "); every rank must use the same "
                                                  "HPCDL_SMALL_MESSAGE_BYTES and, for integers, the same prescale");
  }
  if (all) *all = std::move(descs);
  return st;
}

Status p2p_barrier(P2P& p, Deadline deadline, const std::string& what) {
  return p2p_agree(p, make_desc(HPCDL_OP_BARRIER, 0, 0, 0), deadline, what);
}

}  // namespace hpcdl
