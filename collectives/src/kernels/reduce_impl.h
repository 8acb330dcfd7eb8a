// The kernel bodies, compiled twice (reduce_generic.cpp, reduce_avx2.cpp) with different target flags.
// Everything has internal linkage so the two builds never merge at link time.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hpcdl/c_api.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

constexpr int kBlock = 1024;

struct Half {
  uint16_t bits;
};
struct BHalf {
  uint16_t bits;
};

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow to inf (after rounding)
  if (absx < 0x38800000u) {                                 // subnormal or zero in half
    if (absx < 0x33000000u) return uint16_t(sign);
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;  // half subnormal q = m * 2^(e - 126)
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    uint32_t q = m >> shift;
    if (rem > halfway || (rem == halfway && (q & 1))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t rounded = absx + 0xfff + ((absx >> 13) & 1);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

// ---- load a block of T into the accumulation type A, store it back ----
template <class T, class A>
inline void load_block(A* out, const T* in, int m) {
  for (int i = 0; i < m; ++i) out[i] = A(in[i]);
}
template <class T, class A>
inline void store_block(T* out, const A* in, int m) {
  for (int i = 0; i < m; ++i) out[i] = T(in[i]);
}

template <>
inline void load_block<Half, float>(float* out, const Half* in, int m) {
  int i = 0;
#if defined(__F16C__)
  for (; i + 8 <= m; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < m; ++i) out[i] = half_to_float(in[i].bits);
}
template <>
inline void store_block<Half, float>(Half* out, const float* in, int m) {
  int i = 0;
#if defined(__F16C__)
  for (; i + 8 <= m; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < m; ++i) out[i].bits = float_to_half(in[i]);
}
template <>
inline void load_block<BHalf, float>(float* out, const BHalf* in, int m) {
  const uint16_t* src = reinterpret_cast<const uint16_t*>(in);
  uint32_t* dst = reinterpret_cast<uint32_t*>(out);
  for (int i = 0; i < m; ++i) dst[i] = uint32_t(src[i]) << 16;
}
template <>
inline void store_block<BHalf, float>(BHalf* out, const float* in, int m) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(in);
  uint16_t* dst = reinterpret_cast<uint16_t*>(out);
  for (int i = 0; i < m; ++i) {
    uint32_t x = src[i];
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    dst[i] = uint16_t((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

// ---- combine acc = acc OP x ----
template <class A>
inline void combine(A* __restrict acc, const A* __restrict x, int m, int op) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case HPCDL_SUM:
      case HPCDL_AVERAGE:
        for (int i = 0; i < m; ++i) acc[i] = A(U(acc[i]) + U(x[i]));
        break;
      case HPCDL_MIN:
        for (int i = 0; i < m; ++i) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
        break;
      case HPCDL_MAX:
        for (int i = 0; i < m; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
        break;
      default:
        for (int i = 0; i < m; ++i) acc[i] = A(U(acc[i]) * U(x[i]));
        break;
    }
  } else {
    switch (op) {
      case HPCDL_SUM:
      case HPCDL_AVERAGE:
        for (int i = 0; i < m; ++i) acc[i] += x[i];
        break;
      case HPCDL_MIN:
        for (int i = 0; i < m; ++i) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
        break;
      case HPCDL_MAX:
        for (int i = 0; i < m; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
        break;
      default:
        for (int i = 0; i < m; ++i) acc[i] *= x[i];
        break;
    }
  }
}

// Same-type, unscaled: reduce straight into dst, one L1-sized block at a time.
template <class T>
void reduce_plain(T* dst, const T* const* srcs, int nsrc, int64_t n, int op) {
  // dst may be one of the sources; when it is a later one, save its block before it is overwritten.
  int alias = -1;
  for (int j = 2; j < nsrc; ++j)
    if (srcs[j] == dst) alias = j;
  alignas(64) T saved[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    int m = int(n - base < kBlock ? n - base : kBlock);
    T* d = dst + base;
    if (nsrc == 1) {
      if (d != srcs[0] + base) std::memmove(d, srcs[0] + base, size_t(m) * sizeof(T));
      continue;
    }
    const T* a = srcs[0] + base;
    const T* b = srcs[1] + base;
    if (alias >= 0) std::memcpy(saved, d, size_t(m) * sizeof(T));
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      switch (op) {
        case HPCDL_SUM:
        case HPCDL_AVERAGE:
          for (int i = 0; i < m; ++i) d[i] = T(U(a[i]) + U(b[i]));
          break;
        case HPCDL_MIN:
          for (int i = 0; i < m; ++i) d[i] = b[i] < a[i] ? b[i] : a[i];
          break;
        case HPCDL_MAX:
          for (int i = 0; i < m; ++i) d[i] = b[i] > a[i] ? b[i] : a[i];
          break;
        default:
          for (int i = 0; i < m; ++i) d[i] = T(U(a[i]) * U(b[i]));
          break;
      }
    } else {
      switch (op) {
        case HPCDL_SUM:
        case HPCDL_AVERAGE:
          for (int i = 0; i < m; ++i) d[i] = a[i] + b[i];
          break;
        case HPCDL_MIN:
          for (int i = 0; i < m; ++i) d[i] = b[i] < a[i] ? b[i] : a[i];
          break;
        case HPCDL_MAX:
          for (int i = 0; i < m; ++i) d[i] = b[i] > a[i] ? b[i] : a[i];
          break;
        default:
          for (int i = 0; i < m; ++i) d[i] = a[i] * b[i];
          break;
      }
    }
    for (int j = 2; j < nsrc; ++j) combine<T>(d, j == alias ? saved : srcs[j] + base, m, op);
  }
}

// General path: convert into A, scale, combine, divide, scale, convert back.
template <class T, class A>
void reduce_general(T* dst, const T* const* srcs, int nsrc, int64_t n, int op, double prescale, double postscale,
                    int64_t divisor) {
  alignas(64) A acc[kBlock];
  alignas(64) A tmp[kBlock];
  const bool average = op == HPCDL_AVERAGE;
  const bool int_average = average && std::is_integral_v<A>;
  // A float average divides by the number of ranks, rounding once as t / n does; multiplying by 1/n
  // rounds differently unless n is a power of 2 (then 1/n is exact and the multiplication is cheaper).
  const bool float_divide = average && !std::is_integral_v<A> && postscale == 1.0 && (divisor & (divisor - 1)) != 0;
  double post = postscale;
  if (average && !std::is_integral_v<A> && !float_divide) post /= double(divisor);
  const A pre_a = A(prescale), post_a = A(post);
  const bool do_pre = prescale != 1.0, do_post = post != 1.0;
  for (int64_t base = 0; base < n; base += kBlock) {
    int m = int(n - base < kBlock ? n - base : kBlock);
    load_block<T, A>(acc, srcs[0] + base, m);
    if (do_pre)
      for (int i = 0; i < m; ++i) acc[i] *= pre_a;
    for (int j = 1; j < nsrc; ++j) {
      load_block<T, A>(tmp, srcs[j] + base, m);
      if (do_pre)
        for (int i = 0; i < m; ++i) tmp[i] *= pre_a;
      combine<A>(acc, tmp, m, op);
    }
    if (int_average || float_divide) {
      const A div = A(divisor);
      for (int i = 0; i < m; ++i) acc[i] /= div;
    }
    if (do_post)
      for (int i = 0; i < m; ++i) acc[i] *= post_a;
    store_block<T, A>(dst + base, acc, m);
  }
}

// float32/float64 with a final scale or division and no prescale (Horovod's default average): combines the
// sources in place of reduce_general's copies into the accumulation type, and between two ranks reduces
// and scales in one pass. The operations and their order are reduce_general's, so the result is the same
// to the bit (a sum then a product: nothing for the compiler to contract into a fused multiply-add).
template <class T>
void reduce_float_postscaled(T* dst, const T* const* srcs, int nsrc, int64_t n, int op, double postscale,
                             int64_t divisor) {
  const bool average = op == HPCDL_AVERAGE;
  const bool divide = average && postscale == 1.0 && (divisor & (divisor - 1)) != 0;
  const T post = T(average && !divide ? postscale / double(divisor) : postscale), div = T(divisor);
  alignas(64) T acc[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    const int m = int(n - base < kBlock ? n - base : kBlock);
    const T* a = srcs[0] + base;
    T* d = dst + base;
    if (nsrc == 2 && (op == HPCDL_SUM || average)) {
      const T* b = srcs[1] + base;
      if (divide)
        for (int i = 0; i < m; ++i) d[i] = (a[i] + b[i]) / div;
      else
        for (int i = 0; i < m; ++i) d[i] = (a[i] + b[i]) * post;
      continue;
    }
    // Accumulate apart from dst, which may be any of the sources.
    std::memcpy(acc, a, size_t(m) * sizeof(T));
    for (int j = 1; j < nsrc; ++j) combine<T>(acc, srcs[j] + base, m, op);
    if (divide)
      for (int i = 0; i < m; ++i) d[i] = acc[i] / div;
    else
      for (int i = 0; i < m; ++i) d[i] = acc[i] * post;
  }
}

// Integers with a scale: accumulate in double, average truncates toward zero.
template <class T>
void reduce_int_scaled(T* dst, const T* const* srcs, int nsrc, int64_t n, int op, double prescale,
                       double postscale, int64_t divisor) {
  alignas(64) double acc[kBlock];
  alignas(64) double tmp[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    int m = int(n - base < kBlock ? n - base : kBlock);
    load_block<T, double>(acc, srcs[0] + base, m);
    for (int i = 0; i < m; ++i) acc[i] *= prescale;
    for (int j = 1; j < nsrc; ++j) {
      load_block<T, double>(tmp, srcs[j] + base, m);
      for (int i = 0; i < m; ++i) tmp[i] *= prescale;
      combine<double>(acc, tmp, m, op);
    }
    if (op == HPCDL_AVERAGE)
      for (int i = 0; i < m; ++i) acc[i] = double(int64_t(acc[i] / double(divisor)));
    for (int i = 0; i < m; ++i) dst[base + i] = T(int64_t(acc[i] * postscale));
  }
}

void reduce_bool(uint8_t* dst, const uint8_t* const* srcs, int nsrc, int64_t n, int op) {
  const bool any = op == HPCDL_SUM || op == HPCDL_MAX || op == HPCDL_AVERAGE;
  for (int64_t base = 0; base < n; base += kBlock) {
    int m = int(n - base < kBlock ? n - base : kBlock);
    uint8_t* d = dst + base;
    const uint8_t* a = srcs[0] + base;
    alignas(64) uint8_t acc[kBlock];
    for (int i = 0; i < m; ++i) acc[i] = a[i] != 0;
    for (int j = 1; j < nsrc; ++j) {
      const uint8_t* b = srcs[j] + base;
      if (any)
        for (int i = 0; i < m; ++i) acc[i] = acc[i] | (b[i] != 0);
      else
        for (int i = 0; i < m; ++i) acc[i] = acc[i] & (b[i] != 0);
    }
    std::memcpy(d, acc, size_t(m));
  }
}

template <class T>
void dispatch_int(void* dst, const void* const* srcs, int nsrc, int64_t n, int op, double pre, double post,
                  int64_t divisor) {
  auto* d = static_cast<T*>(dst);
  auto s = reinterpret_cast<const T* const*>(srcs);
  if (pre != 1.0 || post != 1.0)
    reduce_int_scaled<T>(d, s, nsrc, n, op, pre, post, divisor);
  else if (op == HPCDL_AVERAGE)
    reduce_general<T, T>(d, s, nsrc, n, op, 1.0, 1.0, divisor);
  else
    reduce_plain<T>(d, s, nsrc, n, op);
}

template <class T>
void dispatch_float(void* dst, const void* const* srcs, int nsrc, int64_t n, int op, double pre, double post,
                    int64_t divisor) {
  auto* d = static_cast<T*>(dst);
  auto s = reinterpret_cast<const T* const*>(srcs);
  if (pre != 1.0)
    reduce_general<T, T>(d, s, nsrc, n, op, pre, post, divisor);
  else if (post != 1.0 || (op == HPCDL_AVERAGE && divisor != 1))
    reduce_float_postscaled<T>(d, s, nsrc, n, op, post, divisor);
  else
    reduce_plain<T>(d, s, nsrc, n, op);
}

void reduce_any(void* dst, const void* const* srcs, int nsrc, int64_t n, int dtype, int op, double pre, double post,
                int64_t divisor) {
  switch (dtype) {
    case HPCDL_UINT8: return dispatch_int<uint8_t>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_INT8: return dispatch_int<int8_t>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_INT16: return dispatch_int<int16_t>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_INT32: return dispatch_int<int32_t>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_INT64: return dispatch_int<int64_t>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_FLOAT32: return dispatch_float<float>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_FLOAT64: return dispatch_float<double>(dst, srcs, nsrc, n, op, pre, post, divisor);
    case HPCDL_FLOAT16:
      return reduce_general<Half, float>(static_cast<Half*>(dst), reinterpret_cast<const Half* const*>(srcs), nsrc,
                                         n, op, pre, post, divisor);
    case HPCDL_BFLOAT16:
      return reduce_general<BHalf, float>(static_cast<BHalf*>(dst), reinterpret_cast<const BHalf* const*>(srcs),
                                          nsrc, n, op, pre, post, divisor);
    case HPCDL_BOOL:
      return reduce_bool(static_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t* const*>(srcs), nsrc, n, op);
    default: return;
  }
}

}  // namespace
