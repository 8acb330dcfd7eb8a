// Checks that every kind of shared-memory collective times its own full chunks and makes its own choice of
// staging stores (cached or streaming), the same on every rank (collectives/src/transport/shm_comm.*,
// staging_stores.*). Two forked ranks run each collective in auto mode over many full chunks, checking the
// results; each then reports, per kind, how many trials of the other kind of store its StagingStores began
// and which kind it uses now. Built and run by tests/unit/test_staging_stores.py; prints one "ok" or "FAIL"
// line per check.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "forked_ranks.h"

using namespace forked_ranks;  // check, start, finish, ... (the helpers of these programs)
using hpcdl::ShmComm;
using hpcdl::ShmParams;
using hpcdl::Status;

namespace {
constexpr size_t kChunkBytes = 64 << 10;
constexpr int64_t kCount = 4 * kChunkBytes / sizeof(float);  // floats per rank: four full chunks a call
constexpr int kCalls = 48;                                     // 192 full chunks of each kind
const char* const kKinds[] = {"allreduce", "allgather", "broadcast", "alltoall", "reducescatter"};

// One rank: each collective kCalls times, results checked. The message lists each kind's trials and choice.
Status run_rank(int rank, int name_in, int name_out) {
  ShmParams params;
  params.chunk_bytes = kChunkBytes;
  params.small_message_bytes = 4096;
  params.stores = hpcdl::StagingStores::Mode::kAuto;
  std::shared_ptr<ShmComm> comm;
  Status st = make_comm(2, rank, params, name_in, name_out, 20.0, &comm);
  if (!st.is_ok()) return st;
  const hpcdl::Deadline deadline = in_seconds(60.0);
  std::vector<float> in(static_cast<size_t>(kCount), float(rank + 1));
  std::vector<float> out(static_cast<size_t>(2 * kCount)), root(static_cast<size_t>(kCount));
  const std::vector<int64_t> whole = {kCount, kCount}, halves = {kCount / 2, kCount / 2};
  auto expect = [&](bool ok, const char* what) {
    if (st.is_ok() && !ok) st = Status::error(HPCDL_ERR_INTERNAL, std::string(what) + " gave a wrong result");
  };
  for (int call = 0; call < kCalls && st.is_ok(); ++call) {
    st = comm->allreduce(in.data(), out.data(), kCount, HPCDL_FLOAT32, HPCDL_SUM, 1.0, 1.0, deadline, "allreduce");
    expect(out[0] == 3.0f && out[size_t(kCount - 1)] == 3.0f, "allreduce");
    if (st.is_ok()) st = comm->allgatherv(in.data(), out.data(), whole, HPCDL_FLOAT32, deadline, "allgather");
    expect(out[0] == 1.0f && out[size_t(2 * kCount - 1)] == 2.0f, "allgather");
    std::fill(root.begin(), root.end(), rank == 0 ? 5.0f : 0.0f);
    if (st.is_ok()) st = comm->broadcast(root.data(), kCount, HPCDL_FLOAT32, 0, deadline, "broadcast");
    expect(root[size_t(kCount - 1)] == 5.0f, "broadcast");
    if (st.is_ok()) st = comm->alltoallv(in.data(), halves, out.data(), halves, HPCDL_FLOAT32, deadline, "alltoall");
    expect(out[0] == 1.0f && out[size_t(kCount - 1)] == 2.0f, "alltoall");
    if (st.is_ok())
      st = comm->reducescatter(in.data(), out.data(), halves, HPCDL_FLOAT32, HPCDL_SUM, 1.0, 1.0, deadline,
                               "reducescatter");
    expect(out[0] == 3.0f && out[size_t(kCount / 2 - 1)] == 3.0f, "reducescatter");
  }
  if (!st.is_ok()) return st;
  std::string report;
  for (int k = 0; k < ShmComm::kChunkKinds; ++k) {
    const hpcdl::StagingStores& stores = comm->stores(ShmComm::ChunkKind(k));
    report += std::string(kKinds[k]) + " " + std::to_string(stores.trials()) + " " +
              (stores.streaming() ? "streaming" : "cached") + ";";
  }
  return Status{HPCDL_OK, report};
}

// The number after `kind ` in a rank's report (-1 when absent).
int trials_of(const std::string& report, const std::string& kind) {
  const size_t at = report.find(kind + " ");
  return at == std::string::npos ? -1 : std::atoi(report.c_str() + at + kind.size() + 1);
}
}  // namespace

int main() {
  int names[2];
  if (pipe(names) != 0) return 1;
  Child member = start([&] { return run_rank(1, names[0], -1); });
  Child maker = start([&] { return run_rank(0, -1, names[1]); });
  close(names[0]);
  close(names[1]);
  const Outcome first = finish(maker), second = finish(member);
  check(first.ok && second.ok, "both ranks ran every collective with right results",
        first.message + " | " + second.message);
  for (const char* kind : kKinds) {
    const int trials = trials_of(first.message, kind);
    check(trials >= 2, std::string(kind) + ": its full chunks were timed and its stores tried the other kind",
          first.message);
  }
  check(first.message == second.message, "both ranks made the same choices, kind by kind",
        first.message + " | " + second.message);
  return failures == 0 ? 0 : 1;
}
