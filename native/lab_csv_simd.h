// The host's vector row parsers for the lab's CSV, AVX2 and AVX-512 (host only: g++, never nvcc), chosen at run time
// (native/lab_csv_row.h: __builtin_cpu_supports), as the forward's kernels are; the extension is built for any
// x86-64, so these functions carry their own target attribute.
//
// AVX2.
// A row is read in two passes. First its commas, 32 bytes at a time (a compare and a movemask), as a
// bitmap; then each field between two commas on its own, so that no field waits for the one before it
// to find its end (a field's end is the next set bit). A field in the shape of Python's repr of the
// lab's values, [-]d.ddd with 1 to 17 digits after the point, is checked and converted with vector
// loads: its 16 first fraction digits with one multiply-add ladder (10, 100, 10^4), the 17th alone,
// into w < 10^18 with the decimal exponent fixed at -17 (w is the digits padded with zeros: the same
// value), then Eisel-Lemire as every other number (kernel/lab_csv.h). Any other field, or one too near
// the end of the buffer for a 32-byte load, is the scalar code's, which keeps every rule exact.
//
// AVX-512. A row is classified whole first (lab_repr_row_avx512); where every field has repr's shape, the fields are
// converted eight at a time, an element each (lab_repr_fields8_avx512): the same ladder on four fields a register, and
// Eisel-Lemire for q = -17 in the elements, the high 64 bits of its product from 32-bit products (an element that needs more
// is left). What it leaves goes the scalar way.

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

// GCC 12 takes the undefined elements AVX-512's intrinsics start from for uninitialized values (a false alarm, once they
// are inlined); the row parser that inlines these functions silences it too.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// AVX-512 (F, BW, VL, DQ, CD): eight fields converted at once, each element a field, as lab_repr_field_avx2 converts one.
// A byte compare gives a 64-bit mask, and a masked load reads nothing past the bytes it keeps.
#define LAB_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx2,bmi,bmi2,lzcnt,popcnt")))

// Whether the row [row, row + length) is fields of repr's shape [-]d.d... (a digit, the point, at least one digit; how
// many is the conversion's check), each byte classified 64 at a time (digit, comma, point, minus) and the shape checked
// on the four bitmaps at once, a bit a byte, shifted across words by the carries; it stops at the first word that
// breaks it. commas: their bitmap. The commas counted, or -1 where a byte or a field is of any other shape (the caller
// then reads the row field by field).
LAB_AVX512_TARGET inline int lab_repr_row_avx512(const char *row, long long length, uint64_t *commas)
{
    const __m512i comma = _mm512_set1_epi8(','), point = _mm512_set1_epi8('.'), minus = _mm512_set1_epi8('-');
    const __m512i zero = _mm512_set1_epi8('0'), nine = _mm512_set1_epi8(9);
    // Bit 63 of the word before of each: its comma (1 at first: the row's first byte starts a field), minus sign,
    // digit before a point, and point, each moving the bit after it into this word.
    uint64_t comma_in = 1, minus_in = 0, first_in = 0, point_in = 0;
    int count = 0;
    for (long long at = 0, word = 0; at < length; at += 64, ++word) {
        const long long left = length - at;
        const uint64_t live = left >= 64 ? ~0ULL : _bzhi_u64(~0ULL, static_cast<unsigned>(left));
        const __m512i v = _mm512_maskz_loadu_epi8(live, row + at);
        const uint64_t c = _mm512_cmpeq_epi8_mask(v, comma), d = _mm512_cmpeq_epi8_mask(v, point);
        const uint64_t m = _mm512_cmpeq_epi8_mask(v, minus);
        const uint64_t g = _mm512_mask_cmple_epu8_mask(live, _mm512_sub_epi8(v, zero), nine);
        const uint64_t starts = (c << 1) | comma_in;
        const uint64_t first = (starts & ~m) | (m << 1) | minus_in;  // each field's digit before the point
        const uint64_t bad = ((g | c | d | m) ^ live)           // a byte of another kind
                             | (m & ~starts)                    // a minus sign not at a field's start
                             | (first & ~g)                     // no digit before the point (the point's check implies it too)
                             | (d ^ ((first << 1) | first_in))  // a point anywhere but right after that digit
                             | (((d << 1) | point_in) & ~g);    // no digit after the point
        if (bad != 0)  // not this shape: the caller reads the row another way (a file of other shapes pays one word a row)
            return -1;
        comma_in = c >> 63, minus_in = m >> 63, first_in = first >> 63, point_in = d >> 63;
        commas[word] = c;
        count += __builtin_popcountll(c);
    }
    // The row's last byte a comma, a minus sign, a digit before a point or a point.
    return comma_in | minus_in | first_in | point_in ? -1 : count;
}

// The high 64 bits of each element's a * b (unsigned), from four 32 x 32-bit products.
LAB_AVX512_TARGET inline __m512i lab_mul_high_64x64_avx512(__m512i a, __m512i b)
{
    const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFF);
    const __m512i ah = _mm512_srli_epi64(a, 32), bh = _mm512_srli_epi64(b, 32);
    const __m512i ll = _mm512_mul_epu32(a, b), lh = _mm512_mul_epu32(a, bh), hl = _mm512_mul_epu32(ah, b), hh = _mm512_mul_epu32(ah, bh);
    const __m512i mid = _mm512_add_epi64(_mm512_add_epi64(_mm512_srli_epi64(ll, 32), _mm512_and_si512(lh, low32)), _mm512_and_si512(hl, low32));
    return _mm512_add_epi64(_mm512_add_epi64(hh, _mm512_srli_epi64(lh, 32)), _mm512_add_epi64(_mm512_srli_epi64(hl, 32), _mm512_srli_epi64(mid, 32)));
}

// Up to eight fields of a row lab_repr_row_avx512 passed, the elements of `fields`: field j begins at begins[j] and ends at
// ends[j] (offsets into `row`; 16 bytes past each field's point can be loaded). Into out[0..8): repr's digits as lab_repr_field_avx2 reads them (w < 10^18, the decimal exponent -17),
// then Eisel-Lemire as lab_eisel_lemire computes it, an element a field. The elements it leaves to the caller, unwritten:
// those with more than 17 digits after the point, and those whose product Eisel-Lemire would refine with the next word
// of 5^-17 (about 1 in 512).
LAB_AVX512_TARGET inline __mmask8 lab_repr_fields8_avx512(const char *row, const int32_t *begins, const int32_t *ends, __mmask8 fields,
                                                           double *out)
{
    // Each field's first two bytes: a minus sign and the digit before the point, or that digit and the point.
    const __m256i begin = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(begins));
    const __m256i byte = _mm256_set1_epi32(0xFF), zero_char = _mm256_set1_epi32('0');
    const __m256i head = _mm256_mmask_i32gather_epi32(zero_char, fields, begin, row, 1);
    const __mmask8 minus = _mm256_cmpeq_epi32_mask(_mm256_and_si256(head, byte), _mm256_set1_epi32('-'));
    const __m256i negative = _mm256_maskz_mov_epi32(minus, _mm256_set1_epi32(1));
    const __m256i first = _mm256_add_epi32(begin, negative);  // each field's digit before the point
    const __m256i k = _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(ends)), _mm256_add_epi32(first, _mm256_set1_epi32(2)));
    __mmask8 left = _mm256_mask_cmpgt_epi32_mask(fields, k, _mm256_set1_epi32(17));
    const __m256i units = _mm256_sub_epi32(_mm256_and_si256(_mm256_mask_srli_epi32(head, minus, head, 8), byte), zero_char);
    alignas(32) int32_t firsts[8];
    _mm256_store_si256(reinterpret_cast<__m256i *>(firsts), first);
    const __mmask8 long17 = _mm256_mask_cmpeq_epi32_mask(fields, k, _mm256_set1_epi32(17));
    const __m256i at17 = _mm256_add_epi32(first, _mm256_set1_epi32(18));
    const __m256i seventeenth = _mm256_maskz_sub_epi32(long17, _mm256_and_si256(_mm256_mmask_i32gather_epi32(zero_char, long17, at17, row, 1), byte), zero_char);
    // Each field's 16 bytes after its point, four fields a register, the bytes past its k digits masked off; then their
    // values 2, 4 and 8 digits at a time, as lab_digit_ladder.
    __m512i sixteen[2];
    for (int half = 0; half < 2; ++half) {
        const char *at = row + 2;
        __m512i f = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i *>(at + firsts[4 * half])));
        f = _mm512_inserti32x4(f, _mm_loadu_si128(reinterpret_cast<const __m128i *>(at + firsts[4 * half + 1])), 1);
        f = _mm512_inserti32x4(f, _mm_loadu_si128(reinterpret_cast<const __m128i *>(at + firsts[4 * half + 2])), 2);
        f = _mm512_inserti32x4(f, _mm_loadu_si128(reinterpret_cast<const __m128i *>(at + firsts[4 * half + 3])), 3);
        // k of each field in every byte of its 128-bit element: the byte at index i is a digit where i < k.
        const __m256i four = _mm256_permutevar8x32_epi32(k, _mm256_setr_epi32(4 * half, 4 * half + 1, 4 * half + 2, 4 * half + 3, 0, 0, 0, 0));
        const __m512i k4 = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_castsi256_si512(four));
        const __m512i index = _mm512_set4_epi32(0x0F0E0D0C, 0x0B0A0908, 0x07060504, 0x03020100);
        const __mmask64 digits = _mm512_cmplt_epu8_mask(index, _mm512_shuffle_epi8(k4, _mm512_setzero_si512()));
        f = _mm512_maddubs_epi16(_mm512_maskz_sub_epi8(digits, f, _mm512_set1_epi8('0')), _mm512_set1_epi16(0x010A));  // bytes 10, 1
        f = _mm512_madd_epi16(f, _mm512_set1_epi32(0x00010064));  // 100, 1
        f = _mm512_packus_epi32(f, f);
        f = _mm512_madd_epi16(f, _mm512_set1_epi32(0x00012710));  // 10000, 1: [a, b, a, b] an element, 8 digits each
        sixteen[half] = _mm512_add_epi64(_mm512_mul_epu32(f, _mm512_set1_epi64(100000000)), _mm512_srli_epi64(f, 32));
    }
    // Each field's sixteen-digit value (the first quadword of each 128-bit element), in field order.
    const __m512i digits16 = _mm512_permutex2var_epi64(sixteen[0], _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), sixteen[1]);
    const __m512i w = _mm512_add_epi64(_mm512_add_epi64(_mm512_mullo_epi64(_mm512_cvtepu32_epi64(units), _mm512_set1_epi64(100000000000000000LL)),
                                                        _mm512_mullo_epi64(digits16, _mm512_set1_epi64(10))),
                                       _mm512_cvtepu32_epi64(seventeenth));
    // Eisel-Lemire for q = -17 (lab_eisel_lemire, its branches that never apply here left out: no subnormals, no
    // infinities, no ties, and no "cannot tell" for this q).
    const int q = -17;
    const __m512i lz = _mm512_lzcnt_epi64(w);
    const __m512i high = lab_mul_high_64x64_avx512(_mm512_sllv_epi64(w, lz), _mm512_set1_epi64(static_cast<long long>(LAB_POW5[2 * (q - LAB_POW5_SMALLEST)])));
    const __m512i precision = _mm512_set1_epi64(0xFFFFFFFFFFFFFFFFULL >> (52 + 3));
    left |= _mm512_cmpeq_epi64_mask(_mm512_and_si512(high, precision), precision) & fields;
    const __m512i upperbit = _mm512_srli_epi64(high, 63);
    __m512i mantissa = _mm512_srlv_epi64(high, _mm512_add_epi64(upperbit, _mm512_set1_epi64(64 - 52 - 3)));
    __m512i power2 = _mm512_sub_epi64(_mm512_add_epi64(upperbit, _mm512_set1_epi64((((152170 + 65536) * q) >> 16) + 63 + 1023)), lz);
    mantissa = _mm512_srli_epi64(_mm512_add_epi64(mantissa, _mm512_and_si512(mantissa, _mm512_set1_epi64(1))), 1);
    const __mmask8 carried = _mm512_cmpge_epu64_mask(mantissa, _mm512_set1_epi64(2LL << 52));
    mantissa = _mm512_mask_mov_epi64(mantissa, carried, _mm512_set1_epi64(1LL << 52));
    power2 = _mm512_mask_add_epi64(power2, carried, power2, _mm512_set1_epi64(1));
    __m512i bits = _mm512_or_si512(_mm512_andnot_si512(_mm512_set1_epi64(1LL << 52), mantissa), _mm512_slli_epi64(power2, 52));
    bits = _mm512_maskz_mov_epi64(_mm512_test_epi64_mask(w, w), bits);  // w = 0: zero, signed
    bits = _mm512_or_si512(bits, _mm512_slli_epi64(_mm512_cvtepu32_epi64(negative), 63));
    _mm512_mask_storeu_pd(out, fields & ~left, _mm512_castsi512_pd(bits));
    return left;
}

#pragma GCC diagnostic pop

#endif  // x86-64 host
#endif  // LAB_CSV_SIMD_H
