#include "kernels/reduce.h"

#include "hpcdl/c_api.h"

namespace hpcdl {

void reduce_generic(void* dst, const void* const* srcs, int nsrc, int64_t n, int dtype, int op, double pre,
                    double post, int64_t divisor);
#if defined(HPCDL_HAVE_AVX2_KERNELS)
void reduce_avx2(void* dst, const void* const* srcs, int nsrc, int64_t n, int dtype, int op, double pre,
                 double post, int64_t divisor);
#endif

namespace {

using ReduceFn = void (*)(void*, const void* const*, int, int64_t, int, int, double, double, int64_t);

bool cpu_has_avx2() {
#if defined(HPCDL_HAVE_AVX2_KERNELS)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

ReduceFn pick() {
#if defined(HPCDL_HAVE_AVX2_KERNELS)
  if (cpu_has_avx2()) return reduce_avx2;
#endif
  return reduce_generic;
}

const ReduceFn kReduce = pick();

}  // namespace

size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case HPCDL_UINT8:
    case HPCDL_INT8:
    case HPCDL_BOOL: return 1;
    case HPCDL_INT16:
    case HPCDL_FLOAT16:
    case HPCDL_BFLOAT16: return 2;
    case HPCDL_INT32:
    case HPCDL_FLOAT32: return 4;
    case HPCDL_INT64:
    case HPCDL_FLOAT64: return 8;
    default: return 0;
  }
}

const char* dtype_label(int dtype) {
  static const char* names[] = {"uint8",   "int8",     "int16",   "int32",   "int64",
                                "float16", "bfloat16", "float32", "float64", "bool"};
  return dtype >= 0 && dtype <= 9 ? names[dtype] : "unknown dtype";
}

const char* reduce_op_label(int op) {
  static const char* names[] = {"sum", "average", "min", "max", "product"};
  return op >= 0 && op <= 4 ? names[op] : "unknown op";
}

bool valid_dtype(int dtype) { return dtype_bytes(dtype) != 0; }
bool is_float_dtype(int dtype) {
  return dtype == HPCDL_FLOAT16 || dtype == HPCDL_BFLOAT16 || dtype == HPCDL_FLOAT32 || dtype == HPCDL_FLOAT64;
}
bool valid_reduce_op(int op) { return op >= HPCDL_SUM && op <= HPCDL_PRODUCT; }

void reduce(void* dst, const void* const* srcs, int nsrc, int64_t count, int dtype, int op, double prescale,
            double postscale, int64_t divisor) {
  if (count <= 0 || nsrc <= 0) return;
  kReduce(dst, srcs, nsrc, count, dtype, op, prescale, postscale, divisor < 1 ? 1 : divisor);
}

const char* kernel_isa() { return kReduce == reduce_generic ? "generic" : "avx2"; }

}  // namespace hpcdl
