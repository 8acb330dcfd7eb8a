#include "engine/flight.h"

#include "engine/engine.h"

namespace hpcdl {

void FlightRecorder::resize(size_t capacity) {
  ring_.assign(capacity, nullptr);
}

uint64_t FlightRecorder::add(const std::shared_ptr<EngineOp>& op) {
  ++count_;
  if (!ring_.empty()) ring_[count_ % ring_.size()] = op;
  return count_;
}

std::vector<std::shared_ptr<EngineOp>> FlightRecorder::recent() const {
  std::vector<std::shared_ptr<EngineOp>> out;
  const size_t n = ring_.size();
  for (uint64_t i = count_ >= n ? count_ - n + 1 : 1; n > 0 && i <= count_; ++i)
    if (ring_[i % n]) out.push_back(ring_[i % n]);
  return out;
}

}  // namespace hpcdl
