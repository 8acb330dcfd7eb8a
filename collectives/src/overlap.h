// Input and output buffers that overlap anywhere but exactly in place: every transport reads its input while
// it writes its output, chunk by chunk, so such a call would read bytes it already overwrote. The C API and
// the engine refuse it by name, as NumPy would have to copy to honour it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm.h"

namespace hpcdl {

inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// An error for `what` when the input overlaps the output other than starting at `in_place` (the place in
// the output where an in-place call keeps this rank's input; nullptr where the collective has none).
inline Status check_overlap(const std::string& what, const void* in, size_t in_bytes, const void* out,
                            size_t out_bytes, const void* in_place) {
  if (!ranges_overlap(in, in_bytes, out, out_bytes) || (in_place != nullptr && in == in_place)) return Status::ok();
  return Status::error(HPCDL_ERR_INVALID,
                       what + ": the output buffer overlaps the input buffer" +
                           (in_place ? " but does not hold the input exactly in place (the one overlap allowed)"
                                     : " (this collective cannot run in place)") +
                           "; pass " + (in_place ? "the same buffer, or " : "") + "buffers that do not overlap");
}

}  // namespace hpcdl
