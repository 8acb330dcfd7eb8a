// The background engine: named asynchronous operations negotiated across ranks (see c_api.h).
// Owned by the Runtime; created at the end of Runtime::init, stopped at the start of Runtime::shutdown.
//
// How a cycle works. Callers enqueue operations from any thread; one engine thread per process runs
// cycles. In a cycle every rank packs the operations submitted since its last cycle into a control message
// (an operation seen before travels as a 4-byte response-cache id), and the messages are all-gathered over
// the world's engine-control communicator. Every rank then holds the same information and computes the
// same decisions in the same order (a replicated coordinator): which names every member of their process
// set has submitted, whether the submissions agree, how ready allreduces are packed into fusion buffers,
// and in which order batches run on the engine-data communicators. Decisions that are not a pure function
// of the submissions (autotuned knobs, stall cancellations) are made by world rank 0 and travel in its
// message.
//
// Event-driven, no cycle-time floor. A cycle in which no rank brought anything new ends the burst: every
// rank saw the same messages, so all go idle together, and an idle engine thread sleeps in wait_notify().
// A caller that enqueues while its engine is idle rings its own doorbell; that engine rings every peer's
// and starts the next cycle. Rings are only sent when leaving idle, before that cycle's message is packed,
// so each rank clears its doorbell when it packs the burst's second cycle: all of the burst's rings have
// landed by then and none for the next burst can exist yet (see clear_doorbell). A rank therefore never
// wakes for a cycle its peers will not run. Before it packs (and before it rings its peers), a rank lets
// a burst of back-to-back submissions finish (settle), so that a training step's gradients are negotiated
// and fused in one cycle rather than in slices. The cycle time bounds how long a rank in the middle of a
// burst waits for more tensors before packing.
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
#include <vector>

#include "comm.h"
#include "engine/autotune.h"
#include "engine/request.h"
#include "engine/timeline.h"
#include "runtime.h"

namespace hpcdl {

class Runtime;

// One submitted operation: what the caller's handle refers to.
struct EngineOp {
  int64_t id = 0;
  OpRequest request;
  const void* input = nullptr;
  void* output = nullptr;
  Clock::time_point submitted;
  std::atomic<int> status{HPCDL_PENDING};
  // Written by the engine thread before `status` leaves PENDING; read-only afterwards.
  std::string error;
  std::vector<uint8_t> owned_output;
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;
  int join_result = -1;
  std::vector<int> waiting_for;  // ranks that have not submitted it yet (under Engine::mutex_)
  int64_t tag = 0;               // HPCDL_PLACEMENT_DEVICE: the caller's id, handed to its executor
  int device_stage = 0;          // device operations (under Engine::mutex_): 1 queued for the executor, 2 taken
  // Callers blocked in wait() on this operation (under Engine::mutex_): only they are woken when it
  // finishes, so a caller waiting on one of many operations is not woken by every other one.
  int waiters = 0;
  std::condition_variable done;
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
  Status enqueue(const hpcdl_request& request, int64_t* handle);
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
  // The device executor's side of c_api.h (hpcdl_device_*); any thread.
  Status device_next(double timeout_s, int64_t* words, int capacity, int* length);
  Status device_done(int64_t batch, int status, const std::string& message, const int64_t* times_ns);
  void device_interrupt();

 private:
  using Key = std::pair<int, std::string>;  // (process set, name)
  // The per-operation bookkeeping looks names up several times per cycle and rank; hashing them once
  // costs less than the string comparisons of ordered containers. Nothing the ranks must agree on
  // depends on these containers' order: ready operations run in creation (sequence) order.
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<std::string>{}(k.second) ^ static_cast<size_t>(k.first); }
  };
  // A submission as negotiated. Immutable once decoded, so the response cache and the pending entries
  // share one copy: a cache hit costs a reference count, not a copy of the request.
  using RequestPtr = std::shared_ptr<const OpRequest>;

  // Everything the ranks have said about one name that has not run yet; identical on every rank.
  struct Pending {
    uint64_t sequence = 0;  // creation order: the order ready operations run in
    std::vector<int> members;  // world ranks of the process set
    std::vector<RequestPtr> by_member;
    // Tiny allreduces travel with their data inside the control message; when every member's data is
    // here, each rank reduces locally (same inputs, same order: the same result) and no collective runs.
    std::vector<std::vector<uint8_t>> payload;
    bool all_inline() const;
    std::vector<int> arrived;  // world ranks in the order their submissions arrived
    Clock::time_point first_seen, last_arrival, decided;
    std::shared_ptr<EngineOp> local;  // this rank's own submission
    size_t cached = 0;                // members whose submission came as a response-cache id
    bool held = false;                // ready, waiting for the rest of its group
    const OpRequest* any() const;
    Clock::time_point last_stall_warning;
    uint64_t listed_in_cycle = 0;  // the cycle that last listed it as work (lists each entry once)
    bool finished = false;         // decided this cycle; leaves table_ at the end of decide_and_run
  };
  struct CacheSlot {
    Key key;
    std::vector<int> members;
    std::vector<RequestPtr> by_member;
    uint64_t last_used = 0;
    bool used = false;
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
  struct Ready {
    const Key* key;  // the table's own key (entries do not move while they are in table_)
    Pending* entry;
  };
  struct CycleResult {
    bool activity = false;
    std::vector<int> shut_down;  // ranks that announced their shutdown in this cycle: the job is over
  };
  // A name this rank has submitted: from enqueue until the operation finished and its caller saw the
  // result (wait or poll found it done) or released the handle. Another submission of the name in that
  // time is refused (Horovod's duplicate-name error), so the rule does not depend on how fast the
  // engine ran the first one; once it finished, an operation of another type may take the name.
  struct NameUse {
    int64_t handle = 0;
    int32_t op_type = 0;
    bool finished = false;  // the operation finished; the name is free once its caller saw that
    bool released = false;  // the handle was released while the operation ran: free the name at finish
  };

  void loop();
  void place_thread();
  void follow_caller();
  void keep_to_own_core(bool own);
  bool wait_while_idle();
  void settle();
  void wait_for_batch();
  std::pair<Clock::duration, int64_t> batching_knobs() const;
  Status go_idle();
  void clear_doorbell();
  Status run_cycle(CycleResult* result);
  void pack(std::vector<uint8_t>* message);
  Status exchange(const std::vector<uint8_t>& mine, Deadline deadline, std::vector<std::vector<uint8_t>>* all);
  std::string pending_summary() const;
  // Reads one rank's control message into the table; false when it is malformed or asks for something
  // no rank could run (`problem` then says what, when it can).
  bool decode(int rank, const std::vector<uint8_t>& message, bool* shutdown, std::vector<Abort>* aborts,
              std::vector<Ready>* work, std::set<int>* join_changed, std::string* problem);
  using Table = std::unordered_map<Key, Pending, KeyHash>;
  Table::iterator drop(Table::iterator it, std::vector<Ready>* work);
  void list_work(const Key& key, Pending& entry, std::vector<Ready>* work);
  void decide_and_run(const std::vector<Ready>& work);
  bool is_ready(const Key& key, const Pending& entry);
  void follow_skipped(const std::vector<const Key*>& finished);
  std::string join_conflict(const Pending& entry);
  void run_batch(const std::vector<Ready>& batch, bool fused);
  Status run_one(Pending& entry, Comm& comm, const std::string& what);
  Status run_fused(const std::vector<Ready>& batch, Comm& comm, const std::string& what);
  void run_inline(Pending& entry);
  void hand_to_device(const std::vector<Ready>& batch, bool fused, const std::string& what);
  std::string device_failure(const DeviceBatch& batch, const std::string& message, int* code) const;
  Status overdue_device_batch(Clock::time_point now) const;  // under mutex_
  void record_device_timeline(const DeviceBatch& batch, const int64_t* times_ns);
  const void* prescaled(const void* input, int64_t count, const OpRequest& request);
  void finish(Pending& entry, int code, const std::string& message);
  void finish(const std::vector<Ready>& batch, int code, const std::string& message);
  std::shared_ptr<EngineOp> mark_finished(Pending& entry, int code, const std::string& message);
  std::shared_ptr<EngineOp> mark_finished(std::shared_ptr<EngineOp> op, int code, const std::string& message);
  void finish(const std::vector<std::shared_ptr<EngineOp>>& ops, int code, const std::string& message);
  void collected(const EngineOp& op);  // under mutex_: the caller saw op finish (see NameUse)
  Status shutdown_status(const std::vector<int>& ranks) const;
  void remember(const Key& key, const Pending& entry);
  void stall_check(Clock::time_point now);
  void fail_everything(const Status& status);
  std::vector<int> members_of(const OpRequest& request) const;
  std::shared_ptr<EngineOp> find(int64_t handle) const;
  void record_timeline(const Pending& entry, const char* phase, Clock::time_point begin, Clock::time_point end,
                       const std::string& args = "");
  int64_t entry_bytes(const Pending& entry) const;

  Runtime& runtime_;
  int rank_ = 0, size_ = 1;
  Comm* control_ = nullptr;
  double timeout_s_ = 60;
  Deadline deadline() const;

  // Knobs (engine thread; knob() reads them through atomics-free copies under mutex_).
  mutable std::mutex knob_mutex_;
  Knobs knobs_;
  int cache_capacity_ = 1024;
  bool stall_check_enabled_ = true;
  double stall_check_s_ = 60, stall_shutdown_s_ = 0;
  std::unique_ptr<Autotuner> autotuner_;  // world rank 0 only
  bool knobs_to_send_ = false;
  Knobs knobs_next_;

  // Shared with callers, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;  // wakes the engine thread from settle() and wait_for_batch()
  std::vector<std::shared_ptr<EngineOp>> queue_;
  int64_t queue_bytes_ = 0;
  Clock::time_point last_enqueue_;
  int callers_waiting_ = 0;       // callers blocked in wait() on a pending operation
  bool collecting_ = false;       // the engine thread sleeps in settle() or wait_for_batch()
  int64_t batch_wake_bytes_ = 0;  // > 0 while it sleeps in settle or wait_for_batch: wake at this many bytes
  std::unordered_map<int64_t, std::shared_ptr<EngineOp>> handles_;
  std::unordered_map<Key, NameUse, KeyHash> names_in_use_;
  std::map<std::pair<int, int>, int64_t> unnamed_counter_;
  std::map<int, int> last_group_id_;  // per process set
  int64_t next_handle_ = 1;
  bool waiting_ = false;  // the engine thread sleeps in wait_notify; enqueue rings the doorbell
  bool shutdown_requested_ = false;
  bool running_ = false;
  Status failed_;  // once set, the engine accepts no more work
  int64_t unfinished_ = 0;  // operations this rank submitted that have not finished (see kHeartbeat)
  // Device batches: decided and waiting for the executor, and taken by it (running until it reports).
  std::deque<std::shared_ptr<DeviceBatch>> device_queue_;
  std::unordered_map<int64_t, std::shared_ptr<DeviceBatch>> device_running_;
  std::condition_variable device_cv_;  // wakes hpcdl_device_next
  bool device_interrupted_ = false;  // the next hpcdl_device_next without a batch returns at once
  int64_t next_device_batch_ = 1;

  // Engine thread only.
  std::thread thread_;
  bool shutdown_sent_ = false;
  std::vector<std::shared_ptr<EngineOp>> packed_;
  Table table_;
  uint64_t sequence_ = 0;
  uint64_t cycle_ = 0;  // cycles run so far
  std::map<int, std::set<int>> joined_;  // process set -> world ranks that joined
  std::map<int, int> last_joined_;
  std::map<std::pair<int, int>, std::vector<Key>> groups_;  // (set, group id) -> ready members held back
  std::map<std::pair<int, int>, std::string> failed_groups_;
  std::vector<CacheSlot> cache_;
  std::unordered_map<Key, int, KeyHash> cache_index_;
  uint64_t cache_clock_ = 0;
  std::vector<Abort> aborts_to_send_;
  std::vector<uint8_t> fusion_buffer_, scratch_, prescaled_;
  Clock::time_point next_stall_check_;
  bool fused_last_cycle_ = false;
  int64_t widest_pack_ = 0;  // most operations this rank packed into one cycle of the current burst
  bool bursty_ = false;      // the previous burst packed several operations into a cycle (see settle)
  bool doorbell_pending_ = false;      // rings of this burst's first cycle not yet cleared
  bool first_cycle_of_burst_ = false;
  Clock::time_point last_cycle_start_;
  // Autotune accounting of the current burst.
  Clock::time_point burst_start_;
  int64_t burst_bytes_ = 0;

  Timeline timeline_;  // written on world rank 0 only
  bool pinned_ = false, on_own_core_ = false;
  int own_cpu_ = -1;
  cpu_set_t own_core_, all_cores_;
  std::atomic<int> caller_cpu_{-1};  // the CPU the latest enqueue ran on
};

}  // namespace hpcdl
