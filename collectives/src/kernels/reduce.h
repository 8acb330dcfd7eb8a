// Element-wise reduction kernels for every dtype of c_api.h, vectorised. The library is compiled for a
// baseline x86-64; an AVX2/F16C/FMA build of the same kernels is chosen at run time when the CPU has it.
#pragma once

#include <cstdint>
#include <string>

namespace hpcdl {

size_t dtype_bytes(int dtype);  // 0 for an unknown dtype
const char* dtype_label(int dtype);
const char* reduce_op_label(int op);
bool valid_dtype(int dtype);
bool valid_reduce_op(int op);
bool is_float_dtype(int dtype);  // float16, bfloat16, float32, float64

// dst[i] = postscale * OP_j(prescale * srcs[j][i]) over the nsrc sources, in source order. AVERAGE sums and
// then divides by `divisor` (floats: multiplies by 1/divisor; integers: truncating division). Integers
// with a scale other than 1 are computed in double; float16/bfloat16 always in float32. bool: SUM/MAX are
// logical or, MIN/PRODUCT logical and. dst may alias any source exactly (in place).
void reduce(void* dst, const void* const* srcs, int nsrc, int64_t count, int dtype, int op, double prescale,
            double postscale, int64_t divisor);

// The instruction set the kernels run with on this CPU ("avx2" or "generic").
const char* kernel_isa();

}  // namespace hpcdl
