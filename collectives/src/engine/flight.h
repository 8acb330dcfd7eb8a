// The flight recorder: this rank's most recent submissions, in a ring of fixed size. An entry is the
// operation itself (EngineOp: its request, its state and its timestamps, the same record the engine and the
// timeline work from), so recording costs one reference per submission. Dumped as JSON (flight.rank<R>.json
// in the job's debug directory) on a stall, a timeout, a mismatch, a failure and on request; `hpcdl debug
// analyze` reads the dumps of all ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hpcdl {

struct EngineOp;

class FlightRecorder {
 public:
  void resize(size_t capacity);  // 0 disables it
  size_t capacity() const { return ring_.size(); }
  // Records a new submission and returns its number (1, 2, ...), counted even when the ring is disabled.
  uint64_t add(const std::shared_ptr<EngineOp>& op);
  // The recorded submissions, oldest first.
  std::vector<std::shared_ptr<EngineOp>> recent() const;

 private:
  std::vector<std::shared_ptr<EngineOp>> ring_;
  uint64_t count_ = 0;
};

}  // namespace hpcdl
