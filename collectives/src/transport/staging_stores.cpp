#include "transport/staging_stores.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hpcdl {

namespace {
double median(const double* values, int n) {
  double sorted[StagingStores::kRecent];
  for (int i = 0; i < n; ++i) {  // insertion sort: at most kRecent values
    int j = i;
    for (; j > 0 && sorted[j - 1] > values[i]; --j) sorted[j] = sorted[j - 1];
    sorted[j] = values[i];
  }
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}
}  // namespace

bool StagingStores::parse(const char* text, Mode* mode) {
  if (std::strcmp(text, "auto") == 0) *mode = Mode::kAuto;
  else if (std::strcmp(text, "cached") == 0) *mode = Mode::kCached;
  else if (std::strcmp(text, "streaming") == 0) *mode = Mode::kStreaming;
  else return false;
  return true;
}

void StagingStores::copy(void* dst, const void* src, size_t n) const {
  if (streaming()) stream_copy(dst, src, n);
  else line_copy(dst, src, n);
}

void StagingStores::record_chunk(double seconds, bool streamed) {
  if (mode_ != Mode::kAuto || streamed != streaming()) return;
  if (trial_left_ > 0) {
    --trial_left_;
    if (trial_left_ > kTrialChunks) return;  // a warm-up chunk, not timed
    if (trial_left_ == kTrialChunks) {         // the last warm-up chunk may show the trial lost already
      const double current = median(recent_, recent_count_);
      if (seconds > kHopeless * current) {
        trial_left_ = 0;
        keep_current(current);
      }
      return;
    }
    trial_[kTrialChunks - 1 - trial_left_] = seconds;
    if (trial_left_ == 0) end_trial();
    return;
  }
  recent_[recent_next_] = seconds;
  recent_next_ = (recent_next_ + 1) % kRecent;
  recent_count_ = std::min(recent_count_ + 1, kRecent);
  ++since_trial_;
  // The current kind got much slower than at the last trial: the machine changed state, so try the other
  // kind now rather than up to kMaxInterval chunks later.
  const bool jumped =
      since_trial_ >= kRecent && settled_cost_ > 0 && median(recent_, recent_count_) > kJump * settled_cost_;
  if ((jumped || since_trial_ >= interval_) && recent_count_ >= kTrialChunks) {
    since_trial_ = 0;
    trial_left_ = kTrialWarmup + kTrialChunks;
    ++trials_;
  }
}

void StagingStores::end_trial() {
  const double tried = median(trial_, kTrialChunks);
  const double current = median(recent_, recent_count_);
  if (tried < kSwitchBelow * current) {
    prefer_streaming_ = !prefer_streaming_;
    std::copy(trial_, trial_ + kTrialChunks, recent_);
    recent_count_ = kTrialChunks;
    recent_next_ = kTrialChunks % kRecent;
    interval_ = kFirstInterval;
    settled_cost_ = tried;
  } else {
    keep_current(current);
  }
}

void StagingStores::keep_current(double current) {
  interval_ = std::min(interval_ * 4, kMaxInterval);
  settled_cost_ = current;
}

#if defined(__x86_64__)
namespace {
__attribute__((target("avx2"))) void line_copy_avx2(char* d, const char* s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);
}
const bool kHaveAvx2 = [] {
  __builtin_cpu_init();
  return bool(__builtin_cpu_supports("avx2"));
}();
}  // namespace
#endif

void line_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  const uintptr_t skew = (reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src)) & 63;
  if (skew != 0 && n >= 4096 && kHaveAvx2) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
    std::memcpy(d, s, head);
    line_copy_avx2(d + head, s + head, n - head);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (n < 4096) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: they must land before the step is published
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace hpcdl
