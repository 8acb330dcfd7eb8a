// The flight recorder: this rank's most recent submissions, in a ring of fixed size. A slot holds its
// operation (EngineOp, the record the engine and the timeline work from) while the operation is alive, and
// a copy of what a dump shows once the operation is done and its handle released: so the engine frees an
// operation as soon as nobody needs it, and a finished one costs a slot's worth of memory rather than keeping
// thousands of operations alive (each freed cold in the cache, 0.1 us a call: benchmarks/README.md). Dumped
// as JSON (flight.rank<R>.json in the job's debug directory) on a stall, a timeout, a mismatch, a failure
// and on request; `hpcdl debug analyze` reads the dumps of all ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hpcdl {

struct EngineOp;

// One submission as a dump shows it.
struct FlightRecord {
  uint64_t seq = 0;  // this rank's submission number (1, 2, ...)
  std::string name;
  int32_t op_type = 0, reduce_op = 0, dtype = 0, process_set = 0, placement = 0;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  // Steady-clock ns, 0: not yet.
  int64_t submitted_ns = 0, negotiated_ns = 0, started_ns = 0, done_ns = 0;
  bool direct = false;  // its caller's thread ran it
  int status = 0;       // hpcdl status: PENDING until it finished
  std::string error;

  void assign(const EngineOp& op);  // reuses this record's string and vector capacity
  const char* state() const;        // in the dump's words: submitted, negotiated, started, done, failed, cancelled
};

// Under the engine's mutex.
class FlightRecorder {
 public:
  void resize(size_t capacity);  // 0 disables it
  size_t capacity() const { return ring_.size(); }
  // Records a new submission and returns its number (1, 2, ...), counted even when the ring is disabled.
  uint64_t add(const std::shared_ptr<EngineOp>& op);
  // The operation is done and its handle released: its slot keeps a copy and lets the operation go.
  void retire(const EngineOp& op);
  // The recorded submissions, oldest first.
  std::vector<FlightRecord> recent() const;

 private:
  struct Slot {
    std::shared_ptr<EngineOp> live;  // until retired
    FlightRecord record;             // its copy after
  };
  std::vector<Slot> ring_;
  uint64_t count_ = 0;
};

}  // namespace hpcdl
