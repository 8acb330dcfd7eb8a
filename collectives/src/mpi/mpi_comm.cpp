// Communicator over MPI (transport=mpi): MPI's own collectives for the types and ops MPI has, an
// allgather plus our kernels for the rest (float16, bfloat16, bool, average, scaling). Every wait polls
// a non-blocking request against the deadline, so a dead peer cannot hang the caller forever. MPI is
// reached through the shim of the job's MPI family (mpi_shim.h), so this file is compiled once for all.
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

class MpiComm : public Comm {
 public:
  MpiComm(const hpcdl_mpi_shim* mpi, void* comm, const std::vector<int>& world)
      : mpi_(mpi), comm_(comm), world_(world) {
    mpi_->comm_rank_size(comm_, &rank_, &size_);
    mpi_->comm_dup(comm_, &bell_comm_);
  }
  ~MpiComm() override {
    if (!mpi_->finalized()) {
      // Receive doorbells nobody waited for, so MPI has no unmatched messages left at finalize.
      mpi_->take_rings(bell_comm_, nullptr, nullptr);
      mpi_->comm_free(&comm_);
      mpi_->comm_free(&bell_comm_);
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
    if (mpi_->native(dtype, partial) && count <= INT32_MAX && (is_float_dtype(dtype) || prescale == 1.0)) {
      std::vector<char> scaled;
      const void* in = send;
      if (prescale != 1.0) {
        scaled.resize(bytes);
        const void* srcs[1] = {send};
        reduce(scaled.data(), srcs, 1, count, dtype, HPCDL_SUM, prescale, 1.0, 1);
        in = scaled.data();
      }
      void* req = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        mpi_->iallreduce(in, recv, int(count), dtype, partial, comm_, &req);
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
    std::vector<char> copy(static_cast<size_t>(rc[size_t(rank_)]));
    if (!copy.empty()) std::memcpy(copy.data(), send, copy.size());
    void* req = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mpi_->iallgatherv(copy.data(), rc[size_t(rank_)], recv, rc.data(), displs.data(), comm_, &req);
    }
    return wait(&req, deadline, what);
  }

  Status broadcast(void* buf, int64_t count, int dtype, int root, Deadline deadline,
                   const std::string& what) override {
    Status st = agree(make_desc(HPCDL_OP_BROADCAST, dtype, root, count), deadline, what);
    if (!st.is_ok()) return st;
    void* req = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mpi_->ibcast(buf, int(size_t(count) * dtype_bytes(dtype)), root, comm_, &req);
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
    void* req = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mpi_->ialltoallv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), comm_, &req);
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
      mpi_->ring(r, int(cycle & kBellTagMask), bell_comm_);
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
        wait_cycle_ = cycle;
        mpi_->take_rings(bell_comm_, &MpiComm::taken_ring, this);
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
  uint32_t bell_ = 0;        // the latest cycle a peer rang for (only wait_notify's thread touches it)
  uint32_t wait_cycle_ = 0;  // the cycle wait_notify waits for, near which every ring's cycle lies
  static constexpr std::chrono::microseconds kBellPollMax{1000};

  // The shim hands over each ring's tag: its low bits tell the whole cycle number (rings are for cycles
  // near the one waited for).
  static void taken_ring(void* context, int tag) {
    auto* self = static_cast<MpiComm*>(context);
    const uint32_t cycle = self->wait_cycle_;
    const uint32_t delta = (uint32_t(tag) - cycle) & kBellTagMask;
    const uint32_t full = cycle + (delta > kBellTagMask / 2 ? delta - (kBellTagMask + 1) : delta);
    if (int32_t(full - self->bell_) > 0) self->bell_ = full;
  }

  Status wait(void** req, Deadline deadline, const std::string& what) {
    const auto start = Clock::now();
    while (true) {
      int done = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        mpi_->test(req, &done);
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
    void* req = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mpi_->iallgather(send, int(bytes), all, comm_, &req);
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

  const hpcdl_mpi_shim* mpi_;
  void* comm_;
  void* bell_comm_ = nullptr;
  std::vector<int> world_;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  std::mutex bell_mutex_;  // guards self_bell_
  std::condition_variable bell_cv_;
  bool self_bell_ = false;
};

}  // namespace

Status make_mpi_comm(const std::vector<int>& world_ranks, int my_rank, std::shared_ptr<Comm>* out) {
  const hpcdl_mpi_shim* mpi = mpi_shim();
  if (!mpi) return mpi_load("");
  void* comm = nullptr;
  int rc = mpi->comm_create(world_ranks.data(), int(world_ranks.size()), &comm);
  if (rc != 0 || comm == nullptr)
    return Status::error(HPCDL_ERR_INTERNAL, "MPI_Comm_create_group failed for a process set");
  *out = std::make_shared<MpiComm>(mpi, comm, world_ranks);
  return Status::ok();
}

}  // namespace hpcdl
