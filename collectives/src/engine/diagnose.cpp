// What the engine says when something goes wrong: where the ranks others wait for are (their reports: what
// their engine last submitted, their main thread's Python stack), rank 0's stall report, the diagnosis of a
// timeout, and the flight recorder's dump (the format of the job's debug directory, read by `hpcdl debug
// analyze`).
//
// Reports travel in the cycles. A rank that needs them (rank 0's stall inspector, a caller whose wait timed
// out) names the ranks in its next control message; each named rank takes its own stack on its engine's
// thread (see python_stacks.h) and sends its report in the cycle after; every rank keeps the latest report of
// each rank. Every rank that sees a request also dumps its flight recorder, so that the job's debug
// directory holds every rank's recent history of the moment.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include "engine/detail.h"
#include "engine/engine.h"
#include "engine/output_file.h"

namespace hpcdl {

using namespace engine_detail;

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A steady-clock time (ns since its epoch) as wall-clock seconds, "null" for none.
std::string wall_json(int64_t steady_ns, int64_t steady_now_ns, double wall_now) {
  if (steady_ns == 0) return "null";
  char text[40];
  std::snprintf(text, sizeof text, "%.6f", wall_now - static_cast<double>(steady_now_ns - steady_ns) * 1e-9);
  return text;
}

std::string seconds_ago(int64_t steady, int64_t now) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s ago", static_cast<double>(now - steady) * 1e-9);
  return text;
}

}  // namespace

// Under mutex_: the next cycle asks `ranks` for their reports.
void Engine::request_reports(const std::vector<int>& ranks, Report why) {
  for (int r : ranks)
    if (std::find(report_request_.begin(), report_request_.end(), r) == report_request_.end())
      report_request_.push_back(r);
  report_why_ = std::max<uint8_t>(report_why_, why);
  wake_engine();
}

// Cycle runner: what this rank says about itself when asked.
std::string Engine::rank_report() {
  std::ostringstream out;
  const int64_t now = steady_ns(Clock::now());
  std::vector<FlightRecord> recent;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recent = flight_.recent();
  }
  if (recent.empty()) {
    out << "its engine has no submission on record";
  } else {
    out << "its engine last submitted ";
    int shown = 0;
    for (auto it = recent.rbegin(); it != recent.rend() && shown < 3; ++it, ++shown) {
      const FlightRecord& op = *it;
      // When it reached the state it is in.
      int64_t at = op.done_ns;
      if (at == 0) at = op.started_ns;
      if (at == 0) at = op.negotiated_ns;
      if (at == 0) at = op.submitted_ns;
      out << (shown ? "; before that " : "") << describe(op.op_type, op.name, op.process_set) << " (" << op.state()
          << " " << seconds_ago(at, now);
      out << ")";
    }
  }
  const std::string stack = stacks_.main_thread(kReportFrames);
  if (stack.empty()) out << "\n    (its Python stack is not available)";
  else out << "\n    its main thread, innermost frame first:\n" << stack;
  std::string text = out.str();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// Under mutex_: whether every one of `ranks` has answered a request of round `round` or a later one.
bool Engine::reports_in(const std::vector<int>& ranks, uint64_t round) const {
  for (int r : ranks) {
    auto it = reports_.find(r);
    if (it == reports_.end() || it->second.round < round) return false;
  }
  return true;
}

// Under mutex_: the reports of `ranks`, one paragraph each.
std::string Engine::reports_of(const std::vector<int>& ranks, uint64_t round) {
  std::ostringstream out;
  const std::vector<PeerInfo>& peers = runtime_.peers();
  for (int r : ranks) {
    out << "\n  rank " << r;
    if (r < static_cast<int>(peers.size())) out << " (host " << peers[r].host << ", pid " << peers[r].pid << ")";
    auto it = reports_.find(r);
    if (it == reports_.end() || it->second.round < round)
      out << ": did not answer within " << kReportWait.count() << " s (its engine may be stuck or gone)";
    else
      out << ": " << it->second.text;
  }
  return out.str();
}

// Cycle runner: when a missing rank submitted the name in another process set, the sets differ.
std::string Engine::set_conflicts(const NameRecord& r) {
  std::vector<std::pair<int, std::vector<int>>> sets;  // (process set, ranks that submitted it there)
  std::lock_guard<std::mutex> lock(mutex_);
  for (int id : runtime_.process_set_ids()) {
    if (id == r.key.first) continue;
    auto it = names_.find({id, r.key.second});
    if (it == names_.end() || !it->second.negotiating || it->second.arrived.empty()) continue;
    std::vector<int> there;
    for (int w : it->second.arrived)
      if (std::find(r.arrived.begin(), r.arrived.end(), w) == r.arrived.end()) there.push_back(w);
    if (!there.empty()) sets.push_back({id, there});
  }
  if (sets.empty()) return "";
  std::string text = "mismatched process set for " + std::string(op_type_name(r.any()->op_type)) + " '" +
                     r.key.second + "': process set " + std::to_string(r.key.first) + " on " +
                     rank_ranges(r.arrived);
  for (const auto& [id, ranks] : sets) text += ", process set " + std::to_string(id) + " on " + rank_ranges(ranks);
  return text;
}

// Rank 0: the stall report is sent once the missing ranks' reports are in, or kReportWait passed.
void Engine::finish_stall_report(Clock::time_point now) {
  StallReport& s = stall_report_;
  if (!s.active) return;
  std::string where;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reports_in(s.missing, s.round) && now < s.asked_at + kReportWait) return;
    where = reports_of(s.missing, s.round);
  }
  s.active = false;
  const std::string dumps =
      debug_dir_.empty() ? "" : "\nEvery rank's flight recorder: " + debug_dir_ + "/flight.rank<R>.json";
  if (!s.aborts.empty()) {
    for (Abort& a : s.aborts) a.message += "\nWhere the missing ranks are:" + where + dumps;
    aborts_to_send_.insert(aborts_to_send_.end(), s.aborts.begin(), s.aborts.end());
  }
  if (s.stalled > 0) {
    std::fprintf(stderr,
                 "hpcdl WARNING: stall inspector (rank 0): %d operation(s) waited more than %g s because some "
                 "ranks have not submitted them:%s\nWhere the missing ranks are:%s\nA missing rank may be stuck, "
                 "have crashed, or have taken a different code path (e.g. a layer skipped on some ranks). "
                 "HPCDL_STALL_CHECK_TIME_SECONDS sets this interval; HPCDL_STALL_SHUTDOWN_TIME_SECONDS cancels "
                 "such operations.%s\n",
                 s.stalled, stall_check_s_, s.lines.c_str(), where.c_str(), dumps.c_str());
    std::fflush(stderr);
  }
  s = StallReport();
}

// A caller whose wait timed out: why, in more words than "rank 1 has not submitted it". Reads the
// negotiation when it can take the cycle token soon, and waits up to kReportWait for the missing ranks'
// reports.
std::string Engine::timeout_diagnosis(const std::shared_ptr<EngineOp>& op) {
  std::string text;
  std::vector<int> missing;
  {
    std::unique_lock<std::mutex> token(cycle_mutex_, std::defer_lock);
    for (const auto until = Clock::now() + std::chrono::milliseconds(200); !token.try_lock() && Clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool runner = token.owns_lock();
    NameRecord* r = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      missing = op->waiting_for;
      // A pending operation holds its name: its record is alive, and with the token its round is still.
      if (runner && op->status.load() == HPCDL_PENDING && op->record != nullptr && op->record->negotiating &&
          op->record->any() != nullptr)
        r = op->record;
    }
    const std::string conflict = r != nullptr ? set_conflicts(*r) : "";
    if (!conflict.empty()) text += "\n" + conflict;
  }
  if (missing.empty()) return text;
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t round = report_round_ + 1;  // the round of the request the next cycle sends
  request_reports(missing, kTimeout);
  reports_cv_.wait_for(lock, kReportWait, [&] { return reports_in(missing, round) || !failed_.is_ok(); });
  text += "\nWhere the missing ranks are:" + reports_of(missing, round);
  if (!debug_dir_.empty()) text += "\nEvery rank's flight recorder: " + debug_dir_ + "/flight.rank<R>.json";
  return text;
}

Status Engine::flight_dump(const std::string& reason, const std::string& message) {
  if (debug_dir_.empty() || flight_.capacity() == 0) return Status::ok();
  std::vector<FlightRecord> ops;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ops = flight_.recent();
  }
  // Python stacks only where a rank may be stuck (a stall, a timeout, a request). faulthandler reads every
  // thread's frames while those threads run on, which can crash a process whose threads are busy: on a
  // mismatch or a failure the ops and the error already say what happened, and the process goes on to raise.
  const bool stuck = reason != "mismatch" && reason != "error";
  const std::string stack = stuck ? stacks_.all_threads() : "";
  const double wall_now = wall_seconds();
  const int64_t now = steady_ns(Clock::now());
  std::ostringstream out;
  const std::vector<PeerInfo>& peers = runtime_.peers();
  char time_text[40];
  std::snprintf(time_text, sizeof time_text, "%.6f", wall_now);
  out << "{\"version\": 1, \"rank\": " << rank_ << ", \"size\": " << size_ << ", \"host\": \""
      << json_escape(rank_ < static_cast<int>(peers.size()) ? peers[rank_].host : "") << "\", \"pid\": " << getpid()
      << ", \"time\": " << time_text << ", \"reason\": \"" << json_escape(reason) << "\", \"message\": \""
      << json_escape(message) << "\",\n \"process_sets\": {";
  bool first = true;
  for (int id : runtime_.process_set_ids()) {
    ProcessSet set;
    if (!runtime_.process_set(id, &set)) continue;
    out << (first ? "" : ", ") << "\"" << id << "\": " << ranks_json(set.ranks);
    first = false;
  }
  out << "},\n \"ops\": [";
  first = true;
  for (const FlightRecord& op : ops) {
    const bool reduces = op.op_type == HPCDL_OP_ALLREDUCE || op.op_type == HPCDL_OP_REDUCESCATTER;
    std::string shape = "[";
    for (size_t i = 0; i < op.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(op.shape[i]);
    shape += "]";
    out << (first ? "\n  " : ",\n  ") << "{\"seq\": " << op.seq << ", \"name\": \"" << json_escape(op.name)
        << "\", \"op\": \"" << op_type_name(op.op_type) << "\", \"reduce\": "
        << (reduces ? "\"" + std::string(reduce_op_name(op.reduce_op)) + "\"" : std::string("null"))
        << ", \"dtype\": \"" << dtype_name(op.dtype) << "\", \"shape\": " << shape << ", \"bytes\": " << op.bytes
        << ", \"process_set\": " << op.process_set << ", \"device\": \""
        << (op.placement == HPCDL_PLACEMENT_DEVICE ? "gpu" : "cpu") << "\", \"state\": \"" << op.state()
        << "\", \"submitted\": " << wall_json(op.submitted_ns, now, wall_now)
        << ", \"negotiated\": " << wall_json(op.negotiated_ns, now, wall_now)
        << ", \"started\": " << wall_json(op.started_ns, now, wall_now)
        << ", \"done\": " << wall_json(op.done_ns, now, wall_now)
        << ", \"direct\": " << (op.direct ? "true" : "false") << ", \"error\": "
        << (op.status != HPCDL_OK && op.status != HPCDL_PENDING ? "\"" + json_escape(op.error) + "\""
                                                                : std::string("null"))
        << "}";
    first = false;
  }
  out << "\n ],\n \"stack\": " << (stack.empty() ? std::string("null") : "\"" + json_escape(stack) + "\"") << "}\n";
  const std::string text = out.str();
  const std::string path = debug_dir_ + "/flight.rank" + std::to_string(rank_) + ".json";
  int fd = -1;
  Status s = open_output_file(path, "flight recorder dump", &fd);
  if (!s.is_ok()) return s;
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  if (written != text.size()) return Status::error(HPCDL_ERR_INTERNAL, "could not write all of " + path);
  return Status::ok();
}

}  // namespace hpcdl
