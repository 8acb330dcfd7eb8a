// The callers' side of the engine: enqueue (validation, naming) and the handle queries of c_api.h.
#include <algorithm>
#include <sstream>
#include <string>
#include <thread>

#include "engine/detail.h"
#include "engine/engine.h"
#include "overlap.h"

namespace hpcdl {

using namespace engine_detail;

Status Engine::enqueue(const hpcdl_request& r, int64_t* handle, bool caller_waits) {
  auto invalid = [](const std::string& m) { return Status::error(HPCDL_ERR_INVALID, m); };
  if (r.op_type < HPCDL_OP_ALLREDUCE || r.op_type > HPCDL_OP_JOIN)
    return invalid("unknown operation type " + std::to_string(r.op_type) + " (expected 0..6, see hpcdl_op_type)");
  auto op = std::make_shared<EngineOp>();
  OpRequest& q = op->request;
  q.op_type = r.op_type;
  q.process_set = r.process_set;
  q.dtype = r.op_type == HPCDL_OP_BARRIER || r.op_type == HPCDL_OP_JOIN ? HPCDL_UINT8 : r.dtype;
  q.reduce_op = r.reduce_op;
  q.root = r.root;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.group_id = r.group_id;
  q.group_size = r.group_size;
  if (r.placement != HPCDL_PLACEMENT_HOST && r.placement != HPCDL_PLACEMENT_DEVICE)
    return invalid("unknown placement " + std::to_string(r.placement) + " (expected 0..1, see hpcdl_placement)");
  // Barriers and joins carry no data: they always run on the engine.
  const bool data_op = r.op_type != HPCDL_OP_BARRIER && r.op_type != HPCDL_OP_JOIN;
  q.placement = data_op ? r.placement : HPCDL_PLACEMENT_HOST;
  if (q.placement == HPCDL_PLACEMENT_DEVICE && r.tag <= 0)
    return invalid("a device operation needs a tag > 0 (its executor's id for it, see hpcdl_request)");
  op->tag = r.tag;
  if (r.op_type != HPCDL_OP_BARRIER && r.op_type != HPCDL_OP_JOIN) {
    if (dtype_size(r.dtype) == 0)
      return invalid("unknown dtype " + std::to_string(r.dtype) + " (expected 0..9, see hpcdl_dtype)");
    if (r.ndim < 0 || (r.ndim > 0 && r.shape == nullptr)) return invalid("the request's shape is missing");
    q.shape.assign(r.shape, r.shape + r.ndim);
    for (int64_t d : q.shape)
      if (d < 0) return invalid("negative dimension in shape " + shape_text(q.shape));
  }
  if ((r.op_type == HPCDL_OP_ALLREDUCE || r.op_type == HPCDL_OP_REDUCESCATTER) &&
      (r.reduce_op < HPCDL_SUM || r.reduce_op > HPCDL_PRODUCT))
    return invalid("unknown reduction " + std::to_string(r.reduce_op) + " (expected 0..4, see hpcdl_reduce_op)");
  if (r.group_id != 0 && r.group_size < 1) return invalid("a grouped operation needs group_size >= 1");
  // The global set (every rank, fixed at init) needs no copy of its description: most operations use it.
  int n = size_, me = rank_;  // the set's size and this rank's place in it
  if (r.process_set != 0) {
    ProcessSet set;
    if (!runtime_.process_set(r.process_set, &set))
      return invalid("process set " + std::to_string(r.process_set) + " does not exist; create it with "
                     "add_process_set() on every rank or pass it to init()");
    if (set.my_rank < 0)
      return invalid("rank " + std::to_string(rank_) + " is not a member of process set " +
                     std::to_string(r.process_set) + " (members: " + ranks_text(set.ranks) + ")");
    n = static_cast<int>(set.ranks.size());
    me = set.my_rank;
    q.members.assign(set.ranks.begin(), set.ranks.end());
  }
  const int64_t elements = q.num_elements();
  const bool has_data = r.op_type != HPCDL_OP_BARRIER && r.op_type != HPCDL_OP_JOIN && elements > 0;
  if (has_data && r.input == nullptr) return invalid("the request has no input buffer");
  const bool caller_owns_output =
      r.op_type == HPCDL_OP_ALLREDUCE || r.op_type == HPCDL_OP_BROADCAST || r.op_type == HPCDL_OP_REDUCESCATTER;
  if (has_data && caller_owns_output && r.output == nullptr)
    return invalid(std::string(op_type_name(r.op_type)) + " needs a caller-owned output buffer (it may equal the input)");
  if (has_data && r.output != nullptr && q.placement == HPCDL_PLACEMENT_HOST) {
    // The output lies apart from the input: the caller's own output may also hold it exactly in place, an
    // output offered for an allgather's or alltoall's result (c_api.h) may not.
    const size_t bytes = size_t(elements) * dtype_size(r.dtype);
    size_t out_bytes = bytes;
    if (r.op_type == HPCDL_OP_REDUCESCATTER) out_bytes = bytes / size_t(q.rows()) * size_t(q.rows_of_member(me, n));
    if (r.op_type == HPCDL_OP_ALLGATHER) out_bytes = bytes * size_t(n);
    Status apart = check_overlap(op_type_name(r.op_type), r.input, bytes, r.output, out_bytes,
                                 caller_owns_output ? r.output : nullptr);
    if (!apart.is_ok()) return apart;
  }
  if ((r.op_type == HPCDL_OP_ALLGATHER || r.op_type == HPCDL_OP_ALLTOALL || r.op_type == HPCDL_OP_REDUCESCATTER) &&
      q.shape.empty())
    return invalid(std::string(op_type_name(r.op_type)) + " needs a tensor with at least one dimension");
  if (r.op_type == HPCDL_OP_BROADCAST && index_of(members_of(q), r.root) < 0)
    return invalid("broadcast root " + std::to_string(r.root) + " is not a member of process set " +
                   std::to_string(r.process_set) + " (members: " + ranks_text(members_of(q)) + ")");
  if (r.op_type == HPCDL_OP_ALLTOALL) {
    if (r.splits != nullptr && r.nsplits > 0) {
      if (r.nsplits != n)
        return invalid("alltoall splits has " + std::to_string(r.nsplits) + " entries; the process set has " +
                       std::to_string(n) + " members");
      q.splits.assign(r.splits, r.splits + r.nsplits);
      int64_t sum = 0;
      for (int64_t s : q.splits) {
        if (s < 0) return invalid("alltoall splits must not be negative: " + shape_text(q.splits));
        sum += s;
      }
      if (sum != q.rows())
        return invalid("alltoall splits " + shape_text(q.splits) + " sum to " + std::to_string(sum) +
                       " rows but the tensor has " + std::to_string(q.rows()));
    } else if (q.rows() % n != 0) {
      return invalid("alltoall without splits needs the first dimension (" + std::to_string(q.rows()) +
                     ") to divide evenly among the " + std::to_string(n) + " ranks; pass splits");
    }
  }
  op->input = r.input;
  op->output = r.output;
  op->submitted = Clock::now();
  caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!failed_.is_ok()) {
    const Status failure = failed_;
    const bool dump = dump_on_refusal_;
    dump_on_refusal_ = false;
    lock.unlock();
    if (dump) flight_dump("error", failure.message);
    return Status::error(failure.code, failure.message + "; the engine accepts no more operations");
  }
  if (shutdown_requested_) return Status::error(HPCDL_ERR_SHUTDOWN, "hpcdl is shutting down");
  if (r.name != nullptr && r.name[0] != '\0') {
    q.name = r.name;
  } else if (r.op_type == HPCDL_OP_JOIN) {
    q.name = "join";
  } else {
    q.name = unnamed_name(r.op_type, unnamed_counter_[{r.process_set, r.op_type}]++);
  }
  NameRecord* record = record_of(Key{q.process_set, q.name});
  if (const EngineOp* holder = record->op.get()) {
    const bool finished = holder->status.load(std::memory_order_acquire) != HPCDL_PENDING;
    if (!finished || holder->request.op_type == q.op_type) {
      const std::string where = q.process_set ? " in process set " + std::to_string(q.process_set) : std::string();
      if (!finished)
        return invalid("an operation named '" + q.name + "' is already pending" + where +
                       " on this rank; wait for it before submitting the name again, or use another name");
      return invalid("an " + std::string(op_type_name(q.op_type)) + " named '" + q.name + "'" + where +
                     " finished on this rank, but its result was never collected: synchronize (or poll) its handle "
                     "before submitting the name again, or use another name");
    }
  }
  // A handle: a slot of handles_ and the slot's generation.
  uint32_t slot;
  if (!free_handles_.empty()) {
    slot = free_handles_.back();
    free_handles_.pop_back();
  } else {
    slot = static_cast<uint32_t>(handles_.size());
    handles_.emplace_back();
  }
  HandleSlot& h = handles_[slot];
  op->id = (static_cast<int64_t>(slot) + 1) << 32 | h.generation;
  *handle = op->id;
  op->record = record;
  if (record->op) record->op->record = nullptr;  // finished: it no longer holds the name
  record->op = op;
  op->seq = flight_.add(op);
  h.op = op;
  ++unfinished_;
  const int64_t bytes = elements * dtype_size(q.dtype);
  queue_bytes_ += bytes;
  // Within kSettle of the previous submission and no wait between them: the caller streams a burst (see
  // settle), also when the engine thread, faster than the caller, has taken each submission in a cycle of
  // its own. (A loop that waits for each operation before the next is no burst: it would pay a wake-up.)
  streaming_ = !waited_ && op->submitted - last_enqueue_ < kSettle;
  waited_ = false;
  last_enqueue_ = op->submitted;
  const bool alone = queue_.empty();
  // The next member of a group whose earlier members were all this queue held, and were left for their
  // caller (while deferred_ holds, the queue holds only what started it and members of its group): the
  // group counts as one submission (nothing in it can run before its last member is in).
  const bool joins_deferred_group = !alone && deferred_ && q.group_id != 0 &&
                                    queue_.front()->request.group_id == q.group_id &&
                                    queue_.front()->request.process_set == q.process_set;
  queue_.push_back(std::move(op));
  // A lone host submission (or group) whose caller waits for it at once (hpcdl_run), or a small one, whose
  // caller most likely waits for it next: that wait runs its cycle itself (see try_direct), so the engine
  // thread is not woken for it (an engine thread in the middle of a cycle packs it with the rest, and one
  // about to sleep leaves it). Anything else wakes it.
  if ((alone || joins_deferred_group) && q.placement == HPCDL_PLACEMENT_HOST &&
      (caller_waits || queue_bytes_ <= kDeferMaxBytes))
    deferred_ = true;
  else
    wake_engine();
  if (batch_wake_bytes_ > 0 && queue_bytes_ >= batch_wake_bytes_) queue_cv_.notify_one();
  return Status::ok();
}

// Under mutex_.
std::shared_ptr<EngineOp> Engine::find(int64_t handle) const {
  const int64_t slot = (handle >> 32) - 1;
  if (handle <= 0 || slot < 0 || slot >= static_cast<int64_t>(handles_.size())) return nullptr;
  const HandleSlot& h = handles_[static_cast<size_t>(slot)];
  if (h.generation != static_cast<uint32_t>(handle & 0xffffffff)) return nullptr;
  return h.op;
}

namespace {
Status unknown_handle(int64_t handle) {
  return Status::error(HPCDL_ERR_INVALID, "unknown handle " + std::to_string(handle) +
                                              " (never returned by enqueue, or already released)");
}
Status op_status(const EngineOp& op) {
  int code = op.status.load(std::memory_order_acquire);
  if (code == HPCDL_OK) return Status::ok();
  if (code == HPCDL_PENDING) return Status::error(HPCDL_PENDING, "");
  return Status::error(code, op.error);
}
}  // namespace

Status Engine::poll(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<EngineOp> op = find(handle);
  if (!op) return unknown_handle(handle);
  waited_ = true;
  Status s = op_status(*op);
  if (s.code != HPCDL_PENDING) collected(*op);
  else if (!op->packed && deferred_) wake_engine();  // a caller that polls does not run the cycle itself
  return s;
}

// Under mutex_: the caller saw `op` finish; its name is free again.
void Engine::collected(EngineOp& op) {
  if (op.collected) return;
  op.collected = true;
  NameRecord* r = op.record;
  if (r != nullptr && r->op.get() == &op) {
    op.record = nullptr;  // the record may go now: nothing refers to it through this operation any more
    r->op.reset();
    free_if_idle(*r);
  }
}

// The direct path: a caller that waits for an operation nobody has packed yet runs the cycle on its own
// thread when no cycle runs: no hand-off to the engine thread and back. The response cache only makes the
// cycle's message shorter: a name seen for the first time (an unnamed operation's, new every call) runs
// here too. Every rank runs the same cycles as ever, so ordering, validation, the stall inspector and
// shutdown work as on the engine thread. True when it ran a cycle.
bool Engine::try_direct(const std::shared_ptr<EngineOp>& op) {
  std::unique_lock<std::mutex> token(cycle_mutex_, std::try_to_lock);
  if (!token.owns_lock()) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (op->packed || !failed_.is_ok()) return false;
  }
  burst_start_ = Clock::now();
  const bool ok = cycle();
  if (ok) score_burst();
  std::lock_guard<std::mutex> lock(mutex_);
  widest_pack_ = 0;
  // The engine thread carries on with whatever is left: operations submitted meanwhile, this one if its
  // peers have not submitted it yet (they ring when they do; it keeps the heartbeat), a failure.
  if (!ok || !queue_.empty() || op->status.load(std::memory_order_relaxed) == HPCDL_PENDING ||
      !aborts_to_send_.empty() || knobs_to_send_)
    wake_engine();
  return true;
}

Status Engine::wait(int64_t handle, double timeout_s) {
  std::shared_ptr<EngineOp> op;
  bool unpacked;
  {
    // One look under the lock for an operation that already finished (most of a step's waits).
    std::lock_guard<std::mutex> lock(mutex_);
    op = find(handle);
    if (!op) return unknown_handle(handle);
    waited_ = true;
    if (op->status.load(std::memory_order_acquire) != HPCDL_PENDING) {
      collected(*op);
      return op_status(*op);
    }
    unpacked = !op->packed;
  }
  if (unpacked && try_direct(op) && op->status.load(std::memory_order_acquire) != HPCDL_PENDING) {
    std::lock_guard<std::mutex> lock(mutex_);
    collected(*op);
    return op_status(*op);
  }
  return wait_for(op, timeout_s);
}

Status Engine::wait_for(const std::shared_ptr<EngineOp>& op, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!op->packed) wake_engine();
    // A caller that waits has finished submitting: the engine need not collect any longer (see settle()
    // and wait_for_batch()).
    ++callers_waiting_;
    if (collecting_) queue_cv_.notify_one();
  }
  // The result is usually microseconds away: look a few times before sleeping.
  const auto spin_until = Clock::now() + std::chrono::microseconds(20);
  while (op->status.load(std::memory_order_acquire) == HPCDL_PENDING && Clock::now() < spin_until)
    std::this_thread::yield();
  if (op->status.load(std::memory_order_acquire) == HPCDL_PENDING) {
    double limit = timeout_s < 0 ? timeout_s_ : timeout_s;
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
    std::unique_lock<std::mutex> lock(mutex_);
    ++op->waiters;
    bool done = op->done.wait_until(lock, until, [&] { return op->status.load() != HPCDL_PENDING; });
    --op->waiters;
    --callers_waiting_;
    if (done) collected(*op);
    if (!done) {
      std::ostringstream m;
      m << "timed out after " << limit << " s waiting for " << describe(op->request);
      if (op->device_stage == 1) {
        m << ": every member submitted it, but this process's device executor has not taken it yet (a device "
             "collective before it may be stuck)";
      } else if (op->device_stage == 2) {
        m << ": every member submitted it and its collective runs on the device, but has not completed (a "
             "member may be hung, dead or busy with other work on its GPU)";
      } else if (!op->waiting_for.empty()) {
        const std::vector<int>& missing = op->waiting_for;
        m << ": " << ranks_text(missing) << (missing.size() == 1 ? " has" : " have") << " not submitted it"
          << " (a rank may be stuck, slower, or have taken a different code path)";
      } else {
        m << ": the other ranks have not all submitted it"
          << " (a rank may be stuck, slower, or have taken a different code path)";
      }
      lock.unlock();
      m << timeout_diagnosis(op);
      return Status::error(HPCDL_ERR_TIMEOUT, m.str());
    }
    return op_status(*op);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  --callers_waiting_;
  collected(*op);
  return op_status(*op);
}

Status Engine::output(int64_t handle, void** data, int64_t* nbytes, int64_t* shape) {
  std::shared_ptr<EngineOp> op;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op = find(handle);
  }
  if (!op) return unknown_handle(handle);
  Status s = op_status(*op);
  if (s.code == HPCDL_PENDING) return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " has not finished yet");
  if (!s.is_ok()) return s;
  if (op->request.op_type != HPCDL_OP_ALLGATHER && op->request.op_type != HPCDL_OP_ALLTOALL)
    return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " writes into the caller's output buffer; "
                                            "only allgather and alltoall have an engine-allocated output");
  int64_t bytes = dtype_size(op->request.dtype);
  for (int64_t d : op->output_shape) bytes *= d;
  if (data) *data = op->in_offered_output ? op->output : op->owned_output.data();
  if (nbytes) *nbytes = bytes;
  if (shape) std::copy(op->output_shape.begin(), op->output_shape.end(), shape);
  return Status::ok();
}

Status Engine::received_splits(int64_t handle, int64_t* splits, int capacity, int* count) {
  std::shared_ptr<EngineOp> op;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op = find(handle);
  }
  if (!op) return unknown_handle(handle);
  Status s = op_status(*op);
  if (s.code == HPCDL_PENDING) return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " has not finished yet");
  if (!s.is_ok()) return s;
  if (op->request.op_type != HPCDL_OP_ALLTOALL)
    return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " is not an alltoall");
  int n = static_cast<int>(op->received_splits.size());
  for (int i = 0; i < n && i < capacity; ++i) splits[i] = op->received_splits[i];
  *count = n;
  return Status::ok();
}

Status Engine::join_result(int64_t handle, int* rank) {
  std::shared_ptr<EngineOp> op;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op = find(handle);
  }
  if (!op) return unknown_handle(handle);
  Status s = op_status(*op);
  if (s.code == HPCDL_PENDING) return Status::error(HPCDL_ERR_INVALID, "join has not finished yet");
  if (!s.is_ok()) return s;
  if (op->request.op_type != HPCDL_OP_JOIN) return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " is not a join");
  *rank = op->join_result;
  return Status::ok();
}

Status Engine::release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<EngineOp> op = find(handle);
  if (!op) return Status::ok();  // idempotent
  // A pending operation stays alive inside the engine until it finishes; its name is freed then.
  op->released = true;
  if (op->status.load(std::memory_order_acquire) != HPCDL_PENDING) {
    flight_.retire(*op);
    NameRecord* r = op->record;
    if (r != nullptr && r->op == op) {
      op->record = nullptr;
      r->op.reset();
      free_if_idle(*r);
    }
    keep_result_buffer(op->owned_output);  // nobody can read it any more: its handle is gone
  } else if (!op->packed) {
    wake_engine();  // nobody will wait for it: the engine runs it
  }
  HandleSlot& h = handles_[static_cast<size_t>((handle >> 32) - 1)];
  h.op.reset();
  ++h.generation;
  free_handles_.push_back(static_cast<uint32_t>((handle >> 32) - 1));
  return Status::ok();
}

void Engine::keep_result_buffer(ResultBytes& bytes) {
  const size_t capacity = bytes.capacity();
  if (capacity < kSpareResultMinBytes || capacity > kSpareResultBytes) return;
  size_t kept = capacity;
  for (const ResultBytes& spare : spare_results_) kept += spare.capacity();
  while (!spare_results_.empty() && (spare_results_.size() == kSpareResults || kept > kSpareResultBytes)) {
    kept -= spare_results_.front().capacity();
    spare_results_.erase(spare_results_.begin());  // the oldest
  }
  spare_results_.push_back(std::move(bytes));
}

// The smallest kept buffer that holds `bytes`, if any, becomes `out`'s (its contents are overwritten).
void Engine::reuse_result_buffer(ResultBytes& out, size_t bytes) {
  auto best = spare_results_.end();
  for (auto it = spare_results_.begin(); it != spare_results_.end(); ++it)
    if (it->capacity() >= bytes && (best == spare_results_.end() || it->capacity() < best->capacity())) best = it;
  if (best == spare_results_.end()) return;
  out.swap(*best);
  spare_results_.erase(best);
}

int Engine::new_group_id(int process_set) {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++last_group_id_[process_set];
}

Status Engine::start_timeline(const std::string& path, bool mark_cycles) {
  if (path.empty()) return Status::error(HPCDL_ERR_INVALID, "start_timeline needs a file path");
  if (rank_ != 0) return Status::ok();  // rank 0 writes the job's timeline
  return timeline_.start(path, mark_cycles);
}

Status Engine::stop_timeline() {
  timeline_.stop();
  return Status::ok();
}

bool Engine::knob(const std::string& name, double* value) const {
  std::lock_guard<std::mutex> lock(knob_mutex_);
  if (name == "fusion_threshold") *value = knobs_.fusion_threshold;
  else if (name == "cycle_time_ms") *value = knobs_.cycle_time_ms;
  else if (name == "small_message_bytes") *value = knobs_.small_message_bytes;
  else if (name == "cache_capacity") *value = cache_capacity_;
  else return false;
  return true;
}

}  // namespace hpcdl
