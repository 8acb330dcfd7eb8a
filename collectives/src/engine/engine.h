// The background engine: named asynchronous operations negotiated across ranks (see c_api.h).
// Owned by the Runtime; created at the end of Runtime::init, stopped at the start of Runtime::shutdown.
//
// How a cycle works. Callers enqueue operations from any thread. In a cycle every rank packs the operations
// submitted since its last cycle into a control message (an operation seen before travels as a 4-byte
// response-cache id; an allreduce of at most 64 bytes carries its data), and the messages are all-gathered
// over the world's engine-control communicator. Every rank then holds the same information and computes the
// same decisions in the same order (a replicated coordinator): which names every member of their process
// set has submitted, whether the submissions agree, how ready allreduces are packed into fusion buffers,
// and in which order batches run on the engine-data communicators. Decisions that are not a pure function
// of the submissions (autotuned knobs, stall cancellations, stack requests) are made by one rank and travel
// in its message.
//
// Cycles on demand. Cycles are numbered alike on every rank. A rank runs a cycle when it has something to
// say (a submission, its shutdown, a stack it was asked for), when a peer rang it for that cycle, or as a
// heartbeat while it waits for an operation (kHeartbeat). A rank that starts a cycle rings its peers for it
// unless they arrive on their own within kRingAfter (Comm::ring_if_late); a ring for a cycle a rank already
// took part in is dropped, so nothing ever needs clearing and a rank with nothing to say sleeps.
//
// Who runs a cycle. The engine thread, or the caller itself: a caller that waits for an operation its
// engine has not packed yet and finds the engine idle (the cycle token free) runs the cycle on its own
// thread (the direct path: no thread hand-off, one exchange for a small allreduce, whose data rides in the
// control message). A name the response cache has agreed on travels as its id; a new one (an unnamed
// operation's allreduce.noname.<n> is new every call) travels in full, in the same single exchange.
// Whoever holds the cycle token (cycle_mutex_) runs cycles; everything marked "cycle runner" below belongs
// to the token holder.
//
// Bursts. While a caller submits back to back (a training step's gradients), the engine thread lets the
// burst finish before it packs (settle), so that the step is negotiated and fused in one cycle rather than
// in slices. The cycle time bounds how long it waits for more tensors in the middle of a burst.
#pragma once

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "comm.h"
#include "engine/autotune.h"
#include "engine/flight.h"
#include "engine/python_stacks.h"
#include "engine/request.h"
#include "engine/timeline.h"
#include "runtime.h"

namespace hpcdl {

class Runtime;
struct NameRecord;

// A submission as negotiated. Immutable once decoded, so the response cache and a round share one copy: a
// cache hit costs a reference count, not a copy of the request.
using RequestPtr = std::shared_ptr<const OpRequest>;

// One submission of a named operation by this rank: what its handle refers to, and the flight recorder's
// entry for it while it is alive (a copy of what a dump shows after: see flight.h).
// Bytes a collective writes before anything reads them (an allgather's or alltoall's result, scratch space
// cleared where it must be): unlike a std::vector<uint8_t>, resizing one does not zero it first, which wrote
// every result twice.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using ResultBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

struct EngineOp {
  int64_t id = 0;    // its handle
  uint64_t seq = 0;  // this rank's submission number (1, 2, ...): tells the ranks' submission orders apart
  OpRequest request;
  const void* input = nullptr;
  void* output = nullptr;
  // Its name's record while the operation holds the name (under Engine::mutex_; nullptr once it gave the
  // name back, after which the record may be gone).
  NameRecord* record = nullptr;
  Clock::time_point submitted;
  // When the job agreed to run it, when its collective started and ended (steady clock ns, 0: not yet).
  std::atomic<int64_t> negotiated_ns{0}, started_ns{0}, done_ns{0};
  std::atomic<bool> direct{false};  // its caller's thread ran it (the direct path), not the engine thread
  std::atomic<int> status{HPCDL_PENDING};
  // Written by the cycle runner before `status` leaves PENDING; read-only afterwards.
  std::string error;
  ResultBytes owned_output;
  bool in_offered_output = false;  // allgather, alltoall: the result went into the caller's `output`
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;
  int join_result = -1;
  int64_t tag = 0;  // HPCDL_PLACEMENT_DEVICE: the caller's id, handed to its executor
  // Under Engine::mutex_:
  bool packed = false;      // a cycle took it (its submission travels in that cycle's message)
  bool collected = false;   // its caller saw it finish (wait or poll)
  bool released = false;    // its handle was released
  std::vector<int> waiting_for;  // ranks that have not submitted it yet
  int device_stage = 0;          // device operations: 1 queued for the executor, 2 taken
  // Callers blocked in wait() on this operation: only they are woken when it finishes, so a caller waiting
  // on one of many operations is not woken by every other one.
  int waiters = 0;
  std::condition_variable done;
};

using Key = std::pair<int, std::string>;  // (process set, name)

// Everything this rank knows about one name: its own use of the name, the job's negotiation of the name's
// current round, the name's response-cache entry and the label of its collectives. The engine's one table:
// found by name at submission and in full requests, by cache id in control messages, and through its
// operation's pointer in between.
struct NameRecord {
  explicit NameRecord(Key k) : key(std::move(k)) {}
  const Key key;
  // ---- this rank's use of the name (Engine::mutex_) ----
  // Its latest submission. It holds the name (a second submission is Horovod's duplicate-name error) until it
  // finished and its caller saw that or released the handle; once it finished, an operation of another type
  // may take the name.
  std::shared_ptr<EngineOp> op;
  // ---- the job's negotiation of the current round (cycle runner; `negotiating` also under mutex_) ----
  bool negotiating = false;
  uint64_t sequence = 0;             // creation order: the order ready operations run in
  std::vector<int> members;          // world ranks of the process set
  std::vector<RequestPtr> by_member;
  // Tiny allreduces travel with their data inside the control message; when every member's data is here,
  // each rank reduces locally (same inputs, same order: the same result) and no collective runs.
  std::vector<std::vector<uint8_t>> payload;
  std::vector<int> arrived;          // world ranks in the order their submissions arrived
  size_t from_cache = 0;             // members whose submission came as this record's response-cache id
  Clock::time_point first_seen, last_arrival, decided, last_stall_warning;
  std::shared_ptr<EngineOp> local;   // this rank's own submission in this round
  bool held = false;                 // ready, waiting for the rest of its group
  bool finished = false;             // decided this cycle; the round ends with the cycle
  uint64_t listed_in_cycle = 0;      // the cycle that last listed it as work (lists each record once)
  NameRecord* prev_negotiating = nullptr;
  NameRecord* next_negotiating = nullptr;
  // ---- the response cache (cycle runner; cache_id also under mutex_) ----
  int cache_id = -1;
  std::vector<int> cache_members;
  std::vector<RequestPtr> cache_requests;  // every member's submission as it last ran
  NameRecord* older = nullptr;  // the cache's entries from least to most recently used (a list through them)
  NameRecord* newer = nullptr;
  // ---- cycle runner ----
  std::string what;  // "allreduce 'grad.w'": names its collectives in messages (built once)

  bool all_inline() const;
  const OpRequest* any() const;
};

class Engine {
 public:
  explicit Engine(Runtime& runtime);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Status start();
  void stop();

  // The engine section of c_api.h. Errors come back as a Status; handles are > 0.
  // caller_waits: the caller waits for it at once (hpcdl_run), so the engine thread is not woken for it.
  Status enqueue(const hpcdl_request& request, int64_t* handle, bool caller_waits = false);
  Status poll(int64_t handle);  // code HPCDL_PENDING while running
  Status wait(int64_t handle, double timeout_s);
  Status output(int64_t handle, void** data, int64_t* nbytes, int64_t* shape);
  Status received_splits(int64_t handle, int64_t* splits, int capacity, int* count);
  Status join_result(int64_t handle, int* rank);
  Status release(int64_t handle);
  int new_group_id(int process_set);
  Status start_timeline(const std::string& path, bool mark_cycles);
  Status stop_timeline();
  bool knob(const std::string& name, double* value) const;
  // Writes this rank's flight recorder to <debug dir>/flight.rank<R>.json (nothing without a debug directory).
  Status flight_dump(const std::string& reason, const std::string& message);
  // The device executor's side of c_api.h (hpcdl_device_*); any thread.
  Status device_next(double timeout_s, int64_t* words, int capacity, int* length);
  Status device_done(int64_t batch, int status, const std::string& message, const int64_t* times_ns);
  void device_interrupt();

 private:
  // The per-operation bookkeeping looks names up several times per cycle and rank; hashing them once
  // costs less than the string comparisons of ordered containers. Nothing the ranks must agree on
  // depends on the table's order: ready operations run in creation (sequence) order.
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<std::string>{}(k.second) ^ static_cast<size_t>(k.first); }
  };
  // Device operations decided together, handed to the caller's executor (see hpcdl_device_next).
  struct DeviceBatch {
    int64_t id = 0;
    std::vector<int64_t> words;                  // what hpcdl_device_next hands over
    std::vector<std::shared_ptr<EngineOp>> ops;  // this rank's operations in it
    std::vector<std::string> tracks;             // the timeline track of each entry
    std::vector<Clock::time_point> decided;      // when each entry was decided (a group's members differ)
    std::string what;                            // names the batch in messages
    std::vector<int> members;                    // world ranks of its process set
    int op_type = 0;
    bool fused = false;
    int64_t bytes = 0;
    Clock::time_point taken;
  };
  struct Abort {
    int process_set = 0;
    std::string name, message;
  };
  struct CycleResult {
    std::vector<int> shut_down;  // ranks that announced their shutdown in this cycle: the job is over
  };
  // A handle: the operation it refers to, and the generation that tells a live handle from a released one
  // whose slot was reused.
  struct HandleSlot {
    std::shared_ptr<EngineOp> op;
    uint32_t generation = 0;
  };
  // Why a cycle is wanted (see cycle_wanted).
  enum class Want { kNothing, kCycle, kStop };
  // Why a rank asks others for their reports (diagnose.cpp).
  enum Report : uint8_t { kStallWarning = 1, kStallShutdown = 2, kTimeout = 3 };
  // What a rank said about itself when asked: its last submissions and where its main thread is.
  struct RankReport {
    uint64_t round = 0;  // the request round it answered (see report_round_)
    std::string text;
  };
  // World rank 0's stall report, sent once the missing ranks' reports are in (or kReportWait passed).
  struct StallReport {
    bool active = false;
    int stalled = 0;
    std::string lines;
    std::vector<Abort> aborts;
    std::vector<int> missing;
    uint64_t round = 0;
    Clock::time_point asked_at;
  };

  // ---- the engine thread ----
  void loop();
  void place_thread();
  void follow_caller();
  void keep_to_own_core(bool own);
  Want idle_wait(std::unique_lock<std::mutex>& token);
  Want cycle_wanted(bool rung);  // cycle runner, under mutex_
  void yield_to_caller();
  void settle(bool burst_start);
  void wait_for_batch();
  std::pair<Clock::duration, int64_t> batching_knobs() const;
  void score_burst();
  void end_burst();
  // ---- cycles (cycle runner) ----
  bool cycle();  // one cycle and what follows it; false when the engine failed or the job ended
  Status run_cycle(CycleResult* result);
  bool pack(ByteWriter* message, Deadline* batches_due);
  Status exchange(const ByteWriter& mine, Deadline deadline);
  std::string pending_summary() const;
  bool decode(int rank, const uint8_t* message, size_t size, bool* shutdown, std::vector<Abort>* aborts,
              std::vector<NameRecord*>* work, std::set<int>* join_changed, std::string* problem);
  NameRecord* record_of(const Key& key);  // under mutex_: the name's record, made when missing
  void start_round(NameRecord& r, const OpRequest& request);
  void end_round(NameRecord& r);  // under mutex_
  void free_if_idle(NameRecord& r);  // under mutex_
  void keep_result_buffer(ResultBytes& bytes);             // under mutex_
  void reuse_result_buffer(ResultBytes& out, size_t bytes);  // under mutex_
  void drop(NameRecord& r, std::vector<NameRecord*>* work);
  void list_work(NameRecord& r, std::vector<NameRecord*>* work);
  void decide_and_run(const std::vector<NameRecord*>& work);
  bool is_ready(const NameRecord& r);
  void follow_skipped(const std::vector<NameRecord*>& finished);
  std::string join_conflict(const NameRecord& r);
  void run_batch(const std::vector<NameRecord*>& batch, bool fused);
  Status run_one(NameRecord& r, Comm& comm);
  Status place_output(EngineOp& op, int64_t rows, int64_t offered_rows, int64_t row, int dsize,
                      const std::string& what, void** out);
  Status run_fused(const std::vector<NameRecord*>& batch, Comm& comm, const std::string& what);
  void run_inline(NameRecord& r);
  void hand_to_device(const std::vector<NameRecord*>& batch, bool fused, const std::string& what);
  std::string device_failure(const DeviceBatch& batch, const std::string& message, int* code) const;
  Status overdue_device_batch(Clock::time_point now) const;  // under mutex_
  Deadline device_batches_due() const;                     // under mutex_
  void record_device_timeline(const DeviceBatch& batch, const int64_t* times_ns);
  const void* prescaled(const void* input, int64_t count, const OpRequest& request);
  void finish(NameRecord& r, int code, const std::string& message);
  void finish(const std::vector<NameRecord*>& batch, int code, const std::string& message);
  void finish(const std::vector<std::shared_ptr<EngineOp>>& ops, int code, const std::string& message);
  std::shared_ptr<EngineOp> mark_finished(std::shared_ptr<EngineOp> op, int code, const std::string& message);
  void collected(EngineOp& op);  // under mutex_: the caller saw op finish
  Status shutdown_status(const std::vector<int>& ranks) const;
  bool cached(const NameRecord& r, const OpRequest& request) const;
  void remember(NameRecord& r);
  void cache_used(NameRecord& r);  // r, a cache entry, moves to the most recently used end
  void stall_check(Clock::time_point now);
  // ---- diagnosis (diagnose.cpp) ----
  void request_reports(const std::vector<int>& ranks, Report why);  // under mutex_
  std::string rank_report();  // cycle runner: this rank's report
  std::string reports_of(const std::vector<int>& ranks, uint64_t round);  // under mutex_
  bool reports_in(const std::vector<int>& ranks, uint64_t round) const;   // under mutex_
  void finish_stall_report(Clock::time_point now);
  std::string set_conflicts(const NameRecord& r);  // cycle runner
  std::string timeout_diagnosis(const std::shared_ptr<EngineOp>& op);
  void fail_everything(const Status& status);
  bool fail_all(const Status& status);  // under mutex_
  std::vector<int> members_of(const OpRequest& request) const;
  void record_timeline(const NameRecord& r, const char* phase, Clock::time_point begin, Clock::time_point end,
                       const std::string& args = "");
  int64_t entry_bytes(const NameRecord& r) const;
  // ---- callers ----
  std::shared_ptr<EngineOp> find(int64_t handle) const;  // under mutex_
  bool try_direct(const std::shared_ptr<EngineOp>& op);
  Status wait_for(const std::shared_ptr<EngineOp>& op, double timeout_s);
  void wake_engine();  // under mutex_: the engine thread looks at its work now

  Runtime& runtime_;
  int rank_ = 0, size_ = 1;
  Comm* control_ = nullptr;
  double timeout_s_ = 60;
  Deadline deadline() const;

  // Knobs (cycle runner; knob() reads them under knob_mutex_).
  mutable std::mutex knob_mutex_;
  Knobs knobs_;
  int cache_capacity_ = 1024;
  // The response cache doubles (up to kCacheGrowthLimit) when a name it evicted comes back, unless the user
  // set its capacity: a model with more tensors than entries would otherwise miss at every tensor.
  bool cache_grows_ = true;
  bool says_choices_ = false;  // world rank 0 at log level info (hpcdl run --verbose): reports the growth
  static constexpr int kCacheGrowthLimit = 1 << 16;
  bool stall_check_enabled_ = true;
  double stall_check_s_ = 60, stall_shutdown_s_ = 0;
  std::unique_ptr<Autotuner> autotuner_;  // world rank 0 only
  bool knobs_to_send_ = false;
  Knobs knobs_next_;

  // The cycle token: whoever holds it runs cycles (the engine thread, or a caller on the direct path).
  std::mutex cycle_mutex_;

  // Shared with callers, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;  // wakes the engine thread from settle() and wait_for_batch()
  std::unordered_map<Key, NameRecord, KeyHash> names_;  // one record per name
  std::vector<HandleSlot> handles_;
  std::vector<uint32_t> free_handles_;
  std::vector<ResultBytes> spare_results_;  // released results' buffers, for the next ones (see handles.cpp)
  std::vector<std::shared_ptr<EngineOp>> queue_;  // submitted, not packed yet (submission order)
  int64_t queue_bytes_ = 0;
  Clock::time_point last_enqueue_;
  int callers_waiting_ = 0;       // callers blocked in wait() on a pending operation
  bool collecting_ = false;       // the engine thread sleeps in settle() or wait_for_batch()
  int64_t batch_wake_bytes_ = 0;  // > 0 while it sleeps in settle or wait_for_batch: wake at this many bytes
  std::map<std::pair<int, int>, int64_t> unnamed_counter_;
  std::map<int, int> last_group_id_;  // per process set
  bool waiting_ = false;  // the engine thread sleeps (idle_wait); a submission that needs it pokes it
  bool deferred_ = false;  // the queue holds operations whose caller is expected to run their cycle itself
  bool shutdown_requested_ = false;
  bool running_ = false;
  Status failed_;  // once set, the engine accepts no more work
  // A peer's shutdown failed the engine while this rank had no operation in it (see fail_everything): the
  // next submission it refuses dumps the flight recorder, as a failed operation would have.
  bool dump_on_refusal_ = false;
  int64_t unfinished_ = 0;  // operations this rank submitted that have not finished (see kHeartbeat)
  FlightRecorder flight_;   // this rank's recent submissions (see flight.h)
  // Reports: the ranks this rank asks (and why), whether it owes its own, what each rank last said.
  std::vector<int> report_request_;
  uint8_t report_why_ = 0;
  bool report_due_ = false;
  uint64_t report_round_ = 0;  // requests seen so far (every rank counts alike: they travel in cycles)
  std::map<int, RankReport> reports_;
  std::condition_variable reports_cv_;
  // Device batches: decided and waiting for the executor, and taken by it (running until it reports).
  std::deque<std::shared_ptr<DeviceBatch>> device_queue_;
  std::unordered_map<int64_t, std::shared_ptr<DeviceBatch>> device_running_;
  std::condition_variable device_cv_;  // wakes hpcdl_device_next
  bool device_interrupted_ = false;  // the next hpcdl_device_next without a batch returns at once
  int64_t next_device_batch_ = 1;

  // Cycle runner.
  std::string debug_dir_;  // where flight recorder dumps go ("": none)
  PythonStacks stacks_;
  std::string dump_reason_, dump_message_;  // a flight recorder dump this cycle asked for
  StallReport stall_report_;  // world rank 0
  bool shutdown_sent_ = false;
  uint32_t next_cycle_ = 1;  // the number of the next cycle, the same on every rank
  std::vector<std::shared_ptr<EngineOp>> packed_;
  NameRecord* negotiating_ = nullptr;  // the records with a round in progress (a list through the records)
  uint64_t sequence_ = 0;
  std::map<int, std::set<int>> joined_;  // process set -> world ranks that joined
  std::map<int, int> last_joined_;
  std::map<std::pair<int, int>, std::vector<NameRecord*>> groups_;  // (set, group id) -> ready, held back
  std::map<std::pair<int, int>, std::string> failed_groups_;
  std::vector<NameRecord*> cache_;  // response cache id -> record
  NameRecord* least_used_ = nullptr;  // the cache's use order: evicted first
  NameRecord* most_used_ = nullptr;
  // The names the cache evicted since it last grew, at most kCacheGrowthLimit of them (oldest first): a
  // name among them that is remembered again was evicted only for want of room.
  std::deque<Key> evicted_;
  std::unordered_set<Key, KeyHash> evicted_names_;
  std::vector<Abort> aborts_to_send_;
  std::vector<uint8_t> fusion_buffer_, prescaled_;
  ResultBytes scratch_;
  ByteWriter message_;                 // this rank's control message of the current cycle
  std::vector<uint8_t> slots_, extra_;  // the cycle's exchanged messages
  std::vector<size_t> message_size_;    // each rank's message length
  Clock::time_point next_stall_check_;
  bool fused_last_cycle_ = false;
  int64_t widest_pack_ = 0;  // most operations this rank packed into one cycle of the current burst
  bool bursty_ = false;      // the previous burst packed several operations into a cycle (see settle)
  bool streaming_ = false;   // the last submission came within kSettle of the one before, with no wait
                             // between them (see settle)
  bool waited_ = false;      // a caller waited since the last submission
  Clock::time_point last_cycle_start_;
  // Autotune accounting of the current burst.
  Clock::time_point burst_start_;
  int64_t burst_bytes_ = 0;

  // Engine thread only.
  std::thread thread_;
  Timeline timeline_;  // written on world rank 0 only
  bool pinned_ = false, on_own_core_ = false;
  int own_cpu_ = -1;
  cpu_set_t own_core_, all_cores_;
  std::atomic<int> caller_cpu_{-1};  // the CPU the latest enqueue ran on
};

}  // namespace hpcdl
