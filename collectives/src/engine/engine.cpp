#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "kernels/reduce.h"

namespace hpcdl {

namespace {

constexpr size_t kSlotBytes = 512;  // fixed part of each rank's control message (one allgather when it fits)
// Allreduces at most this large are packed into the fusion buffer; larger ones run in place, because
// copying them in and out costs more than the per-operation overhead fusion saves.
constexpr int64_t kFuseTensorMaxBytes = 256 * 1024;
constexpr uint32_t kFlagShutdown = 1, kFlagKnobs = 2, kFlagAborts = 4;
constexpr uint8_t kFullRequest = 0, kCachedRequest = 1;
constexpr int64_t kInlineMaxBytes = 64;  // allreduces this small carry their data in the control message

int64_t inline_bytes(const OpRequest& r) {
  if (r.op_type != HPCDL_OP_ALLREDUCE) return 0;
  int64_t bytes = r.num_elements() * dtype_size(r.dtype);
  return bytes > 0 && bytes <= kInlineMaxBytes ? bytes : 0;
}

// A deadline already passed: wait_notify then only consumes a pending ring.
Deadline past() { return Clock::now() - std::chrono::seconds(1); }

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::set<std::string> split_commas(const std::string& text) {
  std::set<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.insert(item);
  return out;
}

std::string ranks_json(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

}  // namespace

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

namespace {
int index_of(const std::vector<int>& members, int world_rank) {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == world_rank) return static_cast<int>(i);
  return -1;
}
}  // namespace

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
                                             static_cast<int>(o.get_int("autotune_steps_per_sample", 10)),
                                             o.get("autotune_log"));
  }
  if (rank_ == 0 && !o.get("timeline").empty()) {
    Status s = timeline_.start(o.get("timeline"), o.get_bool("timeline_mark_cycles", false));
    if (!s.is_ok()) return s;
  }
  next_stall_check_ = Clock::now() + std::chrono::seconds(1);
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
  }
  if (thread_.joinable()) thread_.join();
  timeline_.stop();
}

// ---- the engine thread -------------------------------------------------------------------------------

void Engine::loop() {
  bool active = false;
  while (true) {
    if (!active) {
      if (!wait_while_idle()) break;
      active = true;
      doorbell_pending_ = true;
      first_cycle_of_burst_ = true;
      burst_start_ = Clock::now();
      burst_bytes_ = 0;
    } else {
      wait_for_batch();
    }
    CycleResult result;
    Status s = run_cycle(&result);
    if (!s.is_ok()) {
      fail_everything(s);
      break;
    }
    if (result.all_shutdown) break;
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

// Sleeps until this rank has work, a peer rang the doorbell, or a timer (stall check, shutdown deadline)
// is due. Returns false when the engine must stop.
bool Engine::wait_while_idle() {
  while (true) {
    bool shutdown_pending = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.is_ok()) return false;
      shutdown_pending = shutdown_requested_;
      bool local = !queue_.empty() || (shutdown_requested_ && !shutdown_sent_) || !aborts_to_send_.empty();
      if (local) {
        control_->notify_peers();
        return true;
      }
      waiting_ = true;
    }
    auto now = Clock::now();
    if (shutdown_pending && seconds_between(shutdown_since_, now) > timeout_s_) {
      std::lock_guard<std::mutex> lock(mutex_);
      waiting_ = false;
      failed_ = Status::error(HPCDL_ERR_TIMEOUT,
                              "hpcdl shutdown: the other ranks did not shut down within " +
                                  std::to_string(static_cast<int>(timeout_s_)) +
                                  " s; every rank must call shutdown()");
      return false;
    }
    Deadline until = now + std::chrono::seconds(1);
    if (rank_ == 0 && stall_check_enabled_ && !table_.empty()) until = std::min(until, next_stall_check_);
    // Events still in memory reach the file soon, so a trace survives the job being killed.
    if (timeline_.has_pending()) until = std::min(until, now + std::chrono::milliseconds(600));
    bool woke = control_->wait_notify(until);
    bool poked;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      poked = !waiting_;
      waiting_ = false;
    }
    // A caller rang our own doorbell (under mutex_, so it has landed): consume it now, or it would wake
    // this thread for a cycle that no peer runs.
    if (poked) control_->wait_notify(past());
    if (woke || poked) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!queue_.empty() || (shutdown_requested_ && !shutdown_sent_)) control_->notify_peers();
      return true;
    }
    if (rank_ == 0) stall_check(Clock::now());
    timeline_.flush(false);
  }
}

// In the middle of a burst that is being fused, waits up to the cycle time for more tensors.
void Engine::wait_for_batch() {
  double cycle_ms;
  int64_t threshold;
  {
    std::lock_guard<std::mutex> lock(knob_mutex_);
    cycle_ms = knobs_.cycle_time_ms;
    threshold = static_cast<int64_t>(knobs_.fusion_threshold);
  }
  if (!fused_last_cycle_ || cycle_ms <= 0 || threshold <= 0) return;
  auto until = last_cycle_start_ + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double, std::milli>(cycle_ms));
  std::unique_lock<std::mutex> lock(mutex_);
  queue_cv_.wait_until(lock, until, [&] { return queue_bytes_ >= threshold || shutdown_requested_; });
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
  last_cycle_start_ = Clock::now();
  if (timeline_.active() && timeline_.mark_cycles()) timeline_.instant("CYCLE_START", last_cycle_start_);
  std::vector<uint8_t> mine;
  pack(&mine);
  std::vector<std::vector<uint8_t>> all;
  Status s = exchange(mine, &all);
  if (!s.is_ok()) return s;
  std::set<Key> touched;
  std::set<int> join_changed;
  std::vector<Abort> aborts;
  result->all_shutdown = true;
  bool knobs_changed = false;
  for (int r = 0; r < size_; ++r) {
    bool shutdown = false;
    size_t before = touched.size() + aborts.size();
    Knobs before_knobs = knobs_;
    if (!decode(r, all[r], &shutdown, &aborts, &touched, &join_changed))
      return Status::error(HPCDL_ERR_INTERNAL,
                           "the engine received a malformed control message from rank " + std::to_string(r));
    if (!shutdown) result->all_shutdown = false;
    else if (shut_down_.insert(r).second) result->activity = true;
    if (touched.size() + aborts.size() != before) result->activity = true;
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
    table_.erase(it);
  }
  if (result->all_shutdown) return Status::ok();
  if (!shut_down_.empty()) cancel_orphaned();
  fused_last_cycle_ = false;
  std::set<Key> work = touched;
  for (int ps : join_changed)
    for (auto& kv : table_)
      if (kv.first.first == ps) work.insert(kv.first);
  if (work.empty()) return Status::ok();
  decide_and_run(work);
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

// Operations that wait for a rank that has shut down can never run: fail them now on every rank.
void Engine::cancel_orphaned() {
  for (auto it = table_.begin(); it != table_.end();) {
    Pending& e = it->second;
    std::vector<int> gone;
    for (size_t m = 0; m < e.by_member.size(); ++m)
      if (!e.by_member[m] && shut_down_.count(e.members[m])) gone.push_back(e.members[m]);
    if (gone.empty() || e.any() == nullptr) {
      ++it;
      continue;
    }
    finish(e, HPCDL_ERR_SHUTDOWN,
           describe(*e.any()) + " can never complete: " + ranks_text(gone) + (gone.size() == 1 ? " has" : " have") +
               " shut down without submitting it");
    it = table_.erase(it);
  }
}

void Engine::pack(std::vector<uint8_t>* message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& op : queue_) packed_.push_back(std::move(op));
    queue_.clear();
    queue_bytes_ = 0;
    if (shutdown_requested_ && !shutdown_sent_) {
      shutdown_sent_ = true;
      shutdown_since_ = Clock::now();
    }
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
        if (m >= 0 && m < static_cast<int>(slot.by_member.size()) && slot.by_member[m].same_as(req)) id = it->second;
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
Status Engine::exchange(const std::vector<uint8_t>& mine, std::vector<std::vector<uint8_t>>* all) {
  constexpr size_t kInline = kSlotBytes - sizeof(uint32_t);
  std::vector<uint8_t> send(kSlotBytes, 0), recv(kSlotBytes * size_);
  uint32_t len = static_cast<uint32_t>(mine.size());
  std::memcpy(send.data(), &len, sizeof len);
  std::memcpy(send.data() + sizeof len, mine.data(), std::min(mine.size(), kInline));
  std::string what = "engine negotiation";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_names_.empty()) {
      what += " (this rank waits for " + std::to_string(pending_names_.size()) + " operation(s), e.g. '" +
              pending_names_.begin()->second + "')";
    }
  }
  Status s = control_->allgatherv(send.data(), recv.data(), std::vector<int64_t>(size_, kSlotBytes), HPCDL_UINT8,
                                  deadline(), what);
  if (!s.is_ok()) return s;
  all->assign(size_, {});
  std::vector<int64_t> extra(size_, 0);
  int64_t extra_total = 0;
  for (int r = 0; r < size_; ++r) {
    uint32_t n = 0;
    std::memcpy(&n, recv.data() + r * kSlotBytes, sizeof n);
    (*all)[r].assign(recv.data() + r * kSlotBytes + sizeof n,
                     recv.data() + r * kSlotBytes + sizeof n + std::min<size_t>(n, kInline));
    if (n > kInline) extra[r] = static_cast<int64_t>(n - kInline);
    extra_total += extra[r];
  }
  if (extra_total == 0) return Status::ok();
  std::vector<uint8_t> more(static_cast<size_t>(extra_total));
  const uint8_t* tail = mine.data() + std::min(mine.size(), kInline);
  s = control_->allgatherv(tail, more.data(), extra, HPCDL_UINT8, deadline(), what);
  if (!s.is_ok()) return s;
  size_t off = 0;
  for (int r = 0; r < size_; ++r) {
    (*all)[r].insert((*all)[r].end(), more.begin() + off, more.begin() + off + extra[r]);
    off += static_cast<size_t>(extra[r]);
  }
  return Status::ok();
}

bool Engine::decode(int rank, const std::vector<uint8_t>& message, bool* shutdown, std::vector<Abort>* aborts,
                    std::set<Key>* touched, std::set<int>* join_changed) {
  ByteReader in(message.data(), message.size());
  uint32_t flags = 0, count = 0;
  if (!in.get(&flags) || !in.get(&count)) return false;
  *shutdown = (flags & kFlagShutdown) != 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t kind = 0;
    if (!in.get(&kind)) return false;
    auto request = std::make_unique<OpRequest>();
    if (kind == kCachedRequest) {
      int32_t id = -1;
      if (!in.get(&id) || id < 0 || id >= static_cast<int32_t>(cache_.size()) || !cache_[id].used) return false;
      const CacheSlot& slot = cache_[id];
      int m = index_of(slot.members, rank);
      if (m < 0 || m >= static_cast<int>(slot.by_member.size())) return false;
      *request = slot.by_member[m];
    } else if (!request->decode(in)) {
      return false;
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
    Key key{request->process_set, request->name};
    std::vector<int> members = members_of(*request);
    int m = index_of(members, rank);
    if (m < 0) return false;  // enqueue only accepts members
    auto inserted = table_.try_emplace(key);
    Pending& e = inserted.first->second;
    if (inserted.second) {
      e.sequence = sequence_++;
      e.members = std::move(members);
      e.by_member.resize(e.members.size());
      e.payload.resize(e.members.size());
      e.first_seen = last_cycle_start_;
      e.last_stall_warning = e.first_seen;
    }
    if (m >= static_cast<int>(e.by_member.size()) || e.by_member[m]) return false;  // enqueue refuses duplicates
    e.arrived.push_back(rank);
    e.last_arrival = last_cycle_start_;
    if (local) e.local = local;
    if (request->op_type == HPCDL_OP_JOIN) {
      joined_[key.first].insert(rank);
      last_joined_[key.first] = rank;
      join_changed->insert(key.first);
    }
    e.by_member[m] = std::move(request);
    e.payload[m] = std::move(payload);
    touched->insert(key);
  }
  if (flags & kFlagKnobs) {
    Knobs k;
    if (!in.get(&k.fusion_threshold) || !in.get(&k.cycle_time_ms) || !in.get(&k.small_message_bytes)) return false;
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

std::string Engine::join_conflict(const Pending& e) {
  std::vector<int> absent;
  for (size_t m = 0; m < e.by_member.size(); ++m)
    if (!e.by_member[m]) absent.push_back(e.members[m]);
  if (absent.empty()) return "";
  const OpRequest& r = *e.any();
  if (r.op_type == HPCDL_OP_ALLTOALL || r.op_type == HPCDL_OP_REDUCESCATTER)
    return describe(r) + " cannot run while " + ranks_text(absent) +
           (absent.size() == 1 ? " has" : " have") + " joined: only allreduce, allgather, broadcast and barrier "
           "accept joined ranks";
  if (r.op_type == HPCDL_OP_BROADCAST && std::find(absent.begin(), absent.end(), r.root) != absent.end())
    return describe(r) + " cannot run: its root rank " + std::to_string(r.root) + " has joined";
  return "";
}

void Engine::decide_and_run(const std::set<Key>& work) {
  std::vector<Ready> ready;
  std::vector<std::pair<std::shared_ptr<EngineOp>, std::vector<int>>> still_waiting;
  for (const Key& key : work) {
    auto it = table_.find(key);
    if (it == table_.end() || it->second.held) continue;
    if (is_ready(key, it->second)) {
      ready.push_back({key, &it->second});
    } else if (it->second.local) {
      std::vector<int> missing;
      for (size_t m = 0; m < it->second.by_member.size(); ++m)
        if (!it->second.by_member[m]) missing.push_back(it->second.members[m]);
      still_waiting.push_back({it->second.local, missing});
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
  std::vector<Key> finished;
  auto fail_group = [&](const std::pair<int, int>& gkey, int group_size, const std::string& message) {
    auto held = groups_.find(gkey);
    int remaining = group_size - 1;
    if (held != groups_.end()) {
      for (const Key& k : held->second) {
        auto it = table_.find(k);
        if (it == table_.end()) continue;
        finish(it->second, HPCDL_ERR_MISMATCH, message);
        finished.push_back(k);
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
      code = HPCDL_ERR_INVALID;
    }
    const OpRequest& any = *e.any();
    std::pair<int, int> gkey{r.key.first, any.group_id};
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
      finished.push_back(r.key);
      continue;
    }
    if (any.group_id != 0) {
      auto& held = groups_[gkey];
      held.push_back(r.key);
      e.held = true;
      if (static_cast<int>(held.size()) < any.group_size) continue;
      for (const Key& k : held) runnable.push_back({k, &table_.find(k)->second});
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
  std::map<std::tuple<int, int, int, double, double>, size_t> open;
  for (const Ready& r : runnable) {
    const OpRequest& q = *r.entry->any();
    int64_t bytes = entry_bytes(*r.entry);
    bool fusable = q.op_type == HPCDL_OP_ALLREDUCE && threshold > 0 && bytes <= kFuseTensorMaxBytes &&
                   bytes <= threshold && !r.entry->all_inline();
    if (fusable) {
      auto fkey = std::make_tuple(q.process_set, q.dtype, q.reduce_op, q.prescale, q.postscale);
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
    for (const Ready& r : b.members) finished.push_back(r.key);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.is_ok()) break;
    }
  }
  for (const Key& k : finished) {
    auto it = table_.find(k);
    if (it == table_.end()) continue;
    table_.erase(it);
  }
}

int64_t Engine::entry_bytes(const Pending& e) const {
  const OpRequest* r = e.any();
  return r ? r->num_elements() * dtype_size(r->dtype) : 0;
}

void Engine::record_timeline(const Pending& e, const char* phase, Clock::time_point begin, Clock::time_point end,
                             const std::string& args) {
  if (!timeline_.active()) return;
  const OpRequest* r = e.any();
  std::string name = r->process_set == 0 ? r->name : r->name + " [set " + std::to_string(r->process_set) + "]";
  std::string all = args;
  if (std::strcmp(phase, "NEGOTIATE") == 0) {
    all = "\"ready_ranks\":" + ranks_json(e.arrived) + (e.arrived.empty() ? "" : ",\"last_ready\":" +
          std::to_string(e.arrived.back())) + (args.empty() ? "" : "," + args);
  }
  timeline_.span(name, phase, begin, end, all);
}

void Engine::run_batch(const std::vector<Ready>& batch, bool fused) {
  const Key& first = batch.front().key;
  std::shared_ptr<Comm> data;
  if (index_of(batch.front().entry->members, rank_) >= 0)
    data = runtime_.find_comm_shared(first.first, Channel::kEngineData);
  const auto start = Clock::now();
  for (const Ready& r : batch) {
    const OpRequest& q = *r.entry->any();
    record_timeline(*r.entry, "NEGOTIATE", r.entry->first_seen, r.entry->decided,
                    "\"op\":\"" + std::string(op_type_name(q.op_type)) + "\"");
    record_timeline(*r.entry, "QUEUE", r.entry->decided, start);
  }
  Status s;
  const OpRequest& head = *batch.front().entry->any();
  if (head.op_type == HPCDL_OP_JOIN) {
    // Every rank (member or not) keeps the same joined-rank bookkeeping.
    auto it = last_joined_.find(head.process_set);
    if (batch.front().entry->local) batch.front().entry->local->join_result = it == last_joined_.end() ? -1 : it->second;
    joined_.erase(head.process_set);
  } else if (!data) {
    // Not a member of this set: nothing to run, the members do.
  } else if (!fused && batch.front().entry->all_inline()) {
    run_inline(*batch.front().entry);
    if (timeline_.active())
      record_timeline(*batch.front().entry, "ALLREDUCE", start, Clock::now(), "\"inline\":true");
  } else if (fused) {
    std::string what = std::string("allreduce of ") + std::to_string(batch.size()) + " fused tensors ('" +
                       batch.front().key.second + "', ...)";
    s = run_fused(batch, *data, what);
  } else {
    s = run_one(*batch.front().entry, *data, describe(*batch.front().entry->any()));
    if (timeline_.active() && s.is_ok())
      record_timeline(*batch.front().entry, op_type_upper(batch.front().entry->any()->op_type), start, Clock::now(),
                      "\"bytes\":" + std::to_string(entry_bytes(*batch.front().entry)));
  }
  for (const Ready& r : batch) {
    burst_bytes_ += entry_bytes(*r.entry);
    finish(*r.entry, s.code, s.message);
  }
  if (!s.is_ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.is_ok()) failed_ = s;
  } else {
    for (const Ready& r : batch) remember(r.key, *r.entry);
  }
}

Status Engine::run_one(Pending& e, Comm& c, const std::string& what) {
  const OpRequest& any = *e.any();
  const OpRequest& req = e.local ? e.local->request : any;
  EngineOp* op = e.local.get();
  const int n = static_cast<int>(e.members.size());
  const int me = index_of(e.members, rank_);
  const int dsize = dtype_size(any.dtype);
  const int64_t row = any.row_elements();
  auto scratch = [&](int64_t bytes) -> uint8_t* {
    if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(static_cast<size_t>(bytes));
    std::memset(scratch_.data(), 0, static_cast<size_t>(bytes));
    return scratch_.data();
  };
  switch (any.op_type) {
    case HPCDL_OP_ALLREDUCE: {
      int64_t count = any.num_elements();
      if (op != nullptr)
        return c.allreduce(op->input, op->output, count, any.dtype, any.reduce_op, any.prescale, any.postscale,
                           deadline(), what);
      uint8_t* buf = scratch(2 * count * dsize);  // joined: contribute zeros, discard the result
      return c.allreduce(buf, buf + count * dsize, count, any.dtype, any.reduce_op, any.prescale, any.postscale, deadline(), what);
    }
    case HPCDL_OP_ALLGATHER: {
      std::vector<int64_t> counts(n, 0);
      int64_t rows = 0;
      for (int m = 0; m < n; ++m) {
        if (!e.by_member[m]) continue;
        counts[m] = e.by_member[m]->rows() * row;
        rows += e.by_member[m]->rows();
      }
      void* out;
      if (op != nullptr) {
        op->owned_output.resize(static_cast<size_t>(rows * row * dsize));
        op->output_shape = req.shape;
        op->output_shape[0] = rows;
        out = op->owned_output.data();
      } else {
        out = scratch(rows * row * dsize);
      }
      const void* send = op != nullptr ? op->input : out;
      return c.allgatherv(send, out, counts, any.dtype, deadline(), what);
    }
    case HPCDL_OP_BROADCAST: {
      int root = index_of(e.members, any.root);
      int64_t count = any.num_elements();
      void* buf;
      if (op != nullptr) {
        if (me == root && op->output != op->input && count > 0)
          std::memcpy(op->output, op->input, static_cast<size_t>(count * dsize));
        buf = op->output;
      } else {
        buf = scratch(count * dsize);
      }
      return c.broadcast(buf, count, any.dtype, root, deadline(), what);
    }
    case HPCDL_OP_ALLTOALL: {
      std::vector<std::vector<int64_t>> splits(n);
      for (int m = 0; m < n; ++m) {
        const OpRequest& q = *e.by_member[m];
        splits[m] = q.splits.empty() ? std::vector<int64_t>(n, q.rows() / n) : q.splits;
      }
      std::vector<int64_t> send_counts(n), recv_counts(n);
      int64_t rows = 0;
      op->received_splits.assign(n, 0);
      for (int j = 0; j < n; ++j) {
        send_counts[j] = splits[me][j] * row;
        recv_counts[j] = splits[j][me] * row;
        op->received_splits[j] = splits[j][me];
        rows += splits[j][me];
      }
      op->owned_output.resize(static_cast<size_t>(rows * row * dsize));
      op->output_shape = req.shape;
      op->output_shape[0] = rows;
      return c.alltoallv(op->input, send_counts, op->owned_output.data(), recv_counts, any.dtype, deadline(), what);
    }
    case HPCDL_OP_REDUCESCATTER: {
      int64_t rows = any.rows();
      std::vector<int64_t> counts(n);
      for (int j = 0; j < n; ++j) counts[j] = (rows / n + (j < rows % n ? 1 : 0)) * row;
      return c.reducescatter(op->input, op->output, counts, any.dtype, any.reduce_op, any.prescale, any.postscale,
                             deadline(), what);
    }
    case HPCDL_OP_BARRIER:
      return c.barrier(deadline(), what);
    default:
      return Status::error(HPCDL_ERR_INTERNAL, "unknown operation type in " + what);
  }
}

void Engine::run_inline(Pending& e) {
  const OpRequest& q = *e.any();
  std::vector<const void*> sources;
  for (const auto& p : e.payload) sources.push_back(p.data());
  std::vector<uint8_t> result(e.payload.front().size());
  reduce(result.data(), sources.data(), static_cast<int>(sources.size()), q.num_elements(), q.dtype, q.reduce_op,
         q.prescale, q.postscale, static_cast<int64_t>(sources.size()));
  if (e.local) std::memcpy(e.local->output, result.data(), result.size());
}

Status Engine::run_fused(const std::vector<Ready>& batch, Comm& comm, const std::string& what) {
  const OpRequest& first = *batch.front().entry->any();
  const int dsize = dtype_size(first.dtype);
  int64_t total = 0;
  for (const Ready& r : batch) total += r.entry->any()->num_elements();
  // Separate input and output halves: an out-of-place reduction lets the data plane skip a staging copy.
  if (static_cast<int64_t>(fusion_buffer_.size()) < 2 * total * dsize)
    fusion_buffer_.resize(static_cast<size_t>(2 * total * dsize));
  uint8_t* buf = fusion_buffer_.data();
  uint8_t* reduced = buf + total * dsize;
  const auto t0 = Clock::now();
  int64_t off = 0;
  for (const Ready& r : batch) {
    size_t bytes = static_cast<size_t>(r.entry->any()->num_elements() * dsize);
    if (r.entry->local) std::memcpy(buf + off, r.entry->local->input, bytes);
    else std::memset(buf + off, 0, bytes);  // joined: contribute zeros
    off += static_cast<int64_t>(bytes);
  }
  const auto t1 = Clock::now();
  Status s = comm.allreduce(buf, reduced, total, first.dtype, first.reduce_op, first.prescale, first.postscale,
                                  deadline(), what);
  if (!s.is_ok()) return s;
  const auto t2 = Clock::now();
  off = 0;
  for (const Ready& r : batch) {
    size_t bytes = static_cast<size_t>(r.entry->any()->num_elements() * dsize);
    if (r.entry->local) std::memcpy(r.entry->local->output, reduced + off, bytes);
    off += static_cast<int64_t>(bytes);
  }
  const auto t3 = Clock::now();
  if (timeline_.active()) {
    std::string args = "\"fused_tensors\":" + std::to_string(batch.size()) +
                       ",\"fused_bytes\":" + std::to_string(total * dsize);
    for (const Ready& r : batch) {
      record_timeline(*r.entry, "MEMCPY_IN_FUSION_BUFFER", t0, t1, args);
      record_timeline(*r.entry, "ALLREDUCE", t1, t2, args);
      record_timeline(*r.entry, "MEMCPY_OUT_FUSION_BUFFER", t2, t3, args);
    }
  }
  return Status::ok();
}

void Engine::finish(Pending& e, int code, const std::string& message) {
  if (!e.local) return;
  std::shared_ptr<EngineOp> op = std::move(e.local);
  std::lock_guard<std::mutex> lock(mutex_);
  pending_names_.erase({op->request.process_set, op->request.name});
  if (code != HPCDL_OK) op->error = message;
  op->status.store(code, std::memory_order_release);
  done_cv_.notify_all();
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
  slot.by_member.clear();
  for (const auto& q : e.by_member) slot.by_member.push_back(*q);
  cache_index_[key] = id;
}

void Engine::stall_check(Clock::time_point now) {
  if (!stall_check_enabled_ || now < next_stall_check_) return;
  next_stall_check_ = now + std::chrono::seconds(1);
  std::ostringstream warning;
  int stalled = 0;
  for (auto& kv : table_) {
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
  for (auto& op : ops) {
    if (op->status.load() != HPCDL_PENDING) continue;
    op->error = failed_.message + " (" + describe(op->request) + " did not complete)";
    op->status.store(failed_.code == HPCDL_OK ? HPCDL_ERR_SHUTDOWN : failed_.code, std::memory_order_release);
  }
  pending_names_.clear();
  done_cv_.notify_all();
}

// ---- the callers' side -------------------------------------------------------------------------------

Status Engine::enqueue(const hpcdl_request& r, int64_t* handle) {
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
  ProcessSet set;
  if (!runtime_.process_set(r.process_set, &set))
    return invalid("process set " + std::to_string(r.process_set) + " does not exist; create it with "
                   "add_process_set() on every rank or pass it to init()");
  if (set.my_rank < 0)
    return invalid("rank " + std::to_string(rank_) + " is not a member of process set " +
                   std::to_string(r.process_set) + " (members: " + ranks_text(set.ranks) + ")");
  const int n = static_cast<int>(set.ranks.size());
  if (r.process_set != 0) q.members.assign(set.ranks.begin(), set.ranks.end());
  const int64_t elements = q.num_elements();
  const bool has_data = r.op_type != HPCDL_OP_BARRIER && r.op_type != HPCDL_OP_JOIN && elements > 0;
  if (has_data && r.input == nullptr) return invalid("the request has no input buffer");
  if (has_data && r.output == nullptr &&
      (r.op_type == HPCDL_OP_ALLREDUCE || r.op_type == HPCDL_OP_BROADCAST || r.op_type == HPCDL_OP_REDUCESCATTER))
    return invalid(std::string(op_type_name(r.op_type)) + " needs a caller-owned output buffer (it may equal the input)");
  if ((r.op_type == HPCDL_OP_ALLGATHER || r.op_type == HPCDL_OP_ALLTOALL || r.op_type == HPCDL_OP_REDUCESCATTER) &&
      q.shape.empty())
    return invalid(std::string(op_type_name(r.op_type)) + " needs a tensor with at least one dimension");
  if (r.op_type == HPCDL_OP_BROADCAST && std::find(set.ranks.begin(), set.ranks.end(), r.root) == set.ranks.end())
    return invalid("broadcast root " + std::to_string(r.root) + " is not a member of process set " +
                   std::to_string(r.process_set) + " (members: " + ranks_text(set.ranks) + ")");
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
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_.is_ok()) return Status::error(failed_.code, failed_.message + "; the engine accepts no more operations");
  if (shutdown_requested_) return Status::error(HPCDL_ERR_SHUTDOWN, "hpcdl is shutting down");
  if (r.name != nullptr && r.name[0] != '\0') {
    q.name = r.name;
  } else if (r.op_type == HPCDL_OP_JOIN) {
    q.name = "join";
  } else {
    int64_t k = unnamed_counter_[{r.process_set, r.op_type}]++;
    q.name = std::string(op_type_name(r.op_type)) + ".noname." + std::to_string(k);
  }
  Key key{q.process_set, q.name};
  if (pending_names_.count(key))
    return invalid("an operation named '" + q.name + "' is already pending" +
                   (q.process_set ? " in process set " + std::to_string(q.process_set) : std::string()) +
                   " on this rank; wait for it before submitting the name again, or use another name");
  op->id = next_handle_++;
  handles_[op->id] = op;
  pending_names_.insert(key);
  queue_bytes_ += elements * dtype_size(q.dtype);
  queue_.push_back(op);
  if (waiting_) {
    control_->notify_self();
    waiting_ = false;
  }
  queue_cv_.notify_one();
  *handle = op->id;
  return Status::ok();
}

std::shared_ptr<EngineOp> Engine::find(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(handle);
  return it == handles_.end() ? nullptr : it->second;
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
  auto op = find(handle);
  if (!op) return unknown_handle(handle);
  return op_status(*op);
}

Status Engine::wait(int64_t handle, double timeout_s) {
  auto op = find(handle);
  if (!op) return unknown_handle(handle);
  // The result is usually microseconds away: look a few times before sleeping.
  const auto spin_until = Clock::now() + std::chrono::microseconds(20);
  while (op->status.load(std::memory_order_acquire) == HPCDL_PENDING && Clock::now() < spin_until)
    std::this_thread::yield();
  if (op->status.load(std::memory_order_acquire) == HPCDL_PENDING) {
    double limit = timeout_s < 0 ? timeout_s_ : timeout_s;
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
    std::unique_lock<std::mutex> lock(mutex_);
    bool done = done_cv_.wait_until(lock, until, [&] { return op->status.load() != HPCDL_PENDING; });
    if (!done) {
      std::ostringstream m;
      m << "timed out after " << limit << " s waiting for " << describe(op->request);
      if (!op->waiting_for.empty()) {
        const std::vector<int>& missing = op->waiting_for;
        m << ": " << ranks_text(missing) << (missing.size() == 1 ? " has" : " have") << " not submitted it";
      } else {
        m << ": the other ranks have not all submitted it";
      }
      m << " (a rank may be stuck, slower, or have taken a different code path)";
      return Status::error(HPCDL_ERR_TIMEOUT, m.str());
    }
  }
  return op_status(*op);
}

Status Engine::output(int64_t handle, void** data, int64_t* nbytes, int64_t* shape) {
  auto op = find(handle);
  if (!op) return unknown_handle(handle);
  Status s = op_status(*op);
  if (s.code == HPCDL_PENDING) return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " has not finished yet");
  if (!s.is_ok()) return s;
  if (op->request.op_type != HPCDL_OP_ALLGATHER && op->request.op_type != HPCDL_OP_ALLTOALL)
    return Status::error(HPCDL_ERR_INVALID, describe(op->request) + " writes into the caller's output buffer; "
                                            "only allgather and alltoall have an engine-allocated output");
  if (data) *data = op->owned_output.data();
  if (nbytes) *nbytes = static_cast<int64_t>(op->owned_output.size());
  if (shape) std::copy(op->output_shape.begin(), op->output_shape.end(), shape);
  return Status::ok();
}

Status Engine::received_splits(int64_t handle, int64_t* splits, int capacity, int* count) {
  auto op = find(handle);
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
  auto op = find(handle);
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
  handles_.erase(handle);  // idempotent; a pending op stays alive inside the engine until it finishes
  return Status::ok();
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
