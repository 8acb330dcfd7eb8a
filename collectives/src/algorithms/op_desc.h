// What a rank is about to do in a collective, exchanged before any data moves so that ranks that
// disagree (different op, dtype, size or root) all fail with the same clear message instead of hanging.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm.h"

namespace hpcdl {

struct OpDesc {
  int32_t type = -1;  // hpcdl_op_type
  int32_t dtype = 0;
  int32_t op = 0;  // reduce op, or the root for broadcast
  int32_t pad = 0;
  int64_t count = 0;
  // allgatherv/reducescatter: counts of every rank; alltoallv: send counts then recv counts.
  std::vector<int64_t> vec;

  static size_t wire_size(int nranks) { return 24 + 16 * size_t(nranks); }
  void serialize(void* out, int nranks) const;
  static OpDesc deserialize(const void* in, int nranks);
};

OpDesc make_desc(int type, int dtype, int op, int64_t count, std::vector<int64_t> vec = {});

// Checks that the descriptors of all ranks (indexed by comm rank) agree; `world` maps comm to world ranks.
Status check_descs(const std::vector<OpDesc>& descs, const std::vector<int>& world, const std::string& what);

// "allreduce float32 sum, 10 elements" and friends.
std::string describe(const OpDesc& d);
std::string collective_name(int type);

}  // namespace hpcdl
