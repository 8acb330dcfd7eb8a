// Device operations (HPCDL_PLACEMENT_DEVICE): the engine negotiates them like host ones, then hands each
// decided batch, in the order every rank agrees on, to the caller's executor (hpcdl_device_next), which
// moves the data (NCCL on GPUs) and reports the batch's end (hpcdl_device_done). Because every rank's
// executor starts its collectives in that order, a rank that submits in another order, skips a tensor or
// calls another collective gets the engine's mismatch error or stall report instead of a hung NCCL call.
//
// While batches are outstanding the engine keeps a heartbeat (kHeartbeat) so that a dead peer fails the
// survivors' operations even when the collective they wait for never finishes on the GPU, and a deadline
// (timeout_s) on every batch; the executor learns of either from hpcdl_device_next and aborts.
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/detail.h"
#include "engine/engine.h"
#include "transport/wait.h"

namespace hpcdl {

using namespace engine_detail;

namespace {

int64_t bits_of(double value) {
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

Clock::time_point monotonic(int64_t ns) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

}  // namespace

void Engine::hand_to_device(const std::vector<NameRecord*>& batch, bool fused, const std::string& what) {
  auto b = std::make_shared<DeviceBatch>();
  const NameRecord& first = *batch.front();
  const OpRequest& head = *first.any();
  const int n = static_cast<int>(first.members.size());
  const int me = index_of(first.members, rank_);
  b->what = what;
  b->members = first.members;
  b->op_type = head.op_type;
  b->fused = fused;
  // What the executor cannot know from its own tensors: the other members' rows.
  std::vector<int64_t> table;
  if (head.op_type == HPCDL_OP_ALLGATHER) {
    for (const auto& q : first.by_member) table.push_back(q->rows());
  } else if (head.op_type == HPCDL_OP_ALLTOALL) {
    for (const auto& q : first.by_member) table.push_back(q->splits.empty() ? q->rows() / n : q->splits[me]);
  }
  const int64_t flags = (fused ? HPCDL_DEVICE_FUSED : 0) | (timeline_.active() ? HPCDL_DEVICE_TIMED : 0);
  b->words = {0,
              head.process_set,
              head.op_type,
              head.dtype,
              head.reduce_op,
              head.op_type == HPCDL_OP_BROADCAST ? index_of(first.members, head.root) : 0,
              static_cast<int64_t>(batch.size()),
              n,
              me,
              flags,
              bits_of(head.prescale),
              bits_of(head.postscale),
              static_cast<int64_t>(table.size())};
  for (NameRecord* r : batch) {
    NameRecord& e = *r;
    // A member that joined is stood in for with zeros (allreduce only; see join_conflict): no operation.
    const OpRequest& q = e.local ? e.local->request : *e.any();
    b->words.push_back(e.local ? e.local->tag : 0);
    b->words.push_back(q.num_elements());
    b->tracks.push_back(track_of(q));
    b->decided.push_back(e.decided);
    b->bytes += entry_bytes(e);
    if (e.local) b->ops.push_back(std::move(e.local));
  }
  b->words.insert(b->words.end(), table.begin(), table.end());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    b->id = next_device_batch_++;
    b->words[0] = b->id;
    for (const auto& op : b->ops) op->device_stage = 1;
    device_queue_.push_back(std::move(b));
  }
  device_cv_.notify_all();
}

Status Engine::device_next(double timeout_s, int64_t* words, int capacity, int* length) {
  *length = 0;
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mutex_);
  device_cv_.wait_until(lock, until, [&] {
    return !device_queue_.empty() || !failed_.is_ok() || !running_ || device_interrupted_;
  });
  if (!failed_.is_ok()) return failed_;
  if (device_queue_.empty()) {
    device_interrupted_ = false;
    if (!running_) return Status::error(HPCDL_ERR_SHUTDOWN, "hpcdl was shut down");
    return Status::ok();
  }
  DeviceBatch& b = *device_queue_.front();
  if (b.words.size() > static_cast<size_t>(capacity)) {
    words[0] = static_cast<int64_t>(b.words.size());
    return Status::error(HPCDL_ERR_INVALID, "hpcdl_device_next: the next batch needs " +
                                                std::to_string(b.words.size()) + " words, the buffer holds " +
                                                std::to_string(capacity));
  }
  std::copy(b.words.begin(), b.words.end(), words);
  *length = static_cast<int>(b.words.size());
  b.taken = Clock::now();
  const int64_t taken = steady_ns(b.taken);
  for (const auto& op : b.ops) {
    op->device_stage = 2;
    op->started_ns.store(taken, std::memory_order_relaxed);
  }
  device_running_.emplace(b.id, std::move(device_queue_.front()));
  device_queue_.pop_front();
  return Status::ok();
}

Status Engine::device_done(int64_t id, int status, const std::string& message, const int64_t* times_ns) {
  std::shared_ptr<DeviceBatch> b;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = device_running_.find(id);
    if (it == device_running_.end()) {
      if (!failed_.is_ok()) return Status::ok();  // it failed with the engine already
      return Status::error(HPCDL_ERR_INVALID, "hpcdl_device_done: unknown device batch " + std::to_string(id) +
                                                  " (never handed out by hpcdl_device_next, or already reported)");
    }
    b = std::move(it->second);
    device_running_.erase(it);
  }
  if (status == HPCDL_OK) {
    if (times_ns != nullptr && timeline_.active()) record_device_timeline(*b, times_ns);
    finish(b->ops, HPCDL_OK, "");
    return Status::ok();
  }
  int code = status == HPCDL_PENDING ? HPCDL_ERR_INTERNAL : status;
  const std::string text = device_failure(*b, message, &code);
  finish(b->ops, code, text);
  // A failed collective leaves its communicator unusable, as a failure of the engine's own data plane does:
  // the engine fails everything else too (on its thread, woken here) and the executor aborts.
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_.is_ok()) failed_ = Status::error(code, text);
  wake_engine();
  device_cv_.notify_all();
  return Status::ok();
}

void Engine::device_interrupt() {
  std::lock_guard<std::mutex> lock(mutex_);
  device_interrupted_ = true;
  device_cv_.notify_all();
}

// The usual cause of a failed device collective is a member that died. A member on this host is named
// (the others' deaths show in the next heartbeat's negotiation); its sockets close just before its
// process becomes a zombie, so it is looked for a short while.
std::string Engine::device_failure(const DeviceBatch& b, const std::string& message, int* code) const {
  const std::vector<PeerInfo>& peers = runtime_.peers();
  const bool known = rank_ < static_cast<int>(peers.size());
  std::vector<int> dead;
  const auto until = Clock::now() + kDeathGrace;
  while (known) {
    for (int r : b.members)
      if (r != rank_ && r < static_cast<int>(peers.size()) && peers[r].host == peers[rank_].host &&
          !process_alive(peers[r].pid))
        dead.push_back(r);
    if (!dead.empty() || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (dead.empty()) return b.what + " failed on the device: " + message;
  *code = HPCDL_ERR_PEER_LOST;
  return b.what + " failed on the device: " + ranks_text(dead) + " died (" +
         (dead.size() == 1 ? "its process is" : "their processes are") + " gone) while the collective ran (" +
         message + ")";
}

// Under mutex_: when the first of the outstanding batches becomes overdue (see overdue_device_batch).
Deadline Engine::device_batches_due() const {
  const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  Deadline due = Deadline::max();
  if (!device_queue_.empty()) due = device_queue_.front()->decided.back() + limit;
  for (const auto& kv : device_running_) due = std::min(due, kv.second->taken + limit);
  return due;
}

// Under mutex_: the timeout of the oldest batch that waits for the executor or runs on the device too long.
Status Engine::overdue_device_batch(Clock::time_point now) const {
  const auto limit = std::chrono::duration<double>(timeout_s_);
  if (!device_queue_.empty() && now - device_queue_.front()->decided.back() > limit) {
    const DeviceBatch& b = *device_queue_.front();
    return Status::error(HPCDL_ERR_TIMEOUT,
                         "timed out after " + seconds_text(timeout_s_) + " s: every member submitted " + b.what +
                             ", but this process's device executor has not taken it (HPCDL_TIMEOUT); hpcdl.torch "
                             "runs the executor from init() to shutdown(): is a device collective before it stuck?");
  }
  for (const auto& kv : device_running_) {
    const DeviceBatch& b = *kv.second;
    if (now - b.taken <= limit) continue;
    return Status::error(HPCDL_ERR_TIMEOUT,
                         "timed out after " + seconds_text(timeout_s_) + " s: the collective of " + b.what + " on " +
                             ranks_text(b.members) + " did not complete on the device (HPCDL_TIMEOUT); a member may "
                             "be hung or its GPU stuck. It was aborted on this rank");
  }
  return Status::ok();
}

void Engine::record_device_timeline(const DeviceBatch& b, const int64_t* times_ns) {
  const Clock::time_point start = monotonic(times_ns[0]), begin = monotonic(times_ns[1]),
                          end = monotonic(times_ns[2]), stop = monotonic(times_ns[3]);
  std::string args = "\"device\":true,\"bytes\":" + std::to_string(b.bytes);
  if (b.fused) args += ",\"fused_tensors\":" + std::to_string(b.tracks.size());
  for (size_t i = 0; i < b.tracks.size(); ++i) {
    const std::string& track = b.tracks[i];
    timeline_.span(track, "QUEUE", b.decided[i], start);
    if (b.fused && begin > start) timeline_.span(track, "MEMCPY_IN_FUSION_BUFFER", start, begin, args);
    timeline_.span(track, op_type_upper(b.op_type), begin, end, args);
    if (b.fused && stop > end) timeline_.span(track, "MEMCPY_OUT_FUSION_BUFFER", end, stop, args);
  }
}

}  // namespace hpcdl
