"""The C++ text every generated CPU kernel starts with: includes, the vector math
declarations, dtype conversions and the helpers whose semantics follow torch's
(NaN-propagating max/min, floor division and modulo of Python, shifts past the width).

Kept apart from kiln/codegen/cpp.py because it is C++, not generator logic; the
helpers are `static inline` so the compiler inlines them into vectorized loops. A helper that one
op alone calls lives in that op's row (kiln/ir/ops.py's `cpp_prelude`); PRELUDE appends them.
"""
from kiln.ir.ops import ROWS

SHARED_PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#ifdef KILN_VECTOR_MATH
// glibc's libmvec has vector versions of these; declaring them `omp declare simd`
// lets a `#pragma omp simd` loop call them on whole vectors (glibc does the same
// under -ffast-math, which kiln does not use: it would break NaN semantics).
extern "C" {
#define KILN_SIMD_MATH(name) _Pragma("omp declare simd notinbranch") float name##f(float); \
                             _Pragma("omp declare simd notinbranch") double name(double);
KILN_SIMD_MATH(sin) KILN_SIMD_MATH(cos) KILN_SIMD_MATH(tan) KILN_SIMD_MATH(exp) KILN_SIMD_MATH(log)
KILN_SIMD_MATH(asin) KILN_SIMD_MATH(acos) KILN_SIMD_MATH(atan) KILN_SIMD_MATH(sinh) KILN_SIMD_MATH(cosh)
KILN_SIMD_MATH(tanh) KILN_SIMD_MATH(asinh) KILN_SIMD_MATH(acosh) KILN_SIMD_MATH(atanh) KILN_SIMD_MATH(exp2)
KILN_SIMD_MATH(expm1) KILN_SIMD_MATH(log2) KILN_SIMD_MATH(log10) KILN_SIMD_MATH(log1p) KILN_SIMD_MATH(erf)
KILN_SIMD_MATH(erfc)
_Pragma("omp declare simd notinbranch") float powf(float, float);
_Pragma("omp declare simd notinbranch") double pow(double, double);
_Pragma("omp declare simd notinbranch") float atan2f(float, float);
_Pragma("omp declare simd notinbranch") double atan2(double, double);
_Pragma("omp declare simd notinbranch") float hypotf(float, float);
_Pragma("omp declare simd notinbranch") double hypot(double, double);
}
#endif

// bfloat16 is stored as its 16 high bits; float -> bf16 rounds to nearest even.
static inline float kiln_from_bf16(uint16_t bits) {
    uint32_t word = (uint32_t)bits << 16;
    float value;
    std::memcpy(&value, &word, 4);
    return value;
}
static inline uint16_t kiln_to_bf16(float value) {
    uint32_t word;
    std::memcpy(&word, &value, 4);
    uint16_t rounded = (uint16_t)((word + 0x7fffu + ((word >> 16) & 1u)) >> 16);
    return value != value ? (uint16_t)0x7fc0 : rounded;
}
static inline float kiln_round_bf16(float value) { return kiln_from_bf16(kiln_to_bf16(value)); }
static inline float kiln_round_f16(float value) { return (float)(_Float16)value; }

// The sign bit from the bits (GCC 12 fails on a vectorized std::signbit: "unrecognizable insn").
static inline bool kiln_signbit(float value) {
    uint32_t word;
    std::memcpy(&word, &value, 4);
    return (word >> 31) != 0;
}
static inline bool kiln_signbit(double value) {
    uint64_t word;
    std::memcpy(&word, &value, 8);
    return (word >> 63) != 0;
}
template <typename T> static inline bool kiln_signbit(T value) { return value < 0; }  // integers

// exp for float, inline and branch-free, so a simd loop computes it in registers with no call
// (libmvec's vector expf is a call per vector and was the larger half of softmax's time).
// Cody-Waite reduction x = k ln2 + r, exp(r) = 1 + r + r^2 Q(r) on |r| <= ln2/2 with Q of degree 4
// fitted for least relative error on Chebyshev nodes (3.6e-9 before rounding), then 2^k in two
// factors so that subnormal results round once and large x overflow to inf. Measured against
// exp in double over 4.4e8 floats in [-104, 89]: at most 1.01 ulp (Sleef's expf_u10, which
// eager uses, promises 1.0). NaN gives NaN, -inf 0, +inf inf.
// The clamp is a max and a min, and k's integer is read from the shifted sum's low bits rather
// than converted: softmax's exp loop has 31 instructions instead of 38 (its kernel time: see
// benchmarks/results/2026-12-02_docstring-measurements.md).
static inline float kiln_float_from_bits(int32_t bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}
static inline int32_t kiln_bits_from_float(float value) {
    int32_t bits;
    std::memcpy(&bits, &value, 4);
    return bits;
}
static inline float kiln_exp(float x) {
    float low = x > -104.0f ? x : -104.0f;
    float clamped = low < 89.0f ? low : 89.0f;
    const float shifter = 0x1.8p23f;  // adding it rounds to an integer, kept in the low mantissa bits
    float shifted = std::fma(clamped, 0x1.715476p+0f, shifter);
    float k = shifted - shifter;
    float r = std::fma(k, -0x1.62e400p-1f, clamped);  // ln2 in two parts: k * high is exact
    r = std::fma(k, -0x1.7f7d1cp-20f, r);
    float p = 0x1.687c22p-10f;
    p = std::fma(p, r, 0x1.123b8ep-7f);
    p = std::fma(p, r, 0x1.555b58p-5f);
    p = std::fma(p, r, 0x1.55548ep-3f);
    p = std::fma(p, r, 0x1.fffff8p-2f);
    p = std::fma(p, r * r, r) + 1.0f;
    int32_t exponent = kiln_bits_from_float(shifted) - 0x4B400000;  // the bits of 1.5 * 2^23
    int32_t half = exponent >> 1;
    float result = (p * kiln_float_from_bits((half + 127) << 23)) *
                   kiln_float_from_bits((exponent - half + 127) << 23);
    return x != x ? x : result;
}
static inline double kiln_exp(double x) { return std::exp(x); }

// Phi(x), the standard normal CDF, for gelu(x) = x * Phi(x). With z = -x / sqrt(2), Phi(x) =
// erfc(z) / 2, and erfc(|z|) = t P(t) exp(-z^2) with t = 1 / (1 + 0.4 |z|): one division, a
// degree-5 P fitted (minimax by Lawson's weights) for least absolute error of erfc over |z| <= 9.2
// (7e-8 with the float coefficients, evaluated in double), and kiln_exp. x >= 0 takes 1 - the tail, x < 0 the tail itself, so
// negative x has no 1 + erf(..) cancellation. Measured in float over every float in [-14, 6]:
// absolute error at most 2.5e-7, relative error at most 1.2e-5 where Phi >= 1e-3. Eager's gelu uses
// Abramowitz-Stegun 7.1.26 for erf (Inductor's too); on 1.9e7 points kiln's gelu is closer to
// float64 than eager's in max absolute error (3.8e-7 vs 1.3e-6), max error / |x| (2.5e-7 vs 3.8e-7)
// and max relative error where |gelu| > 1e-3 (2.2e-5 vs 1.0e-3). It is also quicker than libmvec's
// erf (timings: see benchmarks/results/2026-12-02_docstring-measurements.md).
static inline float kiln_normal_cdf(float x) {
    float z = x * -0x1.6a09e6p-1f;
    float a = std::fabs(z);
    float t = 1.0f / std::fma(0x1.99999ap-2f, a, 1.0f);
    float tail = 0.5f * t * std::fma(std::fma(std::fma(std::fma(std::fma(-0x1.9a21cep-3f, t, 0x1.6b15a8p-1f), t, -0x1.7bd03ep-2f), t, 0x1.df8408p-2f), t, 0x1.4b698ap-3f), t, 0x1.dafa12p-3f) * kiln_exp(-(a * a));
    return z > 0.0f ? tail : 1.0f - tail;
}
static inline double kiln_normal_cdf(double x) { return 0.5 * std::erfc(x * -0.70710678118654752440); }

template <typename T> static inline T kiln_maximum(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static inline T kiln_minimum(T a, T b) { return (a < b || a != a) ? a : b; }

// torch's sign: (0 < a) - (a < 0), so sign(NaN) is 0 (and sign of a bool is itself).
template <typename T> static inline T kiln_sign(T a) { return (T)((a > 0) - (a < 0)); }

template <typename T> static inline T kiln_remainder(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        T rest = std::fmod(a, b);
        return (rest != 0 && ((rest < 0) != (b < 0))) ? rest + b : rest;
    } else {
        if (b == 0 || b == -1) return 0;
        T rest = a % b;
        return (rest != 0 && ((rest < 0) != (b < 0))) ? (T)(rest + b) : rest;
    }
}

// Floor division as torch's div_floor_floating computes it (c10/util/generic_math.h): from the
// remainder, not floor(a / b), which rounds a / b first (floordiv(inf, 1) is NaN, as in torch).
template <typename T> static inline T kiln_floordiv(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        if (b == 0) return a / b;
        T rest = std::fmod(a, b);
        T quotient = (a - rest) / b;
        if (rest != 0 && ((b < 0) != (rest < 0))) quotient -= (T)1;
        if (quotient == 0) return std::copysign((T)0, a / b);
        T floored = std::floor(quotient);
        return quotient - floored > (T)0.5 ? floored + (T)1 : floored;
    } else {
        if (b == 0) return 0;
        if (b == -1) return (T)(-a);
        T quotient = a / b;
        return (a % b != 0 && ((a < 0) != (b < 0))) ? (T)(quotient - 1) : quotient;
    }
}

template <typename T> static inline T kiln_truncdiv(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        return std::trunc(a / b);
    } else {
        if (b == 0) return 0;
        if (b == -1) return (T)(-a);
        return (T)(a / b);
    }
}

// Integer fmod is C's %, with 0 where torch raises (x % 0) and for min % -1 (which traps).
template <typename T> static inline T kiln_fmod(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        return std::fmod(a, b);
    } else {
        if (b == 0 || (std::is_signed_v<T> && b == (T)-1)) return 0;
        return (T)(a % b);
    }
}

// Integer powers exactly, wrapping like torch's (by squaring); a negative exponent gives
// what torch's tensor ** tensor gives: 1 for 1, +-1 for -1, else 0.
template <typename T> static inline T kiln_integer_pow(T base, T exponent) {
    if constexpr (std::is_same_v<T, bool>) {
        return base || !exponent;
    } else {
        if constexpr (std::is_signed_v<T>) {
            if (exponent < 0) return base == 1 ? (T)1 : base == (T)-1 ? (T)((exponent & 1) ? -1 : 1) : (T)0;
        }
        using Unsigned = std::make_unsigned_t<T>;
        Unsigned result = 1, square = (Unsigned)base;
        for (Unsigned rest = (Unsigned)exponent; rest != 0; rest >>= 1) {
            if (rest & 1) result = (Unsigned)(result * square);
            square = (Unsigned)(square * square);
        }
        return (T)result;
    }
}

// nextafter of a bf16/fp16 value (held as a float, exactly): one step of the 16-bit format.
static inline uint16_t kiln_step_16(uint16_t bits, float a, float b) {
    if (a == 0) return (uint16_t)((b < 0 ? 0x8000u : 0u) | 1u);  // the smallest subnormal toward b
    return (uint16_t)(((a < b) == (a > 0)) ? bits + 1 : bits - 1);
}
static inline float kiln_nextafter_bf16(float a, float b) {
    if (a != a || b != b) return a + b;
    if (a == b) return b;
    return kiln_from_bf16(kiln_step_16(kiln_to_bf16(a), a, b));
}
static inline float kiln_nextafter_f16(float a, float b) {
    if (a != a || b != b) return a + b;
    if (a == b) return b;
    _Float16 half = (_Float16)a;
    uint16_t bits;
    std::memcpy(&bits, &half, 2);
    bits = kiln_step_16(bits, a, b);
    std::memcpy(&half, &bits, 2);
    return (float)half;
}

// Shifts by the width or more give 0 (left) or the sign (right), as torch's do.
template <typename T> static inline T kiln_left_shift(T a, T b) {
    using Unsigned = std::make_unsigned_t<T>;
    return (b < 0 || b >= (T)(sizeof(T) * 8)) ? (T)0 : (T)((Unsigned)a << b);
}
template <typename T> static inline T kiln_right_shift(T a, T b) {
    return (b < 0 || b >= (T)(sizeof(T) * 8)) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b);
}

// argmax/argmin: NaN wins, ties go to the first index, as in torch.
template <typename T> static inline bool kiln_arg_keep(T a, int64_t index_a, T b, int64_t index_b, bool is_max) {
    bool nan_a = a != a, nan_b = b != b;
    bool better = is_max ? (a > b) : (a < b);
    return better || (nan_a && !nan_b) || (((a == b) || (nan_a && nan_b)) && index_a < index_b);
}
"""

# After the shared helpers, the ones a single op needs, from its op-table row (kiln/ir/ops.py's `cpp_prelude`).
PRELUDE = SHARED_PRELUDE + "".join(row.cpp_prelude for row in ROWS if row.cpp_prelude)
