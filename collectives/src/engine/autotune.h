// Online tuning of the engine's knobs (HPCDL_AUTOTUNE=1). Runs on world rank 0 only; the values it picks
// travel to every rank inside rank 0's control message, so all ranks switch in the same cycle.
//
// A step is one burst of engine activity (from leaving idle to going idle again: typically the gradient
// reductions of one training step). A sample is `steps_per_sample` steps; its score is bytes moved per
// second of burst time. After `warmup_samples` samples with the starting values, each tunable knob in turn
// is tried at every candidate value (one sample each) and fixed at its best; then the tuner has converged.
// Knobs the user set explicitly (init option user_set_knobs) are never changed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "comm.h"

namespace hpcdl {

struct Knobs {
  double fusion_threshold = 128.0 * 1024 * 1024;
  double cycle_time_ms = 0.0;
  double small_message_bytes = 65536;
  double get(const std::string& name) const;
  void set(const std::string& name, double value);
  // Values any rank may be told to use (finite, not negative, not beyond what a machine holds).
  bool plausible() const;
};

class Autotuner {
 public:
  Autotuner(const Knobs& start, const std::set<std::string>& fixed, int warmup_samples, int steps_per_sample);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // Writes one CSV line per sample to `path` (see engine/output_file.h).
  Status open_log(const std::string& path);

  // Records one step. Returns true when the knobs change; `next` then holds the values to use.
  bool record_step(int64_t bytes, double seconds, Knobs* next);
  bool converged() const { return converged_; }

 private:
  void begin_knob();
  void log_sample(double score);

  Knobs current_;
  std::vector<std::string> knobs_;  // tunable knobs, in tuning order
  int warmup_samples_;
  int steps_per_sample_;
  std::FILE* log_ = nullptr;
  int samples_ = 0;
  int steps_in_sample_ = 0;
  int64_t sample_bytes_ = 0;
  double sample_seconds_ = 0;
  size_t knob_index_ = 0;
  std::vector<double> candidates_;
  size_t candidate_index_ = 0;
  double best_value_ = 0, best_score_ = -1;
  bool converged_ = false;
};

}  // namespace hpcdl
