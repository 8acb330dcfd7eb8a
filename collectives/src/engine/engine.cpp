// The engine's lifecycle, its thread, and its cycles: who runs one when, and what a cycle exchanges (see
// engine.h). What a cycle decides is in decide.cpp, how it runs what it decided in execute.cpp, the callers'
// side in handles.cpp.
#include "engine/engine.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "engine/detail.h"

namespace hpcdl {

using namespace engine_detail;

namespace engine_detail {
thread_local bool t_engine_thread = false;
}  // namespace engine_detail

bool NameRecord::all_inline() const {
  for (size_t m = 0; m < by_member.size(); ++m)
    if (!by_member[m] || payload[m].empty()) return false;
  return true;
}

const OpRequest* NameRecord::any() const {
  for (const auto& r : by_member)
    if (r) return r.get();
  return nullptr;
}

std::vector<int> Engine::members_of(const OpRequest& request) const {
  if (request.process_set == 0) {
    std::vector<int> world(size_);
    for (int i = 0; i < size_; ++i) world[i] = i;
    return world;
  }
  return std::vector<int>(request.members.begin(), request.members.end());
}

Engine::Engine(Runtime& runtime) : runtime_(runtime) {}
Engine::~Engine() { stop(); }

Deadline Engine::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
}

Status Engine::start() {
  rank_ = runtime_.rank();
  size_ = runtime_.size();
  timeout_s_ = runtime_.timeout_s();
  control_ = runtime_.find_comm(0, Channel::kEngineControl);
  if (control_ == nullptr)
    return Status::error(HPCDL_ERR_INTERNAL, "the engine found no control communicator for the global set");
  const Options& o = runtime_.options();
  knobs_.fusion_threshold = static_cast<double>(o.get_int("fusion_threshold", 128LL * 1024 * 1024));
  knobs_.cycle_time_ms = o.get_double("cycle_time_ms", 1.0);
  knobs_.small_message_bytes = static_cast<double>(o.get_int("small_message_bytes", 65536));
  cache_capacity_ = static_cast<int>(o.get_int("cache_capacity", 1024));
  const std::set<std::string> user_set = split_commas(o.get("user_set_knobs"));
  cache_grows_ = user_set.count("cache_capacity") == 0;
  says_choices_ = rank_ == 0 && o.logs_info();
  stall_check_enabled_ = o.get_bool("stall_check", true);
  stall_check_s_ = o.get_double("stall_check_s", 60.0);
  stall_shutdown_s_ = o.get_double("stall_shutdown_s", 0.0);
  flight_.resize(static_cast<size_t>(std::max<long long>(0, o.get_int("flight_recorder_size", 2048))));
  debug_dir_ = o.get("debug_dir");
  stacks_.configure(static_cast<int>(o.get_int("stack_fd", -1)), static_cast<int>(o.get_int("stack_signal", 0)),
                    o.get("stack_thread"));
  if (rank_ == 0 && o.get_bool("autotune", false)) {
    autotuner_ = std::make_unique<Autotuner>(knobs_, user_set,
                                             static_cast<int>(o.get_int("autotune_warmup_samples", 3)),
                                             static_cast<int>(o.get_int("autotune_steps_per_sample", 10)));
    if (!o.get("autotune_log").empty()) {
      Status s = autotuner_->open_log(o.get("autotune_log"));
      if (!s.is_ok()) return s;
    }
  }
  if (rank_ == 0 && !o.get("timeline").empty()) {
    Status s = timeline_.start(o.get("timeline"), o.get_bool("timeline_mark_cycles", false));
    if (!s.is_ok()) return s;
  }
  message_size_.assign(size_, 0);
  slots_.assign(kSlotBytes * size_, 0);
  next_stall_check_ = Clock::now() + std::chrono::seconds(1);
  last_cycle_start_ = Clock::now();
  caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = true;
  }
  thread_ = std::thread(&Engine::loop, this);
  return Status::ok();
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_) return;
    running_ = false;
    shutdown_requested_ = true;
    wake_engine();
    queue_cv_.notify_all();
    device_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  timeline_.stop();
}

// Under mutex_: the engine thread looks at its work now (and runs any operation a caller left for itself).
void Engine::wake_engine() {
  deferred_ = false;
  if (waiting_) {
    control_->notify_self();
    waiting_ = false;
  }
}

// ---- the engine thread -------------------------------------------------------------------------------

// Where the engine thread runs. Two engine threads that share a core make every handshake between them
// wait for the scheduler, which turns a 40 us negotiation into 300 us; and a hand-off between a caller and
// its engine thread on different cores is a cross-core wake-up, which in a VM costs tens of microseconds
// more than a switch on one core. So while it negotiates, the engine thread keeps to the core its caller
// last submitted from (when the host has a core per local rank); for large transfers it may run anywhere,
// so that a busy core cannot hold back bandwidth-bound work. The callers' threads are never touched.
void Engine::place_thread() {
  cpu_set_t allowed;
  pinned_ = false;
  if (!runtime_.options().get_bool("engine_pin_thread", true)) return;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  const int local_size = runtime_.local_size();
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (local_size < 2 || static_cast<int>(cpus.size()) < local_size) return;
  all_cores_ = allowed;
  pinned_ = true;
  // Until a caller submits, the core of the thread that started the engine (or one per local rank).
  own_cpu_ = cpus[static_cast<size_t>(runtime_.local_rank()) % cpus.size()];
  CPU_ZERO(&own_core_);
  CPU_SET(own_cpu_, &own_core_);
  follow_caller();
  keep_to_own_core(true);
}

// At the start of a burst: move to the core the caller submitted from, if it moved.
void Engine::follow_caller() {
  if (!pinned_) return;
  const int cpu = caller_cpu_.load(std::memory_order_relaxed);
  if (cpu < 0 || cpu == own_cpu_ || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &all_cores_)) return;
  own_cpu_ = cpu;
  CPU_ZERO(&own_core_);
  CPU_SET(cpu, &own_core_);
  if (on_own_core_) {
    on_own_core_ = false;
    keep_to_own_core(true);
  }
}

// Only ever moves the engine thread: a caller that runs a cycle itself stays where it is.
void Engine::keep_to_own_core(bool own) {
  if (!pinned_ || own == on_own_core_ || !t_engine_thread) return;
  const cpu_set_t& set = own ? own_core_ : all_cores_;
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0) on_own_core_ = own;
}

void Engine::loop() {
  t_engine_thread = true;
  place_thread();
  // Its sleeps are tens of microseconds (settle); the default 50 us of timer slack would triple them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  std::unique_lock<std::mutex> token(cycle_mutex_);
  while (true) {
    const Want want = idle_wait(token);
    if (want == Want::kStop) break;
    if (want == Want::kNothing) continue;
    follow_caller();
    burst_start_ = Clock::now();
    burst_bytes_ = 0;
    settle(true);
    bool ok = true;
    while (true) {
      ok = cycle();
      if (!ok) break;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (cycle_wanted(false) != Want::kCycle) break;
      }
      wait_for_batch();
      settle(false);
    }
    end_burst();
    if (!ok) break;
  }
  fail_everything(Status::error(HPCDL_ERR_SHUTDOWN, "hpcdl was shut down"));
  timeline_.flush(true);
}

// Cycle runner, under mutex_: whether this rank has a reason to run a cycle now (kStop: the engine failed).
// `rung`: a peer rang for the next cycle.
Engine::Want Engine::cycle_wanted(bool rung) {
  if (!failed_.is_ok()) return Want::kStop;
  if (rung || (!queue_.empty() && !deferred_) || (shutdown_requested_ && !shutdown_sent_) ||
      !aborts_to_send_.empty() || knobs_to_send_ || !report_request_.empty() || report_due_)
    return Want::kCycle;
  const auto now = Clock::now();
  const bool device = !device_queue_.empty() || !device_running_.empty();
  if (device) {
    Status overdue = overdue_device_batch(now);
    if (!overdue.is_ok()) {
      failed_ = overdue;
      return Want::kStop;
    }
  }
  // A heartbeat while this rank waits (see kHeartbeat), which also runs what a caller left for itself and
  // did not come back for.
  if ((device || unfinished_ > 0) && now >= last_cycle_start_ + kHeartbeat) return Want::kCycle;
  return Want::kNothing;
}

// With the cycle token held: returns when there is a cycle to run (kCycle, token held), the engine must
// stop (kStop), or a caller ran the cycle this thread was woken for (kNothing). Sleeps without the token,
// so that a caller may run a cycle itself meanwhile, until this rank has work, a peer rang for the next
// cycle, a heartbeat is due (this rank waits for an operation: see kHeartbeat) or a timer (stall check,
// timeline flush) is.
Engine::Want Engine::idle_wait(std::unique_lock<std::mutex>& token) {
  bool rung = control_->wait_notify(next_cycle_, past()) == Comm::Bell::kRung;
  while (true) {
    const auto now = Clock::now();
    Deadline until = now + std::chrono::seconds(1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const Want want = cycle_wanted(rung);
      if (want != Want::kNothing) return want;
      if (!device_queue_.empty() || !device_running_.empty() || unfinished_ > 0)
        until = std::min(until, last_cycle_start_ + kHeartbeat);
      waiting_ = true;
    }
    if (rank_ == 0 && stall_check_enabled_ && negotiating_ != nullptr) until = std::min(until, next_stall_check_);
    if (stall_report_.active) until = std::min(until, stall_report_.asked_at + kReportWait);
    // Events still in memory reach the file soon, so a trace survives the job being killed.
    if (timeline_.has_pending()) until = std::min(until, now + std::chrono::milliseconds(600));
    const uint32_t cycle = next_cycle_;
    token.unlock();
    const Comm::Bell bell = control_->wait_notify(cycle, until);
    // Poked by a caller that submitted: let it run first. Woken on its core, this thread has usually just
    // preempted it, and an asynchronous submission must return to its caller (which submits more, polls,
    // or waits, and a wait hands the core back at once) before the engine runs it.
    if (bell == Comm::Bell::kPoked) sched_yield();
    if (bell == Comm::Bell::kRung) yield_to_caller();
    token.lock();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      waiting_ = false;
    }
    // A caller may have run that cycle meanwhile: a ring counts only for the cycle that comes next now.
    rung = bell == Comm::Bell::kRung &&
           (cycle == next_cycle_ || control_->wait_notify(next_cycle_, past()) == Comm::Bell::kRung);
    if (bell == Comm::Bell::kTimeout) {
      if (rank_ == 0) {
        stall_check(Clock::now());
        finish_stall_report(Clock::now());
      }
      timeline_.flush(false);
    }
  }
}

// A peer started a cycle while this rank's caller is between submitting an operation it left for itself
// (deferred) and waiting for it: the caller is microseconds away and runs the cycle itself (the direct path),
// so the engine thread, woken by the ring, lets it rather than take the cycle from it. Ranks that drift a few
// microseconds apart would otherwise keep handing their cycles to their engine threads.
void Engine::yield_to_caller() {
  const auto until = Clock::now() + kYieldToCaller;
  while (Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!deferred_ || callers_waiting_ > 0 || !failed_.is_ok()) return;
    }
    sched_yield();
  }
}

// The cycle time and fusion threshold (bytes), which autotune may change between cycles.
std::pair<Clock::duration, int64_t> Engine::batching_knobs() const {
  std::lock_guard<std::mutex> lock(knob_mutex_);
  const auto cycle = std::chrono::duration<double, std::milli>(knobs_.cycle_time_ms);
  return {std::chrono::duration_cast<Clock::duration>(cycle), static_cast<int64_t>(knobs_.fusion_threshold)};
}

// A caller submitting a burst (a training step's gradients, back to back) is microseconds from its next
// enqueue. Packing now would negotiate the burst in slices, a cycle each, with this thread taking turns
// on the core the caller submits from. So this sleeps until a caller starts waiting for a result (the burst
// is complete), the callers pause for kSettle, the fusion threshold fills or a cycle time passes. Only
// callers that submit in bursts pay for it. In the middle of a burst (`burst_start` false) it is skipped
// unless this or the previous burst packed more than one operation into a cycle, or the last submission
// came within kSettle of the one before, so a lone operation runs at once. At a burst's start only the
// last counts: an engine thread faster than its caller (a core of its own, one rank or a GPU path whose
// caller takes tens of microseconds a submission) otherwise ends a burst after every submission and starts
// the next at once, each one operation long; on an H200, ResNet-50's 161 gradients ran as 161 batches.
void Engine::settle(bool burst_start) {
  const auto [cycle, threshold] = batching_knobs();
  if (cycle <= Clock::duration::zero() || threshold <= 0) return;  // no batching wanted
  const auto give_up = Clock::now() + cycle;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!streaming_ && (burst_start || (!bursty_ && widest_pack_ <= 1))) return;
  collecting_ = true;
  batch_wake_bytes_ = threshold;
  // A pause counts from the last enqueue; while this thread keeps to the core its caller submits from,
  // only from when it went to sleep: the caller cannot enqueue while this thread is awake there (its
  // wake-up at a burst's first enqueue, each look it takes), and that time is not the caller's pause.
  const bool shares_core = pinned_ && on_own_core_;
  auto asleep_since = shares_core ? Clock::now() : Clock::time_point::min();
  for (bool first = true; !queue_.empty() && callers_waiting_ == 0 && !shutdown_requested_ &&
                          queue_bytes_ < threshold;
       first = false) {
    const auto now = Clock::now();
    const auto quiet_at = std::max(last_enqueue_, asleep_since) + kSettle;
    if (now >= quiet_at || now >= give_up) break;
    if (shares_core) asleep_since = now;
    queue_cv_.wait_until(lock, std::min(first ? quiet_at : std::max(quiet_at, now + kSettleRecheck), give_up));
  }
  collecting_ = false;
  batch_wake_bytes_ = 0;
}

// In the middle of a burst that is being fused, waits up to the cycle time for more tensors; or less, when
// a caller already waits for a result while operations are queued: then nothing is coming that the cycle
// could wait for (a loop of short steps would otherwise run one step per cycle time).
void Engine::wait_for_batch() {
  const auto knobs = batching_knobs();
  const Clock::duration cycle = knobs.first;
  const int64_t threshold = knobs.second;  // a plain variable: a lambda may not capture a structured binding
  if (!fused_last_cycle_ || cycle <= Clock::duration::zero() || threshold <= 0) return;
  const auto until = last_cycle_start_ + cycle;
  std::unique_lock<std::mutex> lock(mutex_);
  collecting_ = true;
  batch_wake_bytes_ = threshold;
  queue_cv_.wait_until(lock, until, [&] {
    return queue_bytes_ >= threshold || shutdown_requested_ || (!queue_.empty() && callers_waiting_ > 0);
  });
  collecting_ = false;
  batch_wake_bytes_ = 0;
}

// Cycle runner: autotune scores the burst that just ended (bytes moved over its duration).
void Engine::score_burst() {
  if (autotuner_ && burst_bytes_ > 0) {
    Knobs next;
    if (autotuner_->record_step(burst_bytes_, seconds_between(burst_start_, Clock::now()), &next)) {
      knobs_next_ = next;
      knobs_to_send_ = true;
    }
  }
  burst_bytes_ = 0;
}

// The engine thread has nothing more to say: the burst is over.
void Engine::end_burst() {
  score_burst();
  timeline_.flush(false);
  keep_to_own_core(true);
  bursty_ = widest_pack_ > 1;
  widest_pack_ = 0;
}

// ---- cycles (cycle runner) ---------------------------------------------------------------------------

// One cycle, then what follows from it; false when the engine failed or the job ended (every operation has
// failed then, and the engine thread stops).
bool Engine::cycle() {
  CycleResult result;
  Status s = run_cycle(&result);
  if (!s.is_ok()) {
    fail_everything(s);
    return false;
  }
  if (!result.shut_down.empty()) {
    fail_everything(shutdown_status(result.shut_down));
    return false;
  }
  if (!dump_reason_.empty()) {
    flight_dump(dump_reason_, dump_message_);
    dump_reason_.clear();
  }
  if (rank_ == 0) {
    stall_check(Clock::now());
    finish_stall_report(Clock::now());
  }
  return true;
}

Status Engine::run_cycle(CycleResult* result) {
  const uint32_t number = next_cycle_++;
  last_cycle_start_ = Clock::now();
  if (timeline_.active() && timeline_.mark_cycles()) timeline_.instant("CYCLE_START", last_cycle_start_);
  Deadline batches_due;
  const bool news = pack(&message_, &batches_due);
  control_->ring_if_late(number, news ? kRingAfter : kRingAfterEarly);
  // The cycle that announces this rank's shutdown is its last: it waits for its peers a short while, not
  // the whole timeout, so that an exiting process leaves at once even when a peer is hung. Nor does it wait
  // past a device batch's deadline: peers whose batch is overdue stop cycling (a heartbeat would wait for
  // them in vain, and time out naming the negotiation instead of the collective that never finished).
  const Deadline until = shutdown_sent_ ? std::min(deadline(), Clock::now() + kShutdownGrace) : deadline();
  Status s = exchange(message_, std::min(until, batches_due));
  if (!s.is_ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Status overdue = s.code == HPCDL_ERR_TIMEOUT ? overdue_device_batch(Clock::now()) : Status::ok();
    return overdue.is_ok() ? s : overdue;
  }
  std::vector<NameRecord*> work;
  std::set<int> join_changed;
  std::vector<Abort> aborts;
  size_t extra_at = 0;
  for (int r = 0; r < size_; ++r) {
    bool shutdown = false;
    std::string problem;
    // A message that did not fit its slot continues in extra_ (see exchange).
    const size_t size = message_size_[r];
    const uint8_t* data = slots_.data() + r * kSlotBytes + sizeof(uint32_t);
    std::vector<uint8_t> joined;
    if (size > kSlotBytes - sizeof(uint32_t)) {
      joined.assign(data, data + kSlotBytes - sizeof(uint32_t));
      const size_t tail = size - joined.size();
      joined.insert(joined.end(), extra_.begin() + extra_at, extra_.begin() + extra_at + tail);
      extra_at += tail;
      data = joined.data();
    }
    if (!decode(r, data, size, &shutdown, &aborts, &work, &join_changed, &problem))
      return Status::error(HPCDL_ERR_INTERNAL, "the engine received a malformed control message from rank " +
                                                   std::to_string(r) + (problem.empty() ? "" : " (" + problem + ")") +
                                                   "; every rank of a job must run the same build of hpcdl");
    if (shutdown) result->shut_down.push_back(r);
  }
  packed_.clear();
  for (const Abort& a : aborts) {
    NameRecord* r = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = names_.find({a.process_set, a.name});
      if (it != names_.end() && it->second.negotiating) r = &it->second;
    }
    if (r == nullptr) continue;
    finish(*r, HPCDL_ERR_SHUTDOWN, a.message);
    drop(*r, &work);
  }
  // Shutdown is not collective: one rank's ends the job for every rank, in this cycle, before anything
  // else runs (fail_everything fails every operation, naming that rank).
  if (!result->shut_down.empty()) return Status::ok();
  fused_last_cycle_ = false;
  for (int ps : join_changed)
    for (NameRecord* r = negotiating_; r != nullptr; r = r->next_negotiating)
      if (r->key.first == ps) list_work(*r, &work);
  if (work.empty()) return Status::ok();
  decide_and_run(work);
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

bool Engine::cached(const NameRecord& r, const OpRequest& request) const {
  if (r.cache_id < 0) return false;
  const int m = index_of(r.cache_members, rank_);
  return m >= 0 && m < static_cast<int>(r.cache_requests.size()) && r.cache_requests[m]->same_as(request);
}

// Packs this rank's control message; true when it brings news its peers should not wait for (see
// kRingAfterEarly): control flags, nothing at all (a heartbeat), or a submission that completes a round.
// `batches_due`: when the first outstanding device batch becomes overdue.
bool Engine::pack(ByteWriter* message, Deadline* batches_due) {
  std::vector<int> ask;
  uint8_t why = 0;
  bool report = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    *batches_due = device_batches_due();
    widest_pack_ = std::max<int64_t>(widest_pack_, static_cast<int64_t>(queue_.size()));
    for (auto& op : queue_) {
      op->packed = true;
      packed_.push_back(std::move(op));
    }
    queue_.clear();
    queue_bytes_ = 0;
    deferred_ = false;
    if (shutdown_requested_ && !shutdown_sent_) shutdown_sent_ = true;
    ask.swap(report_request_);
    why = report_why_;
    report_why_ = 0;
    report = report_due_;
    report_due_ = false;
  }
  ByteWriter& w = *message;
  w.clear();
  uint32_t flags = shutdown_sent_ ? kFlagShutdown : 0;
  if (rank_ == 0 && knobs_to_send_) flags |= kFlagKnobs;
  if (rank_ == 0 && !aborts_to_send_.empty()) flags |= kFlagAborts;
  if (!ask.empty()) flags |= kFlagReportRequest;
  if (report) flags |= kFlagReport;
  w.put(flags);
  w.put(static_cast<uint32_t>(packed_.size()));
  for (const auto& op : packed_) {
    const OpRequest& req = op->request;
    if (cached(*op->record, req)) {
      w.put(kCachedRequest);
      w.put(static_cast<int32_t>(op->record->cache_id));
    } else {
      w.put(kFullRequest);
      req.encode(w);
    }
    const int64_t payload = inline_bytes(req);
    w.put(static_cast<uint8_t>(payload > 0));
    if (payload > 0) {
      const auto* data = static_cast<const uint8_t*>(op->input);
      w.bytes().insert(w.bytes().end(), data, data + payload);
    }
  }
  if (flags & kFlagKnobs) {
    w.put(knobs_next_.fusion_threshold);
    w.put(knobs_next_.cycle_time_ms);
    w.put(knobs_next_.small_message_bytes);
    knobs_to_send_ = false;
  }
  if (flags & kFlagAborts) {
    w.put(static_cast<uint32_t>(aborts_to_send_.size()));
    for (const Abort& a : aborts_to_send_) {
      w.put(static_cast<int32_t>(a.process_set));
      w.put_string(a.name);
      w.put_string(a.message);
    }
    aborts_to_send_.clear();
  }
  if (flags & kFlagReportRequest) {
    w.put(why);
    w.put(static_cast<uint32_t>(ask.size()));
    for (int r : ask) w.put(static_cast<int32_t>(r));
  }
  if (flags & kFlagReport) w.put_string(rank_report());
  if (flags != 0 || packed_.empty()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& op : packed_) {
    const NameRecord& r = *op->record;
    if (r.negotiating && r.arrived.size() + 1 >= r.members.size()) return true;
  }
  return false;
}

// All-gathers every rank's control message: one exchange of fixed-size slots (a single step on shared
// memory), plus a second, variable one only when some message did not fit its slot. Each rank's message
// length lands in message_size_, its first bytes in its slot, the rest (if any) in extra_, in rank order.
Status Engine::exchange(const ByteWriter& mine, Deadline until) {
  constexpr size_t kInline = kSlotBytes - sizeof(uint32_t);
  const std::vector<uint8_t>& bytes = mine.bytes();
  uint8_t send[kSlotBytes];
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  std::memcpy(send, &len, sizeof len);
  std::memcpy(send + sizeof len, bytes.data(), std::min(bytes.size(), kInline));
  static const std::string what = "engine negotiation";
  Status s = control_->allgather_slots(send, slots_.data(), kSlotBytes, until, what);
  if (!s.is_ok()) return Status::error(s.code, s.message + pending_summary());
  std::vector<int64_t> extra;
  int64_t extra_total = 0;
  for (int r = 0; r < size_; ++r) {
    uint32_t n = 0;
    std::memcpy(&n, slots_.data() + r * kSlotBytes, sizeof n);
    if (n > kMaxControlBytes)
      return Status::error(HPCDL_ERR_INTERNAL, what + ": rank " + std::to_string(r) + " announced a control message of " +
                                                   std::to_string(n) + " bytes, more than the " +
                                                   std::to_string(kMaxControlBytes) + " a cycle may carry");
    message_size_[r] = n;
    if (n > kInline) {
      if (extra.empty()) extra.assign(size_, 0);
      extra[r] = static_cast<int64_t>(n - kInline);
      extra_total += extra[r];
    }
  }
  if (extra_total == 0) return Status::ok();
  extra_.resize(static_cast<size_t>(extra_total));
  const uint8_t* tail = bytes.data() + std::min(bytes.size(), kInline);
  s = control_->allgatherv(tail, extra_.data(), extra, HPCDL_UINT8, until, what);
  if (!s.is_ok()) return Status::error(s.code, s.message + pending_summary());
  return Status::ok();
}

// " (this rank waits for 3 operation(s), e.g. 'grad.w')": what a failed negotiation held up.
std::string Engine::pending_summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t count = 0;
  const std::string* example = nullptr;
  for (const auto& kv : names_) {
    const auto& op = kv.second.op;
    if (!op || op->status.load(std::memory_order_relaxed) != HPCDL_PENDING) continue;
    ++count;
    if (example == nullptr) example = &kv.first.second;
  }
  if (count == 0) return "";
  return " (this rank waits for " + std::to_string(count) + " operation(s), e.g. '" + *example + "')";
}

// Under mutex_: the record of a name, made when it has none.
NameRecord* Engine::record_of(const Key& key) {
  auto it = names_.find(key);
  if (it == names_.end()) it = names_.emplace(key, NameRecord(key)).first;
  return &it->second;
}

// Under mutex_ (the round's start is seen by callers: a record in a round is never freed).
void Engine::start_round(NameRecord& r, const OpRequest& request) {
  r.negotiating = true;
  r.sequence = sequence_++;
  if (request.process_set == 0) {
    if (static_cast<int>(r.members.size()) != size_) r.members = members_of(request);
  } else {
    r.members.assign(request.members.begin(), request.members.end());
  }
  const size_t n = r.members.size();
  r.by_member.assign(n, nullptr);
  r.payload.resize(n);
  for (auto& p : r.payload) p.clear();
  r.arrived.clear();
  r.from_cache = 0;
  r.first_seen = last_cycle_start_;
  r.last_arrival = r.first_seen;
  r.last_stall_warning = r.first_seen;
  r.local.reset();
  r.held = false;
  r.finished = false;
  r.prev_negotiating = nullptr;
  r.next_negotiating = negotiating_;
  if (negotiating_ != nullptr) negotiating_->prev_negotiating = &r;
  negotiating_ = &r;
}

// Under mutex_: the round is over (its operation ran, failed or was cancelled).
void Engine::end_round(NameRecord& r) {
  if (!r.negotiating) return;
  if (r.prev_negotiating != nullptr) r.prev_negotiating->next_negotiating = r.next_negotiating;
  else negotiating_ = r.next_negotiating;
  if (r.next_negotiating != nullptr) r.next_negotiating->prev_negotiating = r.prev_negotiating;
  r.prev_negotiating = r.next_negotiating = nullptr;
  r.negotiating = false;
  r.by_member.clear();
  r.local.reset();
  free_if_idle(r);
}

// Under mutex_: a record nobody refers to any more (no round, no cache entry, no submission of this rank
// holding the name) is dropped; a name seen once (an unnamed operation) does not stay in the table.
void Engine::free_if_idle(NameRecord& r) {
  if (r.negotiating || r.cache_id >= 0 || r.op) return;
  auto it = names_.find(r.key);
  if (it != names_.end() && &it->second == &r) names_.erase(it);
}

// Removes a record's round that ends before this cycle's decisions, and its place in the cycle's work.
void Engine::drop(NameRecord& r, std::vector<NameRecord*>* work) {
  work->erase(std::remove(work->begin(), work->end(), &r), work->end());
  std::lock_guard<std::mutex> lock(mutex_);
  end_round(r);
}

void Engine::list_work(NameRecord& r, std::vector<NameRecord*>* work) {
  if (r.listed_in_cycle == next_cycle_) return;
  r.listed_in_cycle = next_cycle_;
  work->push_back(&r);
}

bool Engine::decode(int rank, const uint8_t* message, size_t size, bool* shutdown, std::vector<Abort>* aborts,
                    std::vector<NameRecord*>* work, std::set<int>* join_changed, std::string* problem) {
  ByteReader in(message, size);
  uint32_t flags = 0, count = 0;
  if (!in.get(&flags) || !in.get(&count)) return false;
  *shutdown = (flags & kFlagShutdown) != 0;
  std::lock_guard<std::mutex> lock(mutex_);  // records are made and rounds started here
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t kind = 0;
    if (!in.get(&kind)) return false;
    RequestPtr request;
    NameRecord* r = nullptr;
    const bool from_cache = kind == kCachedRequest;
    if (from_cache) {
      int32_t id = -1;
      if (!in.get(&id) || id < 0 || id >= static_cast<int32_t>(cache_.size()) || cache_[id] == nullptr) return false;
      r = cache_[id];
      const int m = index_of(r->cache_members, rank);
      if (m < 0 || m >= static_cast<int>(r->cache_requests.size())) return false;
      request = r->cache_requests[m];
    } else {
      auto decoded = std::make_shared<OpRequest>();
      if (!decoded->decode(in)) return false;
      *problem = wire_problem(*decoded, size_);
      if (!problem->empty()) {
        *problem = describe(*decoded) + ": " + *problem;
        return false;
      }
      r = record_of({decoded->process_set, decoded->name});
      request = std::move(decoded);
    }
    uint8_t has_payload = 0;
    if (!in.get(&has_payload)) return false;
    const int64_t payload_bytes = has_payload ? inline_bytes(*request) : 0;
    if (has_payload && payload_bytes <= 0) return false;
    if (!r->negotiating) start_round(*r, *request);
    const int m = r->key.first == 0 ? rank : index_of(request->members, rank);
    if (m < 0) return false;  // enqueue only accepts members
    if (m >= static_cast<int>(r->by_member.size()) || r->by_member[m]) return false;  // enqueue refuses duplicates
    if (has_payload) {
      std::vector<uint8_t>& payload = r->payload[m];
      payload.resize(static_cast<size_t>(payload_bytes));
      for (auto& byte : payload)
        if (!in.get(&byte)) return false;
    }
    r->arrived.push_back(rank);
    if (from_cache) ++r->from_cache;
    r->last_arrival = last_cycle_start_;
    if (rank == rank_ && i < packed_.size()) r->local = packed_[i];
    if (request->op_type == HPCDL_OP_JOIN) {
      joined_[r->key.first].insert(rank);
      last_joined_[r->key.first] = rank;
      join_changed->insert(r->key.first);
    }
    r->by_member[m] = std::move(request);
    list_work(*r, work);
  }
  if (flags & kFlagKnobs) {
    Knobs k;
    if (!in.get(&k.fusion_threshold) || !in.get(&k.cycle_time_ms) || !in.get(&k.small_message_bytes)) return false;
    if (!k.plausible()) {
      *problem = "engine settings out of range";
      return false;
    }
    std::lock_guard<std::mutex> knob_lock(knob_mutex_);
    knobs_ = k;
  }
  if (flags & kFlagAborts) {
    uint32_t n = 0;
    if (!in.get(&n)) return false;
    for (uint32_t i = 0; i < n; ++i) {
      Abort a;
      int32_t ps = 0;
      if (!in.get(&ps) || !in.get_string(&a.name) || !in.get_string(&a.message)) return false;
      a.process_set = ps;
      aborts->push_back(std::move(a));
    }
  }
  if (flags & kFlagReportRequest) {
    uint8_t why = 0;
    uint32_t n = 0;
    if (!in.get(&why) || !in.get(&n) || n > static_cast<uint32_t>(size_)) return false;
    std::vector<int> asked(n);
    for (auto& a : asked) {
      int32_t v = -1;
      if (!in.get(&v) || v < 0 || v >= size_) return false;
      a = v;
    }
    ++report_round_;
    if (std::find(asked.begin(), asked.end(), rank_) != asked.end()) report_due_ = true;
    dump_reason_ = why == kTimeout ? "timeout" : "stall";
    dump_message_ = "rank " + std::to_string(rank) + (why == kTimeout ? " timed out waiting for " : " found a stall: ") +
                    ranks_text(asked) + (why == kTimeout ? "" : " missing");
  }
  if (flags & kFlagReport) {
    RankReport& report = reports_[rank];
    if (!in.get_string(&report.text)) return false;
    report.round = report_round_;
    reports_cv_.notify_all();
  }
  return !in.failed();
}

// What every operation of a job that has shut down fails with: it names the ranks that left.
Status Engine::shutdown_status(const std::vector<int>& ranks) const {
  std::vector<int> others;
  for (int r : ranks)
    if (r != rank_) others.push_back(r);
  if (others.empty())
    return Status::error(HPCDL_ERR_SHUTDOWN, "hpcdl was shut down on this rank (shutdown() was called)");
  return Status::error(HPCDL_ERR_SHUTDOWN,
                       ranks_text(others) + (others.size() == 1 ? " has" : " have") +
                           " shut down (called shutdown() or exited): the job's collectives cannot run without " +
                           (others.size() == 1 ? "it" : "them") +
                           ", so this rank's pending and later operations fail. Call shutdown() on this rank "
                           "too (init() starts a new job)");
}

// Cycle runner: every operation this rank holds fails with `status`, and the engine takes no more. The
// flight recorder is dumped when something failed: an error, or the shutdown of a peer this rank waited on
// (or, holding nothing then, the first operation it submits after).
void Engine::fail_everything(const Status& status) {
  bool failed_work = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_work = fail_all(status);
  }
  const bool ours = status.message.rfind("hpcdl was shut down", 0) == 0;
  if (status.code != HPCDL_ERR_SHUTDOWN || (failed_work && !ours)) {
    flight_dump("error", status.message);
  } else if (!ours) {
    std::lock_guard<std::mutex> lock(mutex_);
    dump_on_refusal_ = true;
  }
}

// Under mutex_: fail_everything's work; true when an operation of this rank failed.
bool Engine::fail_all(const Status& status) {
  std::vector<std::shared_ptr<EngineOp>> ops;
  while (negotiating_ != nullptr) {
    NameRecord& r = *negotiating_;
    if (r.local) ops.push_back(std::move(r.local));
    end_round(r);
  }
  groups_.clear();
  for (auto& op : packed_) ops.push_back(op);
  packed_.clear();
  if (failed_.is_ok()) failed_ = status;
  for (auto& op : queue_) ops.push_back(op);
  queue_.clear();
  queue_bytes_ = 0;
  // Device batches not yet taken fail with the rest. Those the executor runs fail too (it learns why from
  // hpcdl_device_next and aborts them: a collective the GPU may never finish, e.g. because a peer died),
  // except when the job shut down: every rank let its own running collectives end before it left, so
  // these end too, and their handles complete when the executor reports them.
  for (const auto& b : device_queue_) ops.insert(ops.end(), b->ops.begin(), b->ops.end());
  device_queue_.clear();
  if (failed_.code != HPCDL_ERR_SHUTDOWN) {
    for (const auto& kv : device_running_) ops.insert(ops.end(), kv.second->ops.begin(), kv.second->ops.end());
    device_running_.clear();
  }
  device_cv_.notify_all();
  std::vector<std::shared_ptr<EngineOp>> waited_on;
  const int code = failed_.code == HPCDL_OK ? HPCDL_ERR_SHUTDOWN : failed_.code;
  bool failed_any = false;
  for (auto& op : ops) {
    if (op->status.load() != HPCDL_PENDING) continue;
    failed_any = true;
    if (auto waited = mark_finished(op, code, failed_.message + " (" + describe(op->request) + " did not complete)"))
      waited_on.push_back(std::move(waited));
  }
  for (auto& op : waited_on) op->done.notify_all();
  reports_cv_.notify_all();
  wake_engine();  // a caller ran this cycle: the engine thread stops too
  return failed_any;
}

}  // namespace hpcdl
