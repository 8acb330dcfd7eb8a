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

bool Engine::Pending::all_inline() const {
  for (size_t m = 0; m < by_member.size(); ++m)
    if (!by_member[m] || payload[m].empty()) return false;
  return true;
}

const OpRequest* Engine::Pending::any() const {
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
  stall_check_enabled_ = o.get_bool("stall_check", true);
  stall_check_s_ = o.get_double("stall_check_s", 60.0);
  stall_shutdown_s_ = o.get_double("stall_shutdown_s", 0.0);
  if (rank_ == 0 && o.get_bool("autotune", false)) {
    autotuner_ = std::make_unique<Autotuner>(knobs_, split_commas(o.get("autotune_fixed")),
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
  next_stall_check_ = Clock::now() + std::chrono::seconds(1);
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
    if (waiting_) {
      control_->notify_self();
      waiting_ = false;
    }
    queue_cv_.notify_all();
    device_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  timeline_.stop();
}

// ---- the engine thread -------------------------------------------------------------------------------

// Where the engine thread runs. Two engine threads that share a core make every handshake between them
// wait for the scheduler (the data plane spins briefly before yielding), which turns a 40 us negotiation
// into 300 us; and a hand-off between a caller and its engine thread on different cores is a cross-core
// wake-up, which in a VM costs tens of microseconds more than a switch on one core (a lone 4-byte
// allreduce on 2 ranks: 41 us against 100 us). So while it negotiates, the engine thread keeps to the core
// its caller last submitted from (when the host has a core per local rank); for large transfers it may
// run anywhere, so that a busy core cannot hold back bandwidth-bound work. The callers' threads are never
// touched.
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

void Engine::keep_to_own_core(bool own) {
  if (!pinned_ || own == on_own_core_) return;
  const cpu_set_t& set = own ? own_core_ : all_cores_;
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0) on_own_core_ = own;
}

void Engine::loop() {
  place_thread();
  // Its sleeps are tens of microseconds (settle); the default 50 us of timer slack would triple them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  bool active = false;
  while (true) {
    if (!active) {
      if (!wait_while_idle()) break;
      follow_caller();
      active = true;
      doorbell_pending_ = true;
      first_cycle_of_burst_ = true;
      burst_start_ = Clock::now();
      burst_bytes_ = 0;
    } else {
      wait_for_batch();
      settle();
    }
    CycleResult result;
    Status s = run_cycle(&result);
    if (!s.is_ok()) {
      fail_everything(s);
      break;
    }
    if (!result.shut_down.empty()) {
      fail_everything(shutdown_status(result.shut_down));
      break;
    }
    if (rank_ == 0) stall_check(Clock::now());
    if (!result.activity) {
      if (autotuner_ && burst_bytes_ > 0) {
        Knobs next;
        if (autotuner_->record_step(burst_bytes_, seconds_between(burst_start_, last_cycle_start_), &next)) {
          knobs_next_ = next;
          knobs_to_send_ = true;
        }
      }
      timeline_.flush(false);
      keep_to_own_core(true);
      // A burst of one empty cycle (a heartbeat, a stray ring) says nothing about how the callers submit.
      if (!doorbell_pending_) bursty_ = widest_pack_ > 1;
      widest_pack_ = 0;
      s = go_idle();
      if (!s.is_ok()) {
        fail_everything(s);
        break;
      }
      active = false;
    }
  }
  fail_everything(Status::error(HPCDL_ERR_SHUTDOWN, "hpcdl was shut down"));
  timeline_.flush(true);
}

// Sleeps until this rank has work, a peer rang the doorbell, a heartbeat is due (this rank waits for an
// operation: see kHeartbeat) or a timer (stall check, timeline flush) is. Returns false when the engine
// must stop.
bool Engine::wait_while_idle() {
  while (true) {
    bool local = false;
    Clock::time_point heartbeat = Clock::time_point::max();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.is_ok()) return false;
      local = !queue_.empty() || (shutdown_requested_ && !shutdown_sent_) || !aborts_to_send_.empty();
      const bool device = !device_queue_.empty() || !device_running_.empty();
      if (device) {
        Status overdue = overdue_device_batch(Clock::now());
        if (!overdue.is_ok()) {
          failed_ = overdue;
          return false;
        }
      }
      if (device || unfinished_ > 0) {
        heartbeat = last_cycle_start_ + kHeartbeat;
        local = local || Clock::now() >= heartbeat;
      }
      if (!local) waiting_ = true;
    }
    if (local) {
      settle();
      control_->notify_peers();
      return true;
    }
    auto now = Clock::now();
    Deadline until = now + std::chrono::seconds(1);
    if (rank_ == 0 && stall_check_enabled_ && !table_.empty()) until = std::min(until, next_stall_check_);
    // Events still in memory reach the file soon, so a trace survives the job being killed.
    if (timeline_.has_pending()) until = std::min(until, now + std::chrono::milliseconds(600));
    until = std::min(until, heartbeat);
    bool woke = control_->wait_notify(until);
    bool poked;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      poked = !waiting_;
      waiting_ = false;
    }
    // A caller rang our own doorbell (under mutex_, so it has landed): consume it now, or it would wake
    // this thread for a cycle that no peer runs. Then let that caller run first: woken on its core, this
    // thread has usually just preempted it, and an asynchronous submission must return to its caller
    // (which submits more, polls, or waits, and a wait hands the core back at once) before the engine
    // runs it, or a caller that polls right after submitting would find every operation already done.
    if (poked) {
      control_->wait_notify(past());
      sched_yield();
    }
    if (woke || poked) {
      settle();
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.is_ok()) return false;  // a device batch failed (device_done rang)
      if (!queue_.empty() || (shutdown_requested_ && !shutdown_sent_)) control_->notify_peers();
      return true;
    }
    if (rank_ == 0) stall_check(Clock::now());
    timeline_.flush(false);
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
// callers that submit in bursts pay for it: it is skipped unless this or the previous burst packed more
// than one operation into a cycle, so a lone operation (a caller that waits on each one; the enqueue to
// wait hand-off costs ~25 us in a VM) runs at once.
void Engine::settle() {
  if (!bursty_ && widest_pack_ <= 1) return;
  const auto [cycle, threshold] = batching_knobs();
  if (cycle <= Clock::duration::zero() || threshold <= 0) return;  // no batching wanted
  const auto give_up = Clock::now() + cycle;
  std::unique_lock<std::mutex> lock(mutex_);
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
  const auto [cycle, threshold] = batching_knobs();
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

// Doorbells only ring when a rank leaves idle, before it packs that cycle's message; so once the cycle
// after it starts, every ring of this burst has landed (shared memory delivers at once) and none of the
// next burst can have been sent (that needs this rank's next message). Clearing there is one look per
// burst, off the path of the burst's first operation.
void Engine::clear_doorbell() {
  while (control_->wait_notify(past())) {
  }
}

Status Engine::go_idle() {
  if (!doorbell_pending_) return Status::ok();
  // The burst was a single cycle (no operation in it): clear now and agree, so that no rank can ring for
  // the next cycle before every rank cleared.
  clear_doorbell();
  doorbell_pending_ = false;
  return control_->barrier(deadline(), "engine idle handshake");
}

Status Engine::run_cycle(CycleResult* result) {
  if (doorbell_pending_ && !first_cycle_of_burst_) {
    clear_doorbell();
    doorbell_pending_ = false;
  }
  first_cycle_of_burst_ = false;
  ++cycle_;
  last_cycle_start_ = Clock::now();
  if (timeline_.active() && timeline_.mark_cycles()) timeline_.instant("CYCLE_START", last_cycle_start_);
  std::vector<uint8_t> mine;
  pack(&mine);
  // The cycle that announces this rank's shutdown is its last: it waits for its peers a short while, not
  // the whole timeout, so that an exiting process leaves at once even when a peer is hung.
  const Deadline until = shutdown_sent_ ? std::min(deadline(), Clock::now() + kShutdownGrace) : deadline();
  std::vector<std::vector<uint8_t>> all;
  Status s = exchange(mine, until, &all);
  if (!s.is_ok()) return s;
  std::vector<Ready> work;
  std::set<int> join_changed;
  std::vector<Abort> aborts;
  bool knobs_changed = false;
  for (int r = 0; r < size_; ++r) {
    bool shutdown = false;
    size_t before = work.size() + aborts.size();
    Knobs before_knobs = knobs_;
    std::string problem;
    if (!decode(r, all[r], &shutdown, &aborts, &work, &join_changed, &problem))
      return Status::error(HPCDL_ERR_INTERNAL, "the engine received a malformed control message from rank " +
                                                   std::to_string(r) + (problem.empty() ? "" : " (" + problem + ")") +
                                                   "; every rank of a job must run the same build of hpcdl");
    if (shutdown) result->shut_down.push_back(r);
    if (work.size() + aborts.size() != before) result->activity = true;
    if (r == 0 && (before_knobs.fusion_threshold != knobs_.fusion_threshold ||
                   before_knobs.cycle_time_ms != knobs_.cycle_time_ms ||
                   before_knobs.small_message_bytes != knobs_.small_message_bytes))
      knobs_changed = true;
  }
  packed_.clear();
  if (knobs_changed) result->activity = true;
  for (const Abort& a : aborts) {
    auto it = table_.find({a.process_set, a.name});
    if (it == table_.end()) continue;
    finish(it->second, HPCDL_ERR_SHUTDOWN, a.message);
    drop(it, &work);
  }
  // Shutdown is not collective: one rank's ends the job for every rank, in this cycle, before anything
  // else runs (the loop fails every operation, naming that rank).
  if (!result->shut_down.empty()) return Status::ok();
  fused_last_cycle_ = false;
  for (int ps : join_changed)
    for (auto& kv : table_)
      if (kv.first.first == ps) list_work(kv.first, kv.second, &work);
  if (work.empty()) return Status::ok();
  decide_and_run(work);
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void Engine::pack(std::vector<uint8_t>* message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    widest_pack_ = std::max<int64_t>(widest_pack_, static_cast<int64_t>(queue_.size()));
    for (auto& op : queue_) packed_.push_back(std::move(op));
    queue_.clear();
    queue_bytes_ = 0;
    if (shutdown_requested_ && !shutdown_sent_) shutdown_sent_ = true;
  }
  ByteWriter w;
  uint32_t flags = shutdown_sent_ ? kFlagShutdown : 0;
  if (rank_ == 0 && knobs_to_send_) flags |= kFlagKnobs;
  if (rank_ == 0 && !aborts_to_send_.empty()) flags |= kFlagAborts;
  w.put(flags);
  w.put(static_cast<uint32_t>(packed_.size()));
  for (const auto& op : packed_) {
    const OpRequest& req = op->request;
    int id = -1;
    if (cache_capacity_ > 0) {
      auto it = cache_index_.find({req.process_set, req.name});
      if (it != cache_index_.end()) {
        const CacheSlot& slot = cache_[it->second];
        int m = index_of(slot.members, rank_);
        if (m >= 0 && m < static_cast<int>(slot.by_member.size()) && slot.by_member[m]->same_as(req)) id = it->second;
      }
    }
    if (id >= 0) {
      w.put(kCachedRequest);
      w.put(static_cast<int32_t>(id));
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
  *message = std::move(w.bytes());
}

// All-gathers every rank's control message: one fixed-size allgather, plus a second, variable one only
// when some message did not fit its slot.
Status Engine::exchange(const std::vector<uint8_t>& mine, Deadline until, std::vector<std::vector<uint8_t>>* all) {
  constexpr size_t kInline = kSlotBytes - sizeof(uint32_t);
  std::vector<uint8_t> send(kSlotBytes, 0), recv(kSlotBytes * size_);
  uint32_t len = static_cast<uint32_t>(mine.size());
  std::memcpy(send.data(), &len, sizeof len);
  std::memcpy(send.data() + sizeof len, mine.data(), std::min(mine.size(), kInline));
  const std::string what = "engine negotiation";
  Status s = control_->allgatherv(send.data(), recv.data(), std::vector<int64_t>(size_, kSlotBytes), HPCDL_UINT8,
                                  until, what);
  if (!s.is_ok()) return Status::error(s.code, s.message + pending_summary());
  all->assign(size_, {});
  std::vector<int64_t> extra(size_, 0);
  int64_t extra_total = 0;
  for (int r = 0; r < size_; ++r) {
    uint32_t n = 0;
    std::memcpy(&n, recv.data() + r * kSlotBytes, sizeof n);
    (*all)[r].assign(recv.data() + r * kSlotBytes + sizeof n,
                     recv.data() + r * kSlotBytes + sizeof n + std::min<size_t>(n, kInline));
    if (n > kMaxControlBytes)
      return Status::error(HPCDL_ERR_INTERNAL, what + ": rank " + std::to_string(r) + " announced a control message of " +
                                                   std::to_string(n) + " bytes, more than the " +
                                                   std::to_string(kMaxControlBytes) + " a cycle may carry");
    if (n > kInline) extra[r] = static_cast<int64_t>(n - kInline);
    extra_total += extra[r];
  }
  if (extra_total == 0) return Status::ok();
  std::vector<uint8_t> more(static_cast<size_t>(extra_total));
  const uint8_t* tail = mine.data() + std::min(mine.size(), kInline);
  s = control_->allgatherv(tail, more.data(), extra, HPCDL_UINT8, until, what);
  if (!s.is_ok()) return Status::error(s.code, s.message + pending_summary());
  size_t off = 0;
  for (int r = 0; r < size_; ++r) {
    (*all)[r].insert((*all)[r].end(), more.begin() + off, more.begin() + off + extra[r]);
    off += static_cast<size_t>(extra[r]);
  }
  return Status::ok();
}

// " (this rank waits for 3 operation(s), e.g. 'grad.w')": what a failed negotiation held up.
std::string Engine::pending_summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t count = 0;
  const std::string* example = nullptr;
  for (const auto& kv : names_in_use_) {
    if (kv.second.finished) continue;
    ++count;
    if (example == nullptr) example = &kv.first.second;
  }
  if (count == 0) return "";
  return " (this rank waits for " + std::to_string(count) + " operation(s), e.g. '" + *example + "')";
}

// Removes an entry that ends before this cycle's decisions, and its place in the cycle's work.
Engine::Table::iterator Engine::drop(Table::iterator it, std::vector<Ready>* work) {
  const Pending* gone = &it->second;
  work->erase(std::remove_if(work->begin(), work->end(), [&](const Ready& w) { return w.entry == gone; }),
              work->end());
  return table_.erase(it);
}

void Engine::list_work(const Key& key, Pending& entry, std::vector<Ready>* work) {
  if (entry.listed_in_cycle == cycle_) return;
  entry.listed_in_cycle = cycle_;
  work->push_back({&key, &entry});
}

bool Engine::decode(int rank, const std::vector<uint8_t>& message, bool* shutdown, std::vector<Abort>* aborts,
                    std::vector<Ready>* work, std::set<int>* join_changed, std::string* problem) {
  ByteReader in(message.data(), message.size());
  uint32_t flags = 0, count = 0;
  if (!in.get(&flags) || !in.get(&count)) return false;
  *shutdown = (flags & kFlagShutdown) != 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t kind = 0;
    if (!in.get(&kind)) return false;
    RequestPtr request;
    const bool from_cache = kind == kCachedRequest;
    if (from_cache) {
      int32_t id = -1;
      if (!in.get(&id) || id < 0 || id >= static_cast<int32_t>(cache_.size()) || !cache_[id].used) return false;
      const CacheSlot& slot = cache_[id];
      int m = index_of(slot.members, rank);
      if (m < 0 || m >= static_cast<int>(slot.by_member.size())) return false;
      request = slot.by_member[m];
    } else {
      auto decoded = std::make_shared<OpRequest>();
      if (!decoded->decode(in)) return false;
      *problem = wire_problem(*decoded, size_);
      if (!problem->empty()) {
        *problem = describe(*decoded) + ": " + *problem;
        return false;
      }
      request = std::move(decoded);
    }
    uint8_t has_payload = 0;
    std::vector<uint8_t> payload;
    if (!in.get(&has_payload)) return false;
    if (has_payload) {
      const int64_t bytes = inline_bytes(*request);
      if (bytes <= 0) return false;
      payload.resize(static_cast<size_t>(bytes));
      for (auto& byte : payload)
        if (!in.get(&byte)) return false;
    }
    std::shared_ptr<EngineOp> local;
    if (rank == rank_ && i < packed_.size()) local = packed_[i];
    auto inserted = table_.try_emplace(Key{request->process_set, request->name});
    const Key& key = inserted.first->first;
    Pending& e = inserted.first->second;
    if (inserted.second) {
      e.sequence = sequence_++;
      e.members = members_of(*request);
      e.by_member.resize(e.members.size());
      e.payload.resize(e.members.size());
      e.first_seen = last_cycle_start_;
      e.last_stall_warning = e.first_seen;
    }
    const int m = key.first == 0 ? rank : index_of(request->members, rank);
    if (m < 0) return false;  // enqueue only accepts members
    if (m >= static_cast<int>(e.by_member.size()) || e.by_member[m]) return false;  // enqueue refuses duplicates
    e.arrived.push_back(rank);
    if (from_cache) ++e.cached;
    e.last_arrival = last_cycle_start_;
    if (local) e.local = local;
    if (request->op_type == HPCDL_OP_JOIN) {
      joined_[key.first].insert(rank);
      last_joined_[key.first] = rank;
      join_changed->insert(key.first);
    }
    e.by_member[m] = std::move(request);
    e.payload[m] = std::move(payload);
    list_work(key, e, work);
  }
  if (flags & kFlagKnobs) {
    Knobs k;
    if (!in.get(&k.fusion_threshold) || !in.get(&k.cycle_time_ms) || !in.get(&k.small_message_bytes)) return false;
    if (!k.plausible()) {
      *problem = "engine settings out of range";
      return false;
    }
    std::lock_guard<std::mutex> lock(knob_mutex_);
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
  return !in.failed();
}

bool Engine::is_ready(const Key& key, const Pending& e) {
  const OpRequest* any = e.any();
  if (any == nullptr) return false;
  const bool is_join = any->op_type == HPCDL_OP_JOIN;
  const std::set<int>& joined = joined_[key.first];
  for (size_t m = 0; m < e.by_member.size(); ++m) {
    if (e.by_member[m]) continue;
    if (is_join || joined.count(e.members[m]) == 0) return false;
  }
  return true;
}

// As in Horovod, a joined rank stands in only for allreduces (it contributes zeros) and barriers; every
// other collective fails on the members that submitted it while a member has joined.
std::string Engine::join_conflict(const Pending& e) {
  std::vector<int> absent;
  for (size_t m = 0; m < e.by_member.size(); ++m)
    if (!e.by_member[m]) absent.push_back(e.members[m]);
  if (absent.empty()) return "";
  const OpRequest& r = *e.any();
  if (r.op_type == HPCDL_OP_ALLREDUCE || r.op_type == HPCDL_OP_BARRIER) return "";
  return describe(r) + " cannot run while " + ranks_text(absent) + (absent.size() == 1 ? " has" : " have") +
         " joined (called join()): only allreduce and barrier accept joined ranks, as in Horovod. Finish such "
         "collectives before any rank joins, or have every rank call join() first";
}

void Engine::decide_and_run(const std::vector<Ready>& work) {
  std::vector<Ready> ready;
  std::vector<std::pair<std::shared_ptr<EngineOp>, std::vector<int>>> still_waiting;
  for (const Ready& w : work) {
    Pending& e = *w.entry;
    if (e.held) continue;
    if (is_ready(*w.key, e)) {
      ready.push_back(w);
    } else if (e.local) {
      std::vector<int> missing;
      for (size_t m = 0; m < e.by_member.size(); ++m)
        if (!e.by_member[m]) missing.push_back(e.members[m]);
      still_waiting.push_back({e.local, missing});
    }
  }
  if (!still_waiting.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& w : still_waiting) w.first->waiting_for = std::move(w.second);
  }
  std::sort(ready.begin(), ready.end(), [](const Ready& a, const Ready& b) {
    bool ja = a.entry->any()->op_type == HPCDL_OP_JOIN, jb = b.entry->any()->op_type == HPCDL_OP_JOIN;
    if (ja != jb) return jb;
    return a.entry->sequence < b.entry->sequence;
  });
  const auto now = Clock::now();
  std::vector<Ready> runnable;
  std::vector<const Key*> finished;  // keys of table_; each entry listed once (Pending::finished)
  auto done = [&](const Key& key, Pending& e) {
    if (e.finished) return;
    e.finished = true;
    finished.push_back(&key);
  };
  auto fail_group = [&](const std::pair<int, int>& gkey, int group_size, const std::string& message) {
    auto held = groups_.find(gkey);
    int remaining = group_size - 1;
    if (held != groups_.end()) {
      for (const Key& k : held->second) {
        auto it = table_.find(k);
        if (it == table_.end()) continue;
        finish(it->second, HPCDL_ERR_MISMATCH, message);
        done(it->first, it->second);
        --remaining;
      }
      groups_.erase(held);
    }
    if (remaining > 0) failed_groups_[gkey] = message + "#" + std::to_string(remaining);
  };
  for (const Ready& r : ready) {
    Pending& e = *r.entry;
    e.decided = now;
    std::vector<const OpRequest*> requests;
    for (const auto& q : e.by_member) requests.push_back(q.get());
    std::string message;
    int code = HPCDL_ERR_MISMATCH;
    if (!validate_requests(requests, e.members, &message)) {
      code = HPCDL_ERR_MISMATCH;
    } else if (!(message = join_conflict(e)).empty()) {
      code = HPCDL_ERR_JOINED;
    }
    const OpRequest& any = *e.any();
    std::pair<int, int> gkey{r.key->first, any.group_id};
    if (any.group_id != 0) {
      auto failed = failed_groups_.find(gkey);
      if (failed != failed_groups_.end() && message.empty()) {
        std::string& text = failed->second;
        size_t hash = text.rfind('#');
        int remaining = std::stoi(text.substr(hash + 1)) - 1;
        message = text.substr(0, hash);
        code = HPCDL_ERR_MISMATCH;
        if (remaining <= 0) failed_groups_.erase(failed);
        else text = message + "#" + std::to_string(remaining);
      } else if (!message.empty()) {
        fail_group(gkey, any.group_size, "grouped with " + describe(any) + ", which failed: " + message);
      }
    }
    if (!message.empty()) {
      record_timeline(e, "NEGOTIATE", e.first_seen, now, "\"error\":\"" + json_escape(message) + "\"");
      finish(e, code, message);
      done(*r.key, e);
      continue;
    }
    if (any.group_id != 0) {
      auto& held = groups_[gkey];
      held.push_back(*r.key);
      e.held = true;
      if (static_cast<int>(held.size()) < any.group_size) continue;
      for (const Key& k : held) {
        auto it = table_.find(k);
        runnable.push_back({&it->first, &it->second});
      }
      groups_.erase(gkey);
      continue;
    }
    runnable.push_back(r);
  }
  // Pack small allreduces that can be reduced together into fusion batches; everything else runs alone.
  int64_t threshold;
  {
    std::lock_guard<std::mutex> lock(knob_mutex_);
    threshold = static_cast<int64_t>(knobs_.fusion_threshold);
  }
  struct Batch {
    std::vector<Ready> members;
    int64_t bytes = 0;
    bool fusable = false;
  };
  std::vector<Batch> batches;
  std::map<std::tuple<int, int, int, int, double, double>, size_t> open;
  std::map<int, bool> native;  // process set -> its engine-data comm reduces segments in place
  auto fuses_large = [&](int set) {
    auto it = native.find(set);
    if (it != native.end()) return it->second;
    std::shared_ptr<Comm> c = runtime_.find_comm_shared(set, Channel::kEngineData);
    return native[set] = c && c->native_segments();
  };
  for (const Ready& r : runnable) {
    const OpRequest& q = *r.entry->any();
    int64_t bytes = entry_bytes(*r.entry);
    // Device data is packed on the device, where a copy costs far less than another collective: every
    // allreduce up to the threshold fuses.
    const bool device = q.placement == HPCDL_PLACEMENT_DEVICE;
    bool fusable = q.op_type == HPCDL_OP_ALLREDUCE && threshold > 0 && bytes <= threshold &&
                   !r.entry->all_inline() &&
                   (device || bytes <= kFuseTensorMaxBytes || fuses_large(q.process_set));
    if (fusable) {
      auto fkey = std::make_tuple(q.process_set, q.placement, q.dtype, q.reduce_op, q.prescale, q.postscale);
      auto it = open.find(fkey);
      if (it != open.end() && batches[it->second].bytes + bytes <= threshold) {
        batches[it->second].members.push_back(r);
        batches[it->second].bytes += bytes;
        continue;
      }
      open[fkey] = batches.size();
    }
    batches.push_back({{r}, bytes, fusable});
  }
  for (const Batch& b : batches) {
    if (b.members.size() > 1) fused_last_cycle_ = true;
    run_batch(b.members, b.fusable && b.members.size() > 1);
    for (const Ready& r : b.members) done(*r.key, *r.entry);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.is_ok()) break;
    }
  }
  follow_skipped(finished);
  for (const Key* k : finished) table_.erase(table_.find(*k));
}

// A joined rank stands in for operations it never submits. It moves its own counters past them, as if it
// had submitted them: past an unnamed operation's number, and past a grouped operation's group id, so that
// its next unnamed and grouped operations get the same names and ids as its peers' (they would otherwise
// never meet, or fail as mismatched groups).
void Engine::follow_skipped(const std::vector<const Key*>& finished) {
  std::vector<std::pair<const Key*, const OpRequest*>> skipped;
  for (const Key* k : finished) {
    const Pending& e = table_.find(*k)->second;
    const int me = k->first == 0 ? rank_ : index_of(e.members, rank_);
    if (me >= 0 && !e.by_member[me]) skipped.push_back({k, e.any()});
  }
  if (skipped.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, request] : skipped) {
    if (request->group_id > 0) {
      int& last = last_group_id_[key->first];
      last = std::max(last, request->group_id);
    }
    const std::string prefix = std::string(op_type_name(request->op_type)) + ".noname.";
    if (key->second.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string number = key->second.substr(prefix.size());
    if (number.empty() || number.size() > 18 || number.find_first_not_of("0123456789") != std::string::npos)
      continue;
    int64_t& next = unnamed_counter_[{key->first, request->op_type}];
    next = std::max<int64_t>(next, std::stoll(number) + 1);
  }
}

void Engine::finish(Pending& e, int code, const std::string& message) {
  std::shared_ptr<EngineOp> waited_on;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waited_on = mark_finished(e, code, message);
  }
  if (waited_on) waited_on->done.notify_all();
}

// A batch finishes under one hold of mutex_, and its waiters wake after it: a caller that waits on the
// batch's operations one by one then finds them all done, where finishing them one at a time made it take
// turns with this thread for the lock at each wait (and, sharing a core, for the core).
void Engine::finish(const std::vector<Ready>& batch, int code, const std::string& message) {
  std::vector<std::shared_ptr<EngineOp>> waited_on;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Ready& r : batch)
      if (auto op = mark_finished(*r.entry, code, message)) waited_on.push_back(std::move(op));
  }
  for (const auto& op : waited_on) op->done.notify_all();
}

void Engine::finish(const std::vector<std::shared_ptr<EngineOp>>& ops, int code, const std::string& message) {
  std::vector<std::shared_ptr<EngineOp>> waited_on;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& op : ops)
      if (auto waited = mark_finished(op, code, message)) waited_on.push_back(std::move(waited));
  }
  for (const auto& op : waited_on) op->done.notify_all();
}

// Under mutex_: the entry's own operation leaves PENDING. Returns it when a caller waits on it.
std::shared_ptr<EngineOp> Engine::mark_finished(Pending& e, int code, const std::string& message) {
  if (!e.local) return nullptr;
  return mark_finished(std::move(e.local), code, message);
}

std::shared_ptr<EngineOp> Engine::mark_finished(std::shared_ptr<EngineOp> op, int code, const std::string& message) {
  auto name = names_in_use_.find({op->request.process_set, op->request.name});
  if (name != names_in_use_.end() && name->second.handle == op->id) {
    if (name->second.released) names_in_use_.erase(name);
    else name->second.finished = true;
  }
  if (code != HPCDL_OK) op->error = message;
  if (op->status.load(std::memory_order_relaxed) == HPCDL_PENDING) --unfinished_;
  op->status.store(code, std::memory_order_release);
  return op->waiters > 0 ? op : nullptr;
}

// Response cache: operations that ran with every member's submission are remembered under a small id; a
// rank that submits the same thing again sends only the id. Identical on every rank (updated in the same
// order from the same data), with least-recently-used eviction.
void Engine::remember(const Key& key, const Pending& e) {
  if (cache_capacity_ <= 0) return;
  for (const auto& q : e.by_member)
    if (!q || q->op_type == HPCDL_OP_JOIN) return;
  auto it = cache_index_.find(key);
  int id;
  if (it != cache_index_.end()) {
    id = it->second;
    CacheSlot& slot = cache_[id];
    if (slot.by_member == e.by_member) {  // it ran from this very slot (every member sent its id)
      slot.last_used = ++cache_clock_;
      return;
    }
  } else if (static_cast<int>(cache_.size()) < cache_capacity_) {
    id = static_cast<int>(cache_.size());
    cache_.emplace_back();
  } else {
    id = 0;
    for (int i = 1; i < static_cast<int>(cache_.size()); ++i)
      if (cache_[i].last_used < cache_[id].last_used) id = i;
    cache_index_.erase(cache_[id].key);
  }
  CacheSlot& slot = cache_[id];
  slot.key = key;
  slot.members = e.members;
  slot.used = true;
  slot.last_used = ++cache_clock_;
  slot.by_member = e.by_member;
  cache_index_[key] = id;
}

void Engine::stall_check(Clock::time_point now) {
  if (!stall_check_enabled_ || now < next_stall_check_) return;
  next_stall_check_ = now + std::chrono::seconds(1);
  std::ostringstream warning;
  int stalled = 0;
  // In name order (the table is hashed), so that a warning lists its operations the same way every time.
  std::vector<Table::value_type*> entries;
  entries.reserve(table_.size());
  for (auto& kv : table_) entries.push_back(&kv);
  std::sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (Table::value_type* entry : entries) {
    auto& kv = *entry;
    Pending& e = kv.second;
    double age = seconds_between(e.first_seen, now);
    if (e.any() == nullptr) continue;
    std::vector<int> missing, present;
    const std::set<int>& joined = joined_[kv.first.first];
    for (size_t m = 0; m < e.by_member.size(); ++m) {
      int w = e.members[m];
      if (e.by_member[m]) present.push_back(w);
      else if (joined.count(w) == 0 || e.any()->op_type == HPCDL_OP_JOIN) missing.push_back(w);
    }
    if (missing.empty()) continue;
    char age_text[32];
    std::snprintf(age_text, sizeof age_text, "%.1f", age);
    if (stall_shutdown_s_ > 0 && age >= stall_shutdown_s_) {
      aborts_to_send_.push_back(
          {kv.first.first, kv.first.second,
           "stall shutdown: " + describe(*e.any()) + " was submitted by " + ranks_text(present) + " but " +
               ranks_text(missing) + (missing.size() == 1 ? " has" : " have") + " not submitted it after " +
               age_text + " s (HPCDL_STALL_SHUTDOWN_TIME_SECONDS); it was cancelled on every rank. A rank "
               "that never submits this name is stuck or took a different code path."});
      continue;
    }
    if (age >= stall_check_s_ && seconds_between(e.last_stall_warning, now) >= stall_check_s_) {
      e.last_stall_warning = now;
      warning << "\n  " << describe(*e.any()) << ": " << ranks_text(missing) << " missing (submitted by "
              << ranks_text(present) << ", waiting " << age_text << " s)";
      ++stalled;
      if (timeline_.active())
        timeline_.instant("STALL", now, "\"tensor\":\"" + json_escape(kv.first.second) +
                                            "\",\"missing_ranks\":" + ranks_json(missing));
    }
  }
  if (stalled > 0) {
    std::fprintf(stderr,
                 "hpcdl WARNING: stall inspector (rank 0): %d operation(s) waited more than %g s because some "
                 "ranks have not submitted them:%s\nA missing rank may be stuck, have crashed, or have taken a "
                 "different code path (e.g. a layer skipped on some ranks). HPCDL_STALL_CHECK_TIME_SECONDS sets "
                 "this interval; HPCDL_STALL_SHUTDOWN_TIME_SECONDS cancels such operations.\n",
                 stalled, stall_check_s_, warning.str().c_str());
    std::fflush(stderr);
  }
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

void Engine::fail_everything(const Status& status) {
  std::vector<std::shared_ptr<EngineOp>> ops;
  for (auto& kv : table_)
    if (kv.second.local) ops.push_back(std::move(kv.second.local));
  table_.clear();
  groups_.clear();
  for (auto& op : packed_) ops.push_back(op);
  packed_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
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
  int64_t still_running = 0;
  if (failed_.code == HPCDL_ERR_SHUTDOWN) {
    for (const auto& kv : device_running_) still_running += static_cast<int64_t>(kv.second->ops.size());
  } else {
    for (const auto& kv : device_running_) ops.insert(ops.end(), kv.second->ops.begin(), kv.second->ops.end());
    device_running_.clear();
  }
  device_cv_.notify_all();
  for (auto& op : ops) {
    if (op->status.load() != HPCDL_PENDING) continue;
    op->error = failed_.message + " (" + describe(op->request) + " did not complete)";
    op->status.store(failed_.code == HPCDL_OK ? HPCDL_ERR_SHUTDOWN : failed_.code, std::memory_order_release);
  }
  names_in_use_.clear();
  unfinished_ = still_running;  // every other operation of this rank was in `ops`
  for (auto& op : ops)
    if (op->waiters > 0) op->done.notify_all();
}

}  // namespace hpcdl
