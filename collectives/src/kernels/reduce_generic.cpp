// The kernels built for the baseline instruction set (SSE2 on x86-64).
#include "kernels/reduce_impl.h"

namespace hpcdl {
void reduce_generic(void* dst, const void* const* srcs, int nsrc, int64_t n, int dtype, int op, double pre,
                    double post, int64_t divisor) {
  reduce_any(dst, srcs, nsrc, n, dtype, op, pre, post, divisor);
}
}  // namespace hpcdl
