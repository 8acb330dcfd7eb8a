// The kernels built with -mavx2 -mfma -mf16c (see CMakeLists.txt); only called when the CPU has them.
// This file must not contain static initialisers: it is loaded on every CPU.
#include "kernels/reduce_impl.h"

namespace hpcdl {
void reduce_avx2(void* dst, const void* const* srcs, int nsrc, int64_t n, int dtype, int op, double pre,
                 double post, int64_t divisor) {
  reduce_any(dst, srcs, nsrc, n, dtype, op, pre, post, divisor);
}
}  // namespace hpcdl
