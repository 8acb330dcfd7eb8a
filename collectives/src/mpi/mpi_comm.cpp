// Communicator over MPI (transport=mpi): MPI's own collectives for the types and ops MPI has, an
// allgather plus our kernels for the rest (float16, bfloat16, bool, average, scaling). Every wait polls
// a non-blocking request against the deadline, so a dead peer cannot hang the caller forever.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "algorithms/op_desc.h"
#include "kernels/reduce.h"
#include "mpi/mpi_bootstrap.h"

namespace hpcdl {
namespace {

MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case HPCDL_UINT8: return MPI_UINT8_T;
    case HPCDL_INT8: return MPI_INT8_T;
    case HPCDL_INT16: return MPI_INT16_T;
    case HPCDL_INT32: return MPI_INT32_T;
    case HPCDL_INT64: return MPI_INT64_T;
    case HPCDL_FLOAT32: return MPI_FLOAT;
    case HPCDL_FLOAT64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;  // float16, bfloat16, bool: reduced by our kernels
  }
}

MPI_Op mpi_op(int op) {
  switch (op) {
    case HPCDL_SUM: return MPI_SUM;
    case HPCDL_MIN: return MPI_MIN;
    case HPCDL_MAX: return MPI_MAX;
    case HPCDL_PRODUCT: return MPI_PROD;
    default: return MPI_OP_NULL;
  }
}

class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm comm, const std::vector<int>& world) : comm_(comm), world_(world) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_dup(comm_, &bell_comm_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      // Receive doorbells nobody waited for, so MPI has no unmatched messages left at finalize.
      int flag = 1;
      while (flag) {
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, bell_comm_, &flag, &status);
        if (flag) MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, bell_comm_, MPI_STATUS_IGNORE);
      }
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&bell_comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_; }

  Status allreduce(const void* send, void* recv, int64_t count, int dtype, int op, double prescale, double postscale,
                   Deadline deadline, const std::string& what) override {
    Status st = agree(make_desc(HPCDL_OP_ALLREDUCE, dtype, op, count), deadline, what);
    if (!st.is_ok() || count == 0) return st;
    const size_t es = dtype_bytes(dtype), bytes = size_t(count) * es;
    const int partial = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
    MPI_Datatype type = mpi_type(dtype);
    if (type != MPI_DATATYPE_NULL && count <= INT32_MAX && (is_float_dtype(dtype) || prescale == 1.0)) {
      std::vector<char> scaled;
      const void* in = send;
      if (prescale != 1.0) {
        scaled.resize(bytes);
        const void* srcs[1] = {send};
        reduce(scaled.data(), srcs, 1, count, dtype, HPCDL_SUM, prescale, 1.0, 1);
        in = scaled.data();
      }
      MPI_Request req;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        MPI_Iallreduce(in == recv ? MPI_IN_PLACE : in, recv, int(count), type, mpi_op(partial), comm_, &req);
      }
      st = wait(&req, deadline, what);
      if (!st.is_ok()) return st;
      if (op == HPCDL_AVERAGE || postscale != 1.0) {
        const void* srcs[1] = {recv};
        reduce(recv, srcs, 1, count, dtype, op, 1.0, postscale, size_);
      }
      return Status::ok();
    }
    std::vector<char> all(bytes * size_t(size_));
    st = gather_all(send, bytes, all.data(), deadline, what);
    if (!st.is_ok()) return st;
    std::vector<const void*> srcs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) srcs[size_t(r)] = all.data() + bytes * size_t(r);
    reduce(recv, srcs.data(), size_, count, dtype, op, prescale, postscale, size_);
    return Status::ok();
  }

  Status allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts, int dtype, Deadline deadline,
                    const std::string& what) override {
    std::vector<int64_t> vec(counts);
    vec.resize(size_t(2 * size_), 0);
    Status st = agree(make_desc(HPCDL_OP_ALLGATHER, dtype, 0, counts[size_t(rank_)], vec), deadline, what);
    if (!st.is_ok()) return st;
    const size_t es = dtype_bytes(dtype);
    std::vector<int> rc(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      rc[size_t(r)] = int(size_t(counts[size_t(r)]) * es);
      displs[size_t(r)] = int(at);
      at += size_t(rc[size_t(r)]);
    }
    std::vector<char> copy(size_t(rc[size_t(rank_)]));
    if (!copy.empty()) std::memcpy(copy.data(), send, copy.size());
    MPI_Request req;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      MPI_Iallgatherv(copy.data(), rc[size_t(rank_)], MPI_BYTE, recv, rc.data(), displs.data(), MPI_BYTE, comm_, &req);
    }
    return wait(&req, deadline, what);
  }

  Status broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                   const std::string& what) override {
    Status st = agree(make_desc(HPCDL_OP_BROADCAST, dtype, root, count), deadline, what);
    if (!st.is_ok()) return st;
    MPI_Request req;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      MPI_Ibcast(buf, int(size_t(count) * dtype_bytes(dtype)), MPI_BYTE, root, comm_, &req);
    }
    return wait(&req, deadline, what);
  }

  Status alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, int dtype, Deadline deadline,
                   const std::string& what) override {
    std::vector<int64_t> vec(send_counts);
    vec.insert(vec.end(), recv_counts.begin(), recv_counts.end());
    Status st = agree(make_desc(HPCDL_OP_ALLTOALL, dtype, 0, 0, vec), deadline, what);
    if (!st.is_ok()) return st;
    const size_t es = dtype_bytes(dtype);
    std::vector<int> sc(static_cast<size_t>(size_)), sd(static_cast<size_t>(size_)), rc(static_cast<size_t>(size_)),
        rd(static_cast<size_t>(size_));
    int sat = 0, rat = 0;
    for (int r = 0; r < size_; ++r) {
      sc[size_t(r)] = int(size_t(send_counts[size_t(r)]) * es);
      rc[size_t(r)] = int(size_t(recv_counts[size_t(r)]) * es);
      sd[size_t(r)] = sat;
      rd[size_t(r)] = rat;
      sat += sc[size_t(r)];
      rat += rc[size_t(r)];
    }
    MPI_Request req;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_, &req);
    }
    return wait(&req, deadline, what);
  }

  Status reducescatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts, int dtype, int op,
                       double prescale, double postscale, Deadline deadline, const std::string& what) override {
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    std::vector<char> all(size_t(total) * dtype_bytes(dtype));
    Status st = allreduce(send, all.data(), total, dtype, op, prescale, postscale, deadline, what);
    if (!st.is_ok()) return st;
    int64_t at = 0;
    for (int r = 0; r < rank_; ++r) at += recv_counts[size_t(r)];
    std::memcpy(recv, all.data() + size_t(at) * dtype_bytes(dtype), size_t(recv_counts[size_t(rank_)]) * dtype_bytes(dtype));
    return Status::ok();
  }

  Status barrier(Deadline deadline, const std::string& what) override {
    return agree(make_desc(HPCDL_OP_BARRIER, 0, 0, 0), deadline, what);
  }

  // A ring is an empty message on the doorbells' own communicator whose tag carries the low bits of the
  // cycle it is for (a waiter for cycle c can only find rings for c or earlier cycles: see comm.h).
  void notify_peers(uint32_t cycle) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request req;
      MPI_Isend(nullptr, 0, MPI_BYTE, r, int(cycle & kBellTagMask), bell_comm_, &req);
      MPI_Request_free(&req);
    }
  }
  void notify_self() override {
    {
      std::lock_guard<std::mutex> lock(bell_mutex_);
      self_bell_ = true;
    }
    bell_cv_.notify_one();
  }
  // MPI has no blocking receive with a timeout, so a peer's bell is polled for: every 50 us at first, then
  // twice as long after each empty look, at most every kBellPollMax (an idle engine polling every 50 us
  // took 30% of a core away from the training). This rank's own bell wakes the wait at once.
  Bell wait_notify(uint32_t cycle, Deadline until) override {
    auto interval = std::chrono::microseconds(50);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        int flag = 1;
        while (flag) {
          MPI_Status status;
          MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, bell_comm_, &flag, &status);
          if (flag) {
            MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, bell_comm_, MPI_STATUS_IGNORE);
            // The tag's low bits tell the whole cycle number (rings are for cycles near `cycle`).
            uint32_t delta = (uint32_t(status.MPI_TAG) - cycle) & kBellTagMask;
            const uint32_t full = cycle + (delta > kBellTagMask / 2 ? delta - (kBellTagMask + 1) : delta);
            if (int32_t(full - bell_) > 0) bell_ = full;
          }
        }
      }
      if (int32_t(bell_ - cycle) >= 0) return Bell::kRung;
      {
        std::lock_guard<std::mutex> lock(bell_mutex_);
        if (self_bell_) {
          self_bell_ = false;
          return Bell::kPoked;
        }
      }
      const auto now = Clock::now();
      if (now >= until) return Bell::kTimeout;
      std::unique_lock<std::mutex> lock(bell_mutex_);
      bell_cv_.wait_until(lock, std::min<Deadline>(until, now + interval), [&] { return self_bell_; });
      interval = std::min(interval * 2, kBellPollMax);
    }
  }

 private:
  static constexpr uint32_t kBellTagMask = 0x3fff;  // tags up to 32767 are valid in every MPI
  uint32_t bell_ = 0;  // the latest cycle a peer rang for (only wait_notify's thread touches it)
  static constexpr std::chrono::microseconds kBellPollMax{1000};

  Status wait(MPI_Request* req, Deadline deadline, const std::string& what) {
    const auto start = Clock::now();
    while (true) {
      int done = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
      }
      if (done) return Status::ok();
      auto now = Clock::now();
      if (now >= deadline)
        return Status::error(HPCDL_ERR_TIMEOUT, what + ": timed out in MPI (HPCDL_TIMEOUT); a rank is hung, dead "
                                                       "or not calling the same collective");
      if (now - start > std::chrono::microseconds(50)) sched_yield();
    }
  }

  Status gather_all(const void* send, size_t bytes, void* all, Deadline deadline, const std::string& what) {
    MPI_Request req;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      MPI_Iallgather(send, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, comm_, &req);
    }
    return wait(&req, deadline, what);
  }

  Status agree(const OpDesc& desc, Deadline deadline, const std::string& what) {
    const size_t wire = OpDesc::wire_size(size_);
    std::vector<char> mine(wire), all(wire * size_t(size_));
    desc.serialize(mine.data(), size_);
    Status st = gather_all(mine.data(), wire, all.data(), deadline, what);
    if (!st.is_ok()) return st;
    std::vector<OpDesc> descs;
    for (int r = 0; r < size_; ++r) descs.push_back(OpDesc::deserialize(all.data() + wire * size_t(r), size_));
    return check_descs(descs, world_, what);
  }

  MPI_Comm comm_, bell_comm_;
  std::vector<int> world_;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  std::mutex bell_mutex_;  // guards self_bell_
  std::condition_variable bell_cv_;
  bool self_bell_ = false;
};

}  // namespace

Status make_mpi_comm(const std::vector<int>& world_ranks, int my_rank, std::shared_ptr<Comm>* out) {
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, int(world_ranks.size()), world_ranks.data(), &group);
  MPI_Comm comm;
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, 0, &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL)
    return Status::error(HPCDL_ERR_INTERNAL, "MPI_Comm_create_group failed for a process set");
  *out = std::make_shared<MpiComm>(comm, world_ranks);
  return Status::ok();
}

}  // namespace hpcdl
