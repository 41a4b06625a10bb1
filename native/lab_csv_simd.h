// The host's AVX2 row parser for the lab's CSV (host only: g++, never nvcc), chosen at run time
// (native/lab_csv_module.cpp: __builtin_cpu_supports), as the forward's kernels are; the extension is
// built for any x86-64, so these functions carry their own target attribute.
//
// A row is read in two passes. First its commas, 32 bytes at a time (a compare and a movemask), as a
// bitmap; then each field between two commas on its own, so that no field waits for the one before it
// to find its end (a field's end is the next set bit). A field in the shape of Python's repr of the
// lab's values, [-]d.ddd with 1 to 17 digits after the point, is checked and converted with vector
// loads: its 16 first fraction digits with one multiply-add ladder (10, 100, 10^4), the 17th alone,
// into w < 10^18 with the decimal exponent fixed at -17 (w is the digits padded with zeros: the same
// value), then Eisel-Lemire as every other number (kernel/lab_csv.h). Any other field, or one too near
// the end of the buffer for a 32-byte load, is the scalar code's, which keeps every rule exact.

#ifndef LAB_CSV_SIMD_H
#define LAB_CSV_SIMD_H

#if defined(__x86_64__) && !defined(__CUDACC__)
#define LAB_CSV_AVX2 1

#include <immintrin.h>
#include <stdint.h>

#include "lab_csv.h"

// BMI2's flagless shifts and LZCNT (Eisel-Lemire's normalization: one instruction, not BSR and a XOR) come with every
// AVX2 CPU (Haswell, Zen 1 on): the parse measured 1.11x (1.05..1.25) faster with them on the 2-core Zen 3 machine.
#define LAB_AVX2_TARGET __attribute__((target("avx2,bmi,bmi2,lzcnt,popcnt")))

// Rows up to this many bytes take the two passes (the input's rows are ~1,900); longer ones the scalar path.
enum { LAB_ROW_BITMAP_WORDS = 128 };

// Bit i of *bits is set where row[i] is ','; `limit` is the end of the readable buffer (a 32-byte
// load never passes it). Returns the commas counted.
LAB_AVX2_TARGET inline int lab_comma_bitmap_avx2(const char *row, long long length, const char *limit, uint64_t *bits)
{
    const __m256i comma = _mm256_set1_epi8(',');
    int commas = 0;
    for (long long at = 0, word = 0; at < length; at += 64, ++word) {
        uint64_t mask = 0;
        for (int half = 0; half < 2; ++half) {
            const char *block = row + at + 32 * half;
            __m256i v;
            if (limit - block >= 32) {
                v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(block));
            } else {  // the buffer's last bytes: copied out, the rest zeros (past the row: masked below)
                alignas(32) char tail[32] = {};
                const long long left = limit - block;
                for (long long i = 0; i < left; ++i)
                    tail[i] = block[i];
                v = _mm256_load_si256(reinterpret_cast<const __m256i *>(tail));
            }
            mask |= static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, comma)))) << (32 * half);
        }
        const long long left = length - at;
        if (left < 64)
            mask &= (1ULL << left) - 1;
        bits[word] = mask;
        commas += __builtin_popcountll(mask);
    }
    return commas;
}

// The field [begin, end) if it has repr's shape [-]d.ddd (1 to 17 digits after the point) and 32
// bytes can be loaded from its first digit: its double in *out, true. False (nothing written) for
// any other field: the caller parses it the scalar way.
LAB_AVX2_TARGET inline bool lab_repr_field_avx2(const char *begin, const char *end, const char *limit, double *out)
{
    const bool negative = *begin == '-';
    const char *s = begin + negative;
    const long long k = end - s - 2;  // digits after the point, if the shape holds
    if (k < 1 || k > 17 || limit - s < 32)
        return false;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
    const __m256i digit = _mm256_and_si256(_mm256_cmpgt_epi8(v, _mm256_set1_epi8('0' - 1)), _mm256_cmpgt_epi8(_mm256_set1_epi8('9' + 1), v));
    const uint32_t digits = static_cast<uint32_t>(_mm256_movemask_epi8(digit));
    const uint32_t wanted = ((1u << (k + 2)) - 1) & ~2u;  // s[0] and s[2 .. 2 + k) digits
    if ((digits & wanted) != wanted || s[1] != '.')
        return false;
    // The first 16 fraction digits (those past k zeroed), 2, 4, then 8 at a time.
    const __m128i iota = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m128i f = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 2)), _mm_set1_epi8('0'));
    f = _mm_and_si128(f, _mm_cmpgt_epi8(_mm_set1_epi8(static_cast<char>(k)), iota));
    f = _mm_maddubs_epi16(f, _mm_setr_epi8(10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1));
    f = _mm_madd_epi16(f, _mm_setr_epi16(100, 1, 100, 1, 100, 1, 100, 1));
    f = _mm_packus_epi32(f, f);
    f = _mm_madd_epi16(f, _mm_setr_epi16(10000, 1, 10000, 1, 10000, 1, 10000, 1));
    const uint64_t pair = static_cast<uint64_t>(_mm_cvtsi128_si64(f));
    const uint64_t sixteen = (pair & 0xFFFFFFFFULL) * 100000000ULL + (pair >> 32);
    const uint64_t seventeenth = static_cast<uint64_t>(s[18] - '0') & (0 - static_cast<uint64_t>(k == 17));
    LabDecimal d;
    d.w = static_cast<uint64_t>(s[0] - '0') * 100000000000000000ULL + sixteen * 10 + seventeenth;
    d.q = -17;
    d.negative = negative;
    d.truncated = false;
    return lab_decimal_to_double(&d, out) == LAB_FIELD_OK;  // always OK here: 10^-17 <= value < 10
}

#endif  // x86-64 host
#endif  // LAB_CSV_SIMD_H
