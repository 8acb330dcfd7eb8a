// What a cycle decides, identically on every rank (see engine.h): which names are ready, whether their
// submissions agree, which run together; and the response cache, the operations' ends and the stall
// inspector.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "engine/detail.h"
#include "engine/engine.h"

namespace hpcdl {

using namespace engine_detail;

bool Engine::is_ready(const NameRecord& r) {
  const OpRequest* any = r.any();
  if (any == nullptr) return false;
  const bool is_join = any->op_type == HPCDL_OP_JOIN;
  const std::set<int>& joined = joined_[r.key.first];
  for (size_t m = 0; m < r.by_member.size(); ++m) {
    if (r.by_member[m]) continue;
    if (is_join || joined.count(r.members[m]) == 0) return false;
  }
  return true;
}

// As in Horovod, a joined rank stands in only for allreduces (it contributes zeros) and barriers; every
// other collective fails on the members that submitted it while a member has joined.
std::string Engine::join_conflict(const NameRecord& r) {
  std::vector<int> absent;
  for (size_t m = 0; m < r.by_member.size(); ++m)
    if (!r.by_member[m]) absent.push_back(r.members[m]);
  if (absent.empty()) return "";
  const OpRequest& q = *r.any();
  if (q.op_type == HPCDL_OP_ALLREDUCE || q.op_type == HPCDL_OP_BARRIER) return "";
  return describe(q) + " cannot run while " + ranks_text(absent) + (absent.size() == 1 ? " has" : " have") +
         " joined (called join()): only allreduce and barrier accept joined ranks, as in Horovod. Finish such "
         "collectives before any rank joins, or have every rank call join() first";
}

void Engine::decide_and_run(const std::vector<NameRecord*>& work) {
  std::vector<NameRecord*> ready;
  std::vector<std::pair<std::shared_ptr<EngineOp>, std::vector<int>>> still_waiting;
  for (NameRecord* w : work) {
    NameRecord& r = *w;
    if (r.held) continue;
    if (is_ready(r)) {
      ready.push_back(w);
    } else if (r.local) {
      std::vector<int> missing;
      for (size_t m = 0; m < r.by_member.size(); ++m)
        if (!r.by_member[m]) missing.push_back(r.members[m]);
      still_waiting.push_back({r.local, missing});
    }
  }
  if (!still_waiting.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& w : still_waiting) w.first->waiting_for = std::move(w.second);
  }
  std::sort(ready.begin(), ready.end(), [](const NameRecord* a, const NameRecord* b) {
    bool ja = a->any()->op_type == HPCDL_OP_JOIN, jb = b->any()->op_type == HPCDL_OP_JOIN;
    if (ja != jb) return jb;
    return a->sequence < b->sequence;
  });
  const auto now = Clock::now();
  const int64_t now_stamp = steady_ns(now);
  std::vector<NameRecord*> runnable;
  std::vector<NameRecord*> finished;  // each record listed once (NameRecord::finished)
  auto done = [&](NameRecord& r) {
    if (r.finished) return;
    r.finished = true;
    finished.push_back(&r);
  };
  auto fail_group = [&](const std::pair<int, int>& gkey, int group_size, const std::string& message) {
    auto held = groups_.find(gkey);
    int remaining = group_size - 1;
    if (held != groups_.end()) {
      for (NameRecord* r : held->second) {
        finish(*r, HPCDL_ERR_MISMATCH, message);
        done(*r);
        --remaining;
      }
      groups_.erase(held);
    }
    if (remaining > 0) failed_groups_[gkey] = message + "#" + std::to_string(remaining);
  };
  for (NameRecord* w : ready) {
    NameRecord& r = *w;
    r.decided = now;
    if (r.local) r.local->negotiated_ns.store(now_stamp, std::memory_order_relaxed);
    std::string message;
    int code = HPCDL_ERR_MISMATCH;
    // Submissions that every member made from this name's response-cache entry ran together before: they
    // agree. Anything else is compared member by member.
    if (r.from_cache != r.members.size()) {
      std::vector<const OpRequest*> requests;
      requests.reserve(r.by_member.size());
      for (const auto& q : r.by_member) requests.push_back(q.get());
      if (!validate_requests(requests, r.members, &message)) code = HPCDL_ERR_MISMATCH;
    }
    if (message.empty() && !(message = join_conflict(r)).empty()) code = HPCDL_ERR_JOINED;
    const OpRequest& any = *r.any();
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
      if (code == HPCDL_ERR_MISMATCH && dump_reason_.empty()) {
        dump_reason_ = "mismatch";
        dump_message_ = message;
      }
      record_timeline(r, "NEGOTIATE", r.first_seen, now, "\"error\":\"" + json_escape(message) + "\"");
      finish(r, code, message);
      done(r);
      continue;
    }
    if (any.group_id != 0) {
      auto& held = groups_[gkey];
      held.push_back(&r);
      r.held = true;
      if (static_cast<int>(held.size()) < any.group_size) continue;
      runnable.insert(runnable.end(), held.begin(), held.end());
      groups_.erase(gkey);
      continue;
    }
    runnable.push_back(&r);
  }
  // Pack small allreduces that can be reduced together into fusion batches; everything else runs alone.
  int64_t threshold;
  {
    std::lock_guard<std::mutex> lock(knob_mutex_);
    threshold = static_cast<int64_t>(knobs_.fusion_threshold);
  }
  struct Batch {
    std::vector<NameRecord*> members;
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
  for (NameRecord* r : runnable) {
    const OpRequest& q = *r->any();
    int64_t bytes = entry_bytes(*r);
    // Device data is packed on the device, where a copy costs far less than another collective: every
    // allreduce up to the threshold fuses.
    const bool device = q.placement == HPCDL_PLACEMENT_DEVICE;
    bool fusable = runnable.size() > 1 && q.op_type == HPCDL_OP_ALLREDUCE && threshold > 0 && bytes <= threshold &&
                   !r->all_inline() && (device || bytes <= kFuseTensorMaxBytes || fuses_large(q.process_set));
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
    for (NameRecord* r : b.members) done(*r);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.is_ok()) break;
    }
  }
  follow_skipped(finished);
  std::lock_guard<std::mutex> lock(mutex_);
  for (NameRecord* r : finished) end_round(*r);
}

// A joined rank stands in for operations it never submits. It moves its own counters past them, as if it
// had submitted them: past an unnamed operation's number, and past a grouped operation's group id, so that
// its next unnamed and grouped operations get the same names and ids as its peers' (they would otherwise
// never meet, or fail as mismatched groups).
void Engine::follow_skipped(const std::vector<NameRecord*>& finished) {
  std::vector<const NameRecord*> skipped;
  for (const NameRecord* r : finished) {
    const int me = r->key.first == 0 ? rank_ : index_of(r->members, rank_);
    if (me >= 0 && !r->by_member[me]) skipped.push_back(r);
  }
  if (skipped.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const NameRecord* r : skipped) {
    const OpRequest* request = r->any();
    if (request->group_id > 0) {
      int& last = last_group_id_[r->key.first];
      last = std::max(last, request->group_id);
    }
    const int64_t number = unnamed_number(request->op_type, r->key.second);
    if (number < 0) continue;
    int64_t& next = unnamed_counter_[{r->key.first, request->op_type}];
    next = std::max<int64_t>(next, number + 1);
  }
}

void Engine::finish(NameRecord& r, int code, const std::string& message) {
  std::shared_ptr<EngineOp> waited_on;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (r.local) waited_on = mark_finished(std::move(r.local), code, message);
  }
  if (waited_on) waited_on->done.notify_all();
}

// A batch finishes under one hold of mutex_, and its waiters wake after it: a caller that waits on the
// batch's operations one by one then finds them all done, where finishing them one at a time made it take
// turns with this thread for the lock at each wait (and, sharing a core, for the core).
void Engine::finish(const std::vector<NameRecord*>& batch, int code, const std::string& message) {
  std::vector<std::shared_ptr<EngineOp>> waited_on;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (NameRecord* r : batch)
      if (r->local)
        if (auto op = mark_finished(std::move(r->local), code, message)) waited_on.push_back(std::move(op));
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

// Under mutex_: the operation leaves PENDING. Returns it when a caller waits on it. A released handle's
// operation gives its name back now (nobody will collect it).
std::shared_ptr<EngineOp> Engine::mark_finished(std::shared_ptr<EngineOp> op, int code, const std::string& message) {
  if (code != HPCDL_OK) op->error = message;
  if (op->status.load(std::memory_order_relaxed) == HPCDL_PENDING) --unfinished_;
  op->done_ns.store(steady_ns(Clock::now()), std::memory_order_relaxed);
  op->status.store(code, std::memory_order_release);
  if (op->released) {
    flight_.retire(*op);
    NameRecord* r = op->record;
    if (r != nullptr && r->op == op) {
      op->record = nullptr;
      r->op.reset();
      free_if_idle(*r);
    }
  }
  return op->waiters > 0 ? op : nullptr;
}

// Response cache: operations that ran with every member's submission are remembered under a small id; a
// rank that submits the same thing again sends only the id. Identical on every rank (updated in the same
// order from the same data), with least-recently-used eviction (O(1)). A model with more tensors than the
// cache has entries would miss, and evict, at every tensor of every step: a name evicted for want of room
// that comes back doubles the capacity (unless the user set it), so such a model misses only while the
// cache grows. An unnamed operation's name never comes again: remembering it only evicted another (0.8 of
// an unnamed call's 3.0 us at one rank, while that eviction searched the whole cache).
void Engine::remember(NameRecord& r) {
  if (cache_capacity_ <= 0) return;
  for (const auto& q : r.by_member)
    if (!q || q->op_type == HPCDL_OP_JOIN) return;
  if (unnamed_number(r.by_member[0]->op_type, r.key.second) >= 0) return;
  if (r.cache_id >= 0 && r.cache_requests == r.by_member) {  // it ran from this very entry
    cache_used(r);
    return;
  }
  int id = r.cache_id;
  if (id < 0) {
    // After a growth there is room, so no eviction follows in this call: one look at the limit serves both.
    const bool may_grow = cache_grows_ && cache_capacity_ < kCacheGrowthLimit;
    if (may_grow && evicted_names_.count(r.key) != 0) {
      {
        std::lock_guard<std::mutex> lock(knob_mutex_);
        cache_capacity_ = std::min(2 * cache_capacity_, kCacheGrowthLimit);
      }
      evicted_.clear();  // evicted under the smaller capacity: the next growth needs evictions under this one
      evicted_names_.clear();
      if (says_choices_)
        std::fprintf(stderr,
                     "hpcdl: the response cache grew to %d entries: '%s' came back after the cache evicted it "
                     "for want of room (the job uses more named tensors than it held; HPCDL_CACHE_CAPACITY "
                     "fixes the capacity)\n",
                     cache_capacity_, r.key.second.c_str());
    }
    if (static_cast<int>(cache_.size()) < cache_capacity_) {
      id = static_cast<int>(cache_.size());
      cache_.push_back(nullptr);
    } else {
      NameRecord& evicted = *least_used_;
      if (may_grow && evicted_names_.insert(evicted.key).second) {
        evicted_.push_back(evicted.key);
        while (static_cast<int>(evicted_.size()) > kCacheGrowthLimit) {
          evicted_names_.erase(evicted_.front());
          evicted_.pop_front();
        }
      }
      id = evicted.cache_id;
      least_used_ = evicted.newer;
      if (least_used_ != nullptr) least_used_->older = nullptr;
      else most_used_ = nullptr;  // a cache of one entry
      evicted.newer = nullptr;
      std::lock_guard<std::mutex> lock(mutex_);
      evicted.cache_id = -1;
      evicted.cache_requests.clear();
      evicted.cache_members.clear();
      free_if_idle(evicted);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    r.cache_id = id;
    cache_[id] = &r;
  }
  r.cache_members = r.members;
  r.cache_requests = r.by_member;
  cache_used(r);
}

void Engine::cache_used(NameRecord& r) {
  if (most_used_ == &r) return;
  if (r.older != nullptr) r.older->newer = r.newer;
  if (r.newer != nullptr) r.newer->older = r.older;
  if (least_used_ == &r) least_used_ = r.newer;
  r.older = most_used_;
  r.newer = nullptr;
  if (most_used_ != nullptr) most_used_->newer = &r;
  most_used_ = &r;
  if (least_used_ == nullptr) least_used_ = &r;
}

// World rank 0, every second: operations some ranks submitted and others have not, for longer than the
// stall check time (a warning) or the stall shutdown time (they are cancelled on every rank). Either report
// waits for the missing ranks' own reports first (see finish_stall_report). A shutdown takes every stalled
// operation with it, also those younger than the shutdown time: ranks whose operations were cancelled
// raise and leave, so the others could only end by their departure, and would be told less.
void Engine::stall_check(Clock::time_point now) {
  if (!stall_check_enabled_ || now < next_stall_check_ || stall_report_.active) return;
  next_stall_check_ = now + std::chrono::seconds(1);
  StallReport report;
  std::ostringstream lines;
  // In name order (the table is hashed), so that a report lists its operations the same way every time.
  std::vector<NameRecord*> entries;
  for (NameRecord* r = negotiating_; r != nullptr; r = r->next_negotiating) entries.push_back(r);
  std::sort(entries.begin(), entries.end(), [](const NameRecord* a, const NameRecord* b) { return a->key < b->key; });
  struct Stalled {
    NameRecord* record;
    double age;
    std::vector<int> missing, present;
  };
  std::vector<Stalled> stalled;
  const NameRecord* shutdown_cause = nullptr;  // the first operation past the stall shutdown time
  for (NameRecord* entry : entries) {
    NameRecord& r = *entry;
    if (r.any() == nullptr) continue;
    Stalled s{entry, seconds_between(r.first_seen, now), {}, {}};
    const std::set<int>& joined = joined_[r.key.first];
    for (size_t m = 0; m < r.by_member.size(); ++m) {
      int w = r.members[m];
      if (r.by_member[m]) s.present.push_back(w);
      else if (joined.count(w) == 0 || r.any()->op_type == HPCDL_OP_JOIN) s.missing.push_back(w);
    }
    if (s.missing.empty()) continue;
    if (shutdown_cause == nullptr && stall_shutdown_s_ > 0 && s.age >= stall_shutdown_s_) shutdown_cause = entry;
    stalled.push_back(std::move(s));
  }
  for (const Stalled& s : stalled) {
    NameRecord& r = *s.record;
    const double age = s.age;
    const std::vector<int>& missing = s.missing;
    const std::vector<int>& present = s.present;
    const bool shutdown = shutdown_cause != nullptr && age >= std::min(stall_check_s_, stall_shutdown_s_);
    if (!shutdown && (age < stall_check_s_ || seconds_between(r.last_stall_warning, now) < stall_check_s_)) continue;
    char age_text[32];
    std::snprintf(age_text, sizeof age_text, "%.1f", age);
    const std::string conflict = set_conflicts(r);
    for (int m : missing)
      if (std::find(report.missing.begin(), report.missing.end(), m) == report.missing.end()) report.missing.push_back(m);
    if (shutdown) {
      report.aborts.push_back(
          {r.key.first, r.key.second,
           "stall shutdown: " + describe(*r.any()) + " was submitted by " + ranks_text(present) + " but " +
               ranks_text(missing) + (missing.size() == 1 ? " has" : " have") + " not submitted it after " +
               age_text + " s" +
               (age >= stall_shutdown_s_ ? std::string(" (HPCDL_STALL_SHUTDOWN_TIME_SECONDS)")
                                         : "; the stall shutdown of " + describe(*shutdown_cause->any()) + " ends it") +
               "; it was cancelled on every rank. A rank that never submits this name is stuck or took a "
               "different code path." +
               (conflict.empty() ? "" : "\n" + conflict)});
      continue;
    }
    r.last_stall_warning = now;
    lines << "\n  " << describe(*r.any()) << ": " << ranks_text(missing) << " missing (submitted by "
          << ranks_text(present) << ", waiting " << age_text << " s)";
    if (!conflict.empty()) lines << "\n    " << conflict;
    ++report.stalled;
    if (timeline_.active())
      timeline_.instant("STALL", now, "\"tensor\":\"" + json_escape(r.key.second) +
                                          "\",\"missing_ranks\":" + ranks_json(missing));
  }
  if (report.stalled == 0 && report.aborts.empty()) return;
  std::sort(report.missing.begin(), report.missing.end());
  report.lines = lines.str();
  report.active = true;
  report.asked_at = now;
  std::lock_guard<std::mutex> lock(mutex_);
  report.round = report_round_ + 1;  // the round of the request the next cycle sends
  request_reports(report.missing, report.aborts.empty() ? kStallWarning : kStallShutdown);
  stall_report_ = std::move(report);
}

}  // namespace hpcdl
