// One rank's submission of a named operation, as every rank of the job sees it after negotiation, and
// the cross-rank validation of submissions that share a name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/wire.h"

namespace hpcdl {

struct OpRequest {
  std::string name;
  int32_t op_type = 0;
  int32_t process_set = 0;
  int32_t dtype = 0;
  int32_t reduce_op = 0;
  int32_t root = 0;  // world rank (broadcast)
  int32_t group_id = 0;
  int32_t group_size = 0;
  int32_t placement = 0;  // hpcdl_placement: host data (the engine moves it) or device data (the executor)
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall rows per set member; empty = even
  // World ranks of the process set (empty for the global set): carried with the request so that every
  // rank, member or not, negotiates the operation identically whatever its view of dynamic sets.
  std::vector<int32_t> members;

  int64_t num_elements() const;
  int64_t row_elements() const;  // elements per row of dim 0 (1 for scalars)
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  // The rows of dim 0 a reducescatter leaves with set member `member` of `members`: the first rows % members
  // members take one more.
  int64_t rows_of_member(int member, int members) const {
    return rows() / members + (member < rows() % members ? 1 : 0);
  }
  bool same_as(const OpRequest& other) const;  // identical submission (response-cache hit)

  void encode(ByteWriter& out) const;
  bool decode(ByteReader& in);

 private:
  bool decode_members(ByteReader& in);
};

// Size in bytes of one element of an hpcdl_dtype, 0 when unknown.
int dtype_size(int dtype);
const char* dtype_name(int dtype);
const char* op_type_name(int op_type);      // "allreduce", ...
const char* op_type_upper(int op_type);     // "ALLREDUCE", ... (timeline activity names)
// The name of a process set's n-th operation of a type submitted without a name ("allreduce.noname.<n>"),
// and back: n for such a name, -1 for any other. Every rank numbers its unnamed operations alike, so such a
// name means the same operation on every rank, and never comes again.
std::string unnamed_name(int op_type, int64_t n);
int64_t unnamed_number(int op_type, const std::string& name);
const char* reduce_op_name(int reduce_op);  // "sum", ...
std::string shape_text(const std::vector<int64_t>& shape);
std::string ranks_text(const std::vector<int>& ranks);  // "rank 3" / "ranks 0, 2"
std::string rank_ranges(std::vector<int> ranks);        // "rank 3" / "ranks 0, 2-4" (sorted, runs joined)
const char* placement_name(int placement);  // "host" / "device"
// "allreduce 'grad.w'" (with the process set when it is not the global one).
std::string describe(const OpRequest& request);
std::string describe(int32_t op_type, const std::string& name, int32_t process_set);
// The timeline track of a name: the name, with the process set when it is not the global one.
std::string track_of(const OpRequest& request);

// Why a submission received from another rank cannot be run as it stands, or "" when it can: an unknown
// operation, dtype, reduction or placement, a negative shape or one whose size overflows, members outside
// the job or out of order, a broadcast root outside the set, alltoall splits that do not fit the set or the
// tensor.
// Ranks check their own submissions at enqueue; this keeps a peer that runs another build, or is broken,
// from making this rank read out of bounds or allocate without end: the job fails with the reason instead.
std::string wire_problem(const OpRequest& request, int world_size);

// Checks that the submissions of one name agree. `requests[i]` is set member i's submission (nullptr
// when that member did not submit: it joined). On disagreement returns false and sets `message` to a
// text naming the tensor, the ranks and the difference; `world_ranks[i]` maps member i to a world rank.
bool validate_requests(const std::vector<const OpRequest*>& requests, const std::vector<int>& world_ranks,
                       std::string* message);

}  // namespace hpcdl
