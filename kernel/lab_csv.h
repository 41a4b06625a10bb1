// The lab's CSV format, as plain C++17 shared by the host (g++: native/lab_csv_module.cpp, the
// Python extension cnnlab._lab_csv) and CUDA device code (nvcc: kernel/csv.cu).
//
// What a file's bytes mean:
//   - lines end with '\n'; a line's trailing '\r' bytes are dropped first (CRLF files), as
//     Python's line.rstrip(b"\r");
//   - a line is blank when every byte is one of " \t\r\v\f" (Python's bytes.strip() set less
//     '\n'); blank lines are skipped and are not rows;
//   - a row is `width` fields separated by ','; every byte of the row is a text byte (tab or
//     0x20..0x7e);
//   - a field is a number as Python's float(text.strip()) reads it, restricted to finite
//     decimals and without underscores: [spaces/tabs] [+-] (digits [. [digits]] | . digits)
//     [(e|E) [+-] digits] [spaces/tabs]. Any number of digits in the mantissa and the exponent.
//     Every value is the correctly rounded double (round half to even), as float() gives:
//     signed zero kept, subnormals exact, values that round to infinity refused.
//
// lab_parse_field(begin, end, &value) converts one field and answers
//   LAB_FIELD_OK    the value is in *out,
//   LAB_FIELD_HOST  a valid finite decimal whose correctly rounded double this code cannot prove
//                   (more than 19 significant digits right at a rounding boundary, or the rare
//                   case Eisel-Lemire declines): convert the text another way (the host's
//                   std::from_chars or float()); *out is not written,
//   LAB_FIELD_BAD   anything float() refuses, an empty field, '_', inf/nan spellings, or a value
//                   that rounds to infinity (1e400); *out is not written.
//
// How: the mantissa's first 19 significant digits in a uint64 w and a decimal exponent q
// (value = w * 10^q); then Eisel-Lemire: w times a 128-bit truncated 5^q (lab_pow5_table.h),
// which gives the rounded double or says it cannot tell (LAB_FIELD_HOST; only for |q| far outside
// Clinger's exact range, so no such path is kept). With more than 19
// significant digits, w and w+1 are both converted: if they round alike, so does every number
// between them, the true value included; if not, LAB_FIELD_HOST. On the host, the shape of
// Python's repr (d.ddd... with 8 to 18 digits after the point) is read with three 8-byte loads
// and no loop; the rest digit by digit, 8 at a time.
//
// Device rules kept here: no std library calls, no exceptions, no heap, no unaligned loads
// (the 8-digits-at-once loads are host only).

#ifndef LAB_CSV_H
#define LAB_CSV_H

#include <stdint.h>

#include "lab_pow5_table.h"

#ifdef __CUDACC__
#define LAB_FN __host__ __device__ inline
#elif defined(__GNUC__)
// Inlined always: g++ would otherwise keep the number reader a call of its own (it has several
// callers), which costs ~15% of the parse.
#define LAB_FN inline __attribute__((always_inline))
#else
#define LAB_FN inline
#endif

enum { LAB_FIELD_OK = 0, LAB_FIELD_HOST = 1, LAB_FIELD_BAD = 2 };

// ---------------------------------------------------------------------------------------------
// Bytes and lines

// A byte a row may hold: tab or printable ASCII.
LAB_FN bool lab_is_text_byte(unsigned char c) { return c == '\t' || (c >= 0x20 && c <= 0x7e); }

// A byte of a blank line: " \t\r\v\f" (Python's bytes.strip() whitespace, less '\n').
LAB_FN bool lab_is_blank_byte(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r' && c != '\n'); }

// Spaces and tabs, stripped around a field.
LAB_FN bool lab_is_field_space(unsigned char c) { return c == ' ' || c == '\t'; }

// Whether the line [begin, end) (without its '\n') is blank.
LAB_FN bool lab_line_is_blank(const char *begin, const char *end)
{
    for (; begin < end; ++begin)
        if (!lab_is_blank_byte((unsigned char)*begin))
            return false;
    return true;
}

// Where blank lines may stand in a file of matrices of `matrix_rows` rows each (the input file's
// images after its count line; the CNN file's filters, then its weights): between matrices only.
// A file either has one or more blank lines before every matrix after the first ("separated", as
// the lab writes one after each) or none after its first row, so that a matrix of 99 or 101 rows
// puts a blank line (or its absence) out of place wherever the blank lines fall. Row `row` counts
// the rows from the first matrix's first (0), which may follow blank lines or not; matrix_rows 0
// sets no rule (an output file). True where the row stands where the rule lets it.
LAB_FN bool lab_row_placed(long long row, long long matrix_rows, bool separated, bool blank_before)
{
    return matrix_rows <= 0 || row == 0 || blank_before == (separated && row % matrix_rows == 0);
}

// The end of the line [begin, end) (without its '\n') once its trailing '\r's are dropped.
LAB_FN const char *lab_line_content_end(const char *begin, const char *end)
{
    while (end > begin && end[-1] == '\r')
        --end;
    return end;
}

// ---------------------------------------------------------------------------------------------
// The powers of five: the same table on host and device

inline const uint64_t lab_pow5_host[LAB_POW5_WORDS] = LAB_POW5_TABLE;
#ifdef __CUDACC__
static __device__ const uint64_t lab_pow5_device[LAB_POW5_WORDS] = LAB_POW5_TABLE;
#endif

#ifdef __CUDA_ARCH__
#define LAB_POW5 lab_pow5_device
#else
#define LAB_POW5 lab_pow5_host
#endif

// ---------------------------------------------------------------------------------------------
// Arithmetic helpers

struct LabU128 {
    uint64_t high, low;
};

LAB_FN LabU128 lab_mul_64x64(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
    return LabU128{__umul64hi(a, b), a * b};
#else
    const unsigned __int128 p = (unsigned __int128)a * b;
    return LabU128{(uint64_t)(p >> 64), (uint64_t)p};
#endif
}

LAB_FN int lab_leading_zeros(uint64_t x)  // x != 0
{
#ifdef __CUDA_ARCH__
    return __clzll((long long)x);
#else
    return __builtin_clzll(x);
#endif
}

LAB_FN double lab_double_from_bits(uint64_t bits)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)bits);
#else
    double d;
    __builtin_memcpy(&d, &bits, sizeof d);
    return d;
#endif
}

LAB_FN bool lab_is_digit(unsigned char c) { return (unsigned char)(c - '0') < 10; }

#if !defined(__CUDA_ARCH__) && !defined(LAB_NO_SWAR) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define LAB_SWAR 1  // host: eight digits at a time (unaligned 8-byte loads); -DLAB_NO_SWAR tests the device's byte loop

inline uint64_t lab_read_u64(const char *p)
{
    uint64_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

inline uint32_t lab_eight_digits_value(uint64_t v)  // v: 8 digit values (0..9) a byte, first byte most significant
{
    const uint64_t mask = 0x000000FF000000FFULL;
    const uint64_t mul1 = 0x000F424000000064ULL;  // 100 + (1000000 << 32)
    const uint64_t mul2 = 0x0000271000000001ULL;  // 1 + (10000 << 32)
    v = (v * 10) + (v >> 8);
    v = (((v & mask) * mul1) + (((v >> 16) & mask) * mul2)) >> 32;
    return (uint32_t)v;
}

// 10^k for the k <= 8 digits an 8-byte chunk adds.
inline const uint64_t lab_pow10_int[9] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL};

// The digits value of the first k (0..8) digit bytes of t (digit values, first byte lowest).
inline uint64_t lab_first_digits_value(uint64_t t, int k)
{
    const int half = 32 - 4 * k;  // shifted by 64 - 8k in two steps (k = 0 shifts out all)
    return lab_eight_digits_value((t << half) << half);
}

// Bit 7 of each byte of chunk that is not a digit; exact up to the first one, which is all callers use.
inline uint64_t lab_non_digits(uint64_t chunk)
{
    return ((chunk + 0x4646464646464646ULL) | (chunk - 0x3030303030303030ULL)) & 0x8080808080808080ULL;
}

// The digits before the first non-digit (0..8) of a chunk whose non-digit bytes have bit 7 set
// in nd, without a branch: nd == 0 counts 8.
inline int lab_leading_digits(uint64_t nd) { return (__builtin_ctzll(nd | (1ULL << 63)) >> 3) + (nd == 0); }
#endif

// Digits from p (while p < end) into w (wrapping past 19 digits: the caller recounts); the first
// non-digit. On the host, 8 bytes at a time: a chunk of 8 digits at once, or the k < 8 digits
// before the chunk's first non-digit at once (shifted to the top of the word, zeros before them),
// so that where a number ends costs no mispredicted branch per digit.
LAB_FN const char *lab_eat_digits(const char *p, const char *end, uint64_t *w)
{
    uint64_t v = *w;
#ifdef LAB_SWAR
    while (end - p >= 8) {
        const uint64_t chunk = lab_read_u64(p);
        const uint64_t t = chunk - 0x3030303030303030ULL;  // digit values; no borrow out of a digit byte
        const uint64_t nd = lab_non_digits(chunk);
        if (nd == 0) {
            v = v * 100000000ULL + lab_eight_digits_value(t);
            p += 8;
            continue;
        }
        const int k = __builtin_ctzll(nd) >> 3;  // digits before the first non-digit, 0..7
        v = v * lab_pow10_int[k] + lab_first_digits_value(t, k);
        *w = v;
        return p + k;
    }
#endif
    while (p < end && lab_is_digit((unsigned char)*p)) {
        v = v * 10 + (uint64_t)(*p - '0');
        ++p;
    }
    *w = v;
    return p;
}

#ifdef LAB_SWAR
// The shape of Python's repr of most doubles, d.ddddddddd... with 8 to 18 digits after the
// point, read from p without a loop: three 8-byte loads at once, so that the digits' count
// costs no branch a predictor must learn (it varies from number to number). Needs 26 bytes
// before end; answers false, having consumed nothing, for any other shape (the caller reads it
// the general way), so it decides no validity of its own.
inline bool lab_read_short_decimal(const char *p, const char *end, uint64_t *w, int64_t *q, const char **stop)
{
    if (end - p < 26 || !lab_is_digit((unsigned char)p[0]) || p[1] != '.')
        return false;
    const uint64_t zeros = 0x3030303030303030ULL;
    const uint64_t a = lab_read_u64(p + 2), b = lab_read_u64(p + 10), c = lab_read_u64(p + 18);
    const uint64_t ta = a - zeros, tb = b - zeros, tc = c - zeros;
    const uint64_t nda = lab_non_digits(a), ndb = lab_non_digits(b), ndc = lab_non_digits(c);
    if (nda != 0)
        return false;
    const int kb = lab_leading_digits(ndb);               // digits in b, 0..8
    const int kc = (kb == 8) * lab_leading_digits(ndc);  // then digits in c
    if (kc > 2)  // more than 19 digits: their recount is the general path's
        return false;
    const char *const after = p + 10 + kb + kc;
    if (*after == 'e' || *after == 'E')
        return false;
    const uint64_t high_part = (uint64_t)(p[0] - '0') * 100000000ULL + lab_eight_digits_value(ta);
    *w = (high_part * lab_pow10_int[kb] + lab_first_digits_value(tb, kb)) * lab_pow10_int[kc] +
         lab_first_digits_value(tc, kc);
    *q = -(int64_t)(8 + kb + kc);
    *stop = after;
    return true;
}
#endif

// ---------------------------------------------------------------------------------------------
// Eisel-Lemire: w * 10^q rounded to a double, as (biased exponent, 52-bit mantissa field).
// As fast_float's compute_float (Lemire 2021), with its conservative "cannot tell" exit kept.

struct LabRounded {
    uint64_t mantissa;  // the 52 stored bits
    int power2;         // biased exponent: 0 zero or subnormal, 0x7ff infinity, -1 cannot tell
};

LAB_FN LabRounded lab_eisel_lemire(int64_t q, uint64_t w)
{
    const int mantissa_bits = 52, minimum_exponent = -1023, infinite_power = 0x7ff;
    LabRounded answer;
    if (w == 0 || q < LAB_POW5_SMALLEST) {
        answer.mantissa = 0;
        answer.power2 = 0;
        return answer;
    }
    if (q > LAB_POW5_LARGEST) {
        answer.mantissa = 0;
        answer.power2 = infinite_power;
        return answer;
    }
    const int lz = lab_leading_zeros(w);
    w <<= lz;
    // The product with the truncated 5^q, to mantissa_bits + 3 bits of precision.
    const int index = 2 * (int)(q - LAB_POW5_SMALLEST);
    LabU128 product = lab_mul_64x64(w, LAB_POW5[index]);
    const uint64_t precision_mask = 0xFFFFFFFFFFFFFFFFULL >> (mantissa_bits + 3);
    if ((product.high & precision_mask) == precision_mask) {  // the low bits may carry: add the next word's product
        const LabU128 second = lab_mul_64x64(w, LAB_POW5[index + 1]);
        product.low += second.high;
        if (second.high > product.low)
            product.high++;
    }
    // All ones below: the truncation of 5^q could matter, unless 5^q is exact here (fast_float's
    // original guard; Mushtak and Lemire later proved it never fires wrongly, so it only costs a
    // rare trip to the host).
    if (product.low == 0xFFFFFFFFFFFFFFFFULL && !(q >= -27 && q <= 55)) {
        answer.mantissa = 0;
        answer.power2 = -1;
        return answer;
    }
    const int upperbit = (int)(product.high >> 63);
    const int shift = upperbit + 64 - mantissa_bits - 3;
    uint64_t mantissa = product.high >> shift;
    // floor(log2(10^q)) + 63, as fast_float's detail::power
    int power2 = (int)((((152170 + 65536) * q) >> 16) + 63) + upperbit - lz - minimum_exponent;
    if (power2 <= 0) {  // subnormal (or zero)
        if (-power2 + 1 >= 64) {
            answer.mantissa = 0;
            answer.power2 = 0;
            return answer;
        }
        mantissa >>= -power2 + 1;
        mantissa += (mantissa & 1);  // round up (no ties to even are possible down here)
        mantissa >>= 1;
        // Rounding up may have made it the smallest normal number.
        answer.power2 = (mantissa < (1ULL << mantissa_bits)) ? 0 : 1;
        answer.mantissa = mantissa & ~(1ULL << mantissa_bits);
        return answer;
    }
    // A tie between two doubles, only possible where 5^q fits in 64 bits: round half to even.
    if (product.low <= 1 && q >= -4 && q <= 23 && (mantissa & 3) == 1) {
        if ((mantissa << shift) == product.high)
            mantissa &= ~1ULL;
    }
    mantissa += (mantissa & 1);
    mantissa >>= 1;
    if (mantissa >= (2ULL << mantissa_bits)) {
        mantissa = 1ULL << mantissa_bits;
        power2++;
    }
    mantissa &= ~(1ULL << mantissa_bits);
    if (power2 >= infinite_power) {
        power2 = infinite_power;
        mantissa = 0;
    }
    answer.mantissa = mantissa;
    answer.power2 = power2;
    return answer;
}

// ---------------------------------------------------------------------------------------------
// Numbers

// A decimal number read from p: value = w * 10^q (w holds the first 19 significant digits).
struct LabDecimal {
    uint64_t w;
    int64_t q;
    bool negative;
    bool truncated;  // more than 19 significant digits: the value lies in [w, w+1) * 10^q
};

// Reads the grammar [+-] (digits [. [digits]] | . digits) [(e|E) [+-] digits] from p (no
// spaces first) and stops at the first byte past it (*stop). Returns false when there is no
// number there: no mantissa digit, or an 'e' without exponent digits.
LAB_FN bool lab_read_decimal(const char *p, const char *end, LabDecimal *d, const char **stop)
{
    if (p < end) {  // branch-free: half the numbers are negative, in no order a predictor could learn
        const char c = *p;
        d->negative = c == '-';
        p += (c == '-') | (c == '+');
    } else {
        d->negative = false;
    }
#ifdef LAB_SWAR
    if (lab_read_short_decimal(p, end, &d->w, &d->q, stop)) {
        d->truncated = false;
        return true;
    }
#endif
    const char *const int_begin = p;
    uint64_t w = 0;
    p = lab_eat_digits(p, end, &w);
    const char *const int_end = p;
    int64_t digits = int_end - int_begin;
    int64_t q = 0;
    const char *frac_begin = p, *frac_end = p;
    if (p < end && *p == '.') {
        ++p;
        frac_begin = p;
        p = lab_eat_digits(p, end, &w);
        frac_end = p;
        q = -(int64_t)(frac_end - frac_begin);
        digits += frac_end - frac_begin;
    }
    if (digits == 0)
        return false;
    if (p < end && (*p == 'e' || *p == 'E')) {
        ++p;
        bool exp_negative = false;
        if (p < end && (*p == '-' || *p == '+')) {
            exp_negative = *p == '-';
            ++p;
        }
        if (p == end || !lab_is_digit((unsigned char)*p))
            return false;
        int64_t e = 0;
        while (p < end && lab_is_digit((unsigned char)*p)) {
            if (e < 0x10000000000LL)  // clamped: far past any double, never overflowing
                e = e * 10 + (*p - '0');
            ++p;
        }
        q += exp_negative ? -e : e;
    }
    *stop = p;
    d->truncated = false;
    if (digits > 19) {  // leading zeros (before or after the point) are not significant: recount
        for (const char *s = int_begin; s < frac_end && (*s == '0' || *s == '.'); ++s)
            if (*s == '0')
                --digits;
        if (digits > 19) {  // keep the first 19 significant digits, and the exponent to match
            d->truncated = true;
            const uint64_t nineteen_digits = 1000000000000000000ULL;
            const int64_t exp_part = q + (frac_end - frac_begin);  // the explicit exponent
            w = 0;
            const char *s = int_begin;
            while (w < nineteen_digits && s < int_end)
                w = w * 10 + (uint64_t)(*s++ - '0');
            if (w >= nineteen_digits) {
                q = exp_part + (int_end - s);
            } else {
                s = frac_begin;
                while (w < nineteen_digits && s < frac_end)
                    w = w * 10 + (uint64_t)(*s++ - '0');
                q = exp_part - (s - frac_begin);
            }
        }
    }
    d->w = w;
    d->q = q;
    return true;
}

LAB_FN double lab_signed(double v, bool negative)  // v >= 0 (or +0.0): its sign bit set without a branch
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double(__double_as_longlong(v) | ((long long)negative << 63));
#else
    uint64_t bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    bits |= (uint64_t)negative << 63;
    __builtin_memcpy(&v, &bits, sizeof v);
    return v;
#endif
}

// The double of a decimal read by lab_read_decimal: LAB_FIELD_OK, HOST or BAD (infinite).
// Eisel-Lemire for every w: a 64x64-bit product where Clinger's exact path would divide, and one
// path for every number spares a branch no predictor can learn (about a third of Python's
// 17-digit reprs have w > 2^53).
LAB_FN int lab_decimal_to_double(const LabDecimal *d, double *out)
{
    if (d->w == 0) {
        *out = lab_signed(0.0, d->negative);
        return LAB_FIELD_OK;
    }
    const LabRounded r = lab_eisel_lemire(d->q, d->w);
    if (r.power2 < 0)
        return LAB_FIELD_HOST;
    if (d->truncated) {  // the true value lies in [w, w+1) * 10^q: both ends must round alike
        const LabRounded r1 = lab_eisel_lemire(d->q, d->w + 1);
        if (r1.power2 != r.power2 || r1.mantissa != r.mantissa)
            return r.power2 == 0x7ff ? LAB_FIELD_BAD : LAB_FIELD_HOST;
    }
    if (r.power2 == 0x7ff)
        return LAB_FIELD_BAD;
    const uint64_t bits = r.mantissa | ((uint64_t)r.power2 << 52) | ((uint64_t)d->negative << 63);
    *out = lab_double_from_bits(bits);
    return LAB_FIELD_OK;
}

// One number from p (no spaces first), stopping at the first byte past it (*stop; set unless
// LAB_FIELD_BAD). The building block of lab_parse_field, for callers that walk a row without
// splitting it first.
LAB_FN int lab_parse_number(const char *p, const char *end, const char **stop, double *out)
{
    LabDecimal d;
    if (!lab_read_decimal(p, end, &d, stop))
        return LAB_FIELD_BAD;
    return lab_decimal_to_double(&d, out);
}

// One field: the bytes between two commas (or a line's start or end).
LAB_FN int lab_parse_field(const char *begin, const char *end, double *out)
{
    while (begin < end && lab_is_field_space((unsigned char)*begin))
        ++begin;
    while (end > begin && lab_is_field_space((unsigned char)end[-1]))
        --end;
    LabDecimal d;
    const char *stop = begin;
    if (!lab_read_decimal(begin, end, &d, &stop) || stop != end)
        return LAB_FIELD_BAD;
    return lab_decimal_to_double(&d, out);
}

#endif  // LAB_CSV_H
