#include "engine/flight.h"

#include "engine/engine.h"

namespace hpcdl {

void FlightRecord::assign(const EngineOp& op) {
  const OpRequest& q = op.request;
  seq = op.seq;
  name.assign(q.name);
  op_type = q.op_type;
  reduce_op = q.reduce_op;
  dtype = q.dtype;
  process_set = q.process_set;
  placement = q.placement;
  shape.assign(q.shape.begin(), q.shape.end());
  bytes = q.num_elements() * dtype_size(q.dtype);
  submitted_ns = steady_ns(op.submitted);
  negotiated_ns = op.negotiated_ns.load(std::memory_order_relaxed);
  started_ns = op.started_ns.load(std::memory_order_relaxed);
  done_ns = op.done_ns.load(std::memory_order_relaxed);
  direct = op.direct.load(std::memory_order_relaxed);
  status = op.status.load(std::memory_order_acquire);
  if (status != HPCDL_OK && status != HPCDL_PENDING) error.assign(op.error);
  else error.clear();
}

const char* FlightRecord::state() const {
  if (status == HPCDL_OK) return "done";
  if (status == HPCDL_ERR_SHUTDOWN) return "cancelled";
  if (status != HPCDL_PENDING) return "failed";
  if (started_ns != 0) return "started";
  if (negotiated_ns != 0) return "negotiated";
  return "submitted";
}

void FlightRecorder::resize(size_t capacity) {
  ring_.clear();
  ring_.resize(capacity);
}

uint64_t FlightRecorder::add(const std::shared_ptr<EngineOp>& op) {
  ++count_;
  if (!ring_.empty()) {
    Slot& s = ring_[count_ % ring_.size()];
    s.live = op;
    s.record.seq = count_;
  }
  return count_;
}

void FlightRecorder::retire(const EngineOp& op) {
  if (ring_.empty()) return;
  Slot& s = ring_[op.seq % ring_.size()];
  if (s.record.seq != op.seq || !s.live) return;  // its slot went to a later submission
  s.record.assign(op);
  s.live.reset();
}

std::vector<FlightRecord> FlightRecorder::recent() const {
  std::vector<FlightRecord> out;
  const size_t n = ring_.size();
  for (uint64_t i = count_ >= n ? count_ - n + 1 : 1; n > 0 && i <= count_; ++i) {
    const Slot& s = ring_[i % n];
    if (s.record.seq != i) continue;
    if (s.live) {
      out.emplace_back();
      out.back().assign(*s.live);
    } else {
      out.push_back(s.record);
    }
  }
  return out;
}

}  // namespace hpcdl
