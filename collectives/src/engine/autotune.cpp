#include "engine/autotune.h"

#include <unistd.h>

#include <cmath>

#include "engine/output_file.h"

namespace hpcdl {

namespace {
std::vector<double> candidates_for(const std::string& knob) {
  constexpr double MiB = 1024.0 * 1024.0;
  if (knob == "fusion_threshold") return {1 * MiB, 4 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 128 * MiB};
  if (knob == "cycle_time_ms") return {0.0, 0.5, 1.0, 2.5, 5.0};
  return {4096, 16384, 65536, 262144};  // small_message_bytes
}
}  // namespace

double Knobs::get(const std::string& name) const {
  if (name == "fusion_threshold") return fusion_threshold;
  if (name == "cycle_time_ms") return cycle_time_ms;
  return small_message_bytes;
}

bool Knobs::plausible() const {
  auto within = [](double v, double most) { return std::isfinite(v) && v >= 0 && v <= most; };
  return within(fusion_threshold, 1e15) && within(cycle_time_ms, 60e3) && within(small_message_bytes, 1e15);
}

void Knobs::set(const std::string& name, double value) {
  if (name == "fusion_threshold") fusion_threshold = value;
  else if (name == "cycle_time_ms") cycle_time_ms = value;
  else small_message_bytes = value;
}

Autotuner::Autotuner(const Knobs& start, const std::set<std::string>& fixed, int warmup_samples,
                     int steps_per_sample)
    : current_(start),
      warmup_samples_(warmup_samples < 0 ? 0 : warmup_samples),
      steps_per_sample_(steps_per_sample < 1 ? 1 : steps_per_sample) {
  for (const char* knob : {"fusion_threshold", "cycle_time_ms", "small_message_bytes"})
    if (fixed.count(knob) == 0) knobs_.push_back(knob);
  converged_ = knobs_.empty();
  if (!converged_) begin_knob();
}

Status Autotuner::open_log(const std::string& path) {
  int fd = -1;
  Status opened = open_output_file(path, "autotune log", &fd);
  if (!opened.is_ok()) return opened;
  log_ = fdopen(fd, "w");
  if (log_ == nullptr) {
    close(fd);
    return Status::error(HPCDL_ERR_INTERNAL, "cannot write the autotune log to " + path + ": out of memory");
  }
  std::fprintf(log_, "sample,phase,fusion_threshold,cycle_time_ms,small_message_bytes,bytes,seconds,"
                     "bytes_per_second\n");
  std::fflush(log_);
  return Status::ok();
}

Autotuner::~Autotuner() {
  if (log_ != nullptr) std::fclose(log_);
}

void Autotuner::begin_knob() {
  candidates_ = candidates_for(knobs_[knob_index_]);
  candidate_index_ = 0;
  best_score_ = -1;
  best_value_ = current_.get(knobs_[knob_index_]);
}

void Autotuner::log_sample(double score) {
  if (log_ == nullptr) return;
  const char* phase = samples_ <= warmup_samples_ ? "warmup" : "tune";
  std::fprintf(log_, "%d,%s,%.0f,%g,%.0f,%lld,%.6f,%.1f\n", samples_, phase, current_.fusion_threshold,
               current_.cycle_time_ms, current_.small_message_bytes, static_cast<long long>(sample_bytes_),
               sample_seconds_, score);
  std::fflush(log_);
}

bool Autotuner::record_step(int64_t bytes, double seconds, Knobs* next) {
  if (converged_) return false;
  sample_bytes_ += bytes;
  sample_seconds_ += seconds;
  if (++steps_in_sample_ < steps_per_sample_) return false;
  ++samples_;
  double score = sample_seconds_ > 0 ? static_cast<double>(sample_bytes_) / sample_seconds_ : 0.0;
  log_sample(score);
  steps_in_sample_ = 0;
  sample_bytes_ = 0;
  sample_seconds_ = 0;
  if (samples_ <= warmup_samples_) {
    if (samples_ < warmup_samples_) return false;
    // Warm-up done: start trying the first knob's candidates.
    current_.set(knobs_[knob_index_], candidates_[0]);
    *next = current_;
    return true;
  }
  const std::string& knob = knobs_[knob_index_];
  if (score > best_score_) {
    best_score_ = score;
    best_value_ = candidates_[candidate_index_];
  }
  if (++candidate_index_ < candidates_.size()) {
    current_.set(knob, candidates_[candidate_index_]);
  } else {
    current_.set(knob, best_value_);
    if (++knob_index_ < knobs_.size()) {
      begin_knob();
      current_.set(knobs_[knob_index_], candidates_[0]);
    } else {
      converged_ = true;
      if (log_ != nullptr) {
        std::fprintf(log_, "# converged: fusion_threshold=%.0f cycle_time_ms=%g small_message_bytes=%.0f\n",
                     current_.fusion_threshold, current_.cycle_time_ms, current_.small_message_bytes);
        std::fflush(log_);
      }
    }
  }
  *next = current_;
  return true;
}

}  // namespace hpcdl
