// One row of the lab's CSV into `width` doubles: the row parsers (scalar; AVX2 and AVX-512 on lab_csv_simd.h's vector
// steps), the table that picks one at run time by CNNLAB_CPU_ISA's names, and the host's half of a field's conversion
// (std::from_chars, where kernel/lab_csv.h cannot prove the rounding). Python: parse_field, parser_isa, use_isa.

#ifndef LAB_CSV_ROW_H
#define LAB_CSV_ROW_H

#include <Python.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <system_error>

#include "lab_csv.h"
#include "lab_csv_python.h"
#include "lab_csv_simd.h"

namespace {

// The double of a valid finite decimal that lab_csv.h could not prove (LAB_FIELD_HOST):
// std::from_chars (correctly rounded in libstdc++ >= 12) of the text without its sign, which
// from_chars would refuse as '+'. Returns LAB_FIELD_OK or LAB_FIELD_BAD (rounds to infinity).
int convert_on_host(const char *begin, const char *end, double *out)
{
    while (begin < end && lab_is_field_space((unsigned char)*begin))
        ++begin;
    while (end > begin && lab_is_field_space((unsigned char)end[-1]))
        --end;
    bool negative = false;
    if (begin < end && (*begin == '-' || *begin == '+')) {
        negative = *begin == '-';
        ++begin;
    }
    double value = 0.0;
    const std::from_chars_result r = std::from_chars(begin, end, value, std::chars_format::general);
    if (r.ec == std::errc::result_out_of_range) {
        // Rounds to zero or to infinity. The text was valid and nonzero; tell which from its
        // decimal exponent: lab_read_decimal gives value = w * 10^q with 1 <= w < 10^19, so
        // q < 0 here means below 1e19 * 1e-1, far from overflow, i.e. it underflowed.
        LabDecimal d;
        const char *stop = begin;
        if (!lab_read_decimal(begin, end, &d, &stop) || d.q >= 0)
            return LAB_FIELD_BAD;
        value = 0.0;
    } else if (r.ec != std::errc() || r.ptr != end) {
        return LAB_FIELD_BAD;  // not reached for text lab_csv.h called HOST
    }
    *out = negative ? -value : value;
    return LAB_FIELD_OK;
}

// One field [begin, end) (its spaces included) into *out, exactly; false where float() refuses it.
inline bool parse_one_field(const char *begin, const char *end, double *out)
{
    const int kind = lab_parse_field(begin, end, out);
    return kind == LAB_FIELD_OK || (kind == LAB_FIELD_HOST && convert_on_host(begin, end, out) == LAB_FIELD_OK);
}

// One non-blank row [p, line_end) (its '\r's already dropped) into out[0..width). True if good. A row parser:
// `limit`, the end of the readable buffer, is for those that load past the row (the vector ones).
using RowParser = bool (*)(const char *p, const char *line_end, const char *limit, Py_ssize_t width, double *out);

// The scalar row parser: each field read from where the last one ended.
bool parse_row_scalar(const char *p, const char *line_end, const char *, Py_ssize_t width, double *out)
{
    for (Py_ssize_t field = 0; field < width; ++field) {
        while (p < line_end && lab_is_field_space((unsigned char)*p))
            ++p;
        const char *number = p;
        int kind = lab_parse_number(p, line_end, &p, out + field);
        if (kind == LAB_FIELD_BAD)
            return false;
        const char *number_end = p;
        while (p < line_end && lab_is_field_space((unsigned char)*p))
            ++p;
        if (field + 1 < width) {
            if (p == line_end || *p != ',')
                return false;
        } else if (p != line_end) {
            return false;
        }
        if (kind == LAB_FIELD_HOST && convert_on_host(number, number_end, out + field) != LAB_FIELD_OK)
            return false;
        ++p;  // past the ',' (or past line_end after the last field: unused)
    }
    return true;
}

#ifdef LAB_CSV_AVX2
// The AVX2 row parser (lab_csv_simd.h): the row's commas found first, then each field on its own, repr's shape
// with vector loads, any other field as parse_one_field reads it. A row of more or fewer than width - 1 commas is
// refused at once: no field holds a comma, so the scalar parser would refuse it too.
LAB_AVX2_TARGET bool parse_row_avx2(const char *p, const char *line_end, const char *limit, Py_ssize_t width, double *out)
{
    const long long length = line_end - p;
    if (length > 64LL * LAB_ROW_BITMAP_WORDS)
        return parse_row_scalar(p, line_end, limit, width, out);
    uint64_t bits[LAB_ROW_BITMAP_WORDS];
    if (lab_comma_bitmap_avx2(p, length, limit, bits) != width - 1)
        return false;
    // Each comma ends a field; the row's end ends the last. The words read are the ones the bitmap wrote.
    const char *field = p;
    double *value = out;
    for (long long word = 0; word < (length + 63) / 64; ++word) {
        for (uint64_t mask = bits[word]; mask != 0; mask &= mask - 1) {
            const char *field_end = p + 64 * word + __builtin_ctzll(mask);
            if (!lab_repr_field_avx2(field, field_end, limit, value) && !parse_one_field(field, field_end, value))
                return false;
            field = field_end + 1;
            ++value;
        }
    }
    return lab_repr_field_avx2(field, line_end, limit, value) || parse_one_field(field, line_end, value);
}

// The AVX-512 row parser: where the whole row is repr-shaped fields (lab_repr_row_avx512, one pass of mask compares)
// and 16 bytes past it can be loaded, eight fields at a time are converted in the vector registers' elements
// (lab_repr_fields8_avx512), the few it leaves as parse_one_field reads them; any other row is the AVX2 parser's,
// which reads each field on its own.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // see lab_csv_simd.h
LAB_AVX512_TARGET bool parse_row_avx512(const char *p, const char *line_end, const char *limit, Py_ssize_t width, double *out)
{
    const long long length = line_end - p;
    uint64_t commas[LAB_ROW_BITMAP_WORDS];
    if (length > 64LL * LAB_ROW_BITMAP_WORDS || limit - line_end < 16 || lab_repr_row_avx512(p, length, commas) != width - 1)
        return parse_row_avx2(p, line_end, limit, width, out);
    // Each field's first byte and its end (the next comma, or the row's end), listed first: the commas four a step, so
    // that where a field ends costs no branch on the bitmap's words; eight past the last field (elements left out), 0. A
    // repr-shaped field and its comma take 4 bytes at least, so a row holds 16 fields a 64-byte word at most.
    int32_t begins[16 * LAB_ROW_BITMAP_WORDS + 8], ends[16 * LAB_ROW_BITMAP_WORDS + 8];
    Py_ssize_t found = 0;
    for (long long word = 0; found < width - 1; ++word) {
        uint64_t mask = commas[word];
        const int count = __builtin_popcountll(mask);
        for (int i = 0; i < count; i += 4) {
            for (int j = 0; j < 4; ++j) {  // past the word's last comma: its offset + 63, overwritten by the next word's
                ends[found + i + j] = static_cast<int32_t>(64 * word + __builtin_ctzll(mask | 1ULL << 63));
                mask &= mask - 1;
            }
        }
        found += count;
    }
    ends[width - 1] = static_cast<int32_t>(length);
    begins[0] = 0;
    for (Py_ssize_t i = 1; i < width; ++i)
        begins[i] = ends[i - 1] + 1;
    for (int j = 0; j < 8; ++j)
        begins[width + j] = ends[width + j] = 0;
    for (Py_ssize_t i = 0; i < width; i += 8) {
        const __mmask8 fields = static_cast<__mmask8>(width - i >= 8 ? 0xFF : (1u << (width - i)) - 1);
        for (__mmask8 left = lab_repr_fields8_avx512(p, begins + i, ends + i, fields, out + i); left != 0; left &= left - 1) {
            const int j = __builtin_ctz(left);
            if (!parse_one_field(p + begins[i + j], p + ends[i + j], out + i + j))
                return false;
        }
    }
    return true;
}
#pragma GCC diagnostic pop
#endif

// The row parsers this build holds, widest first, as the forward names its kernels (CNNLAB_CPU_ISA).
struct RowKernel {
    const char *name;
    bool (*runs_here)();
    RowParser parse;
};

const RowKernel row_kernels[] = {
#ifdef LAB_CSV_AVX2
    {"avx512", [] {
         return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx2") &&
                __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("lzcnt") &&
                __builtin_cpu_supports("popcnt");
     },
     parse_row_avx512},
    {"avx2", [] {
         return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                __builtin_cpu_supports("lzcnt") && __builtin_cpu_supports("popcnt");
     },
     parse_row_avx2},
#endif
    {"x86-64", [] { return true; }, parse_row_scalar},
};

// The row parser in use: the widest this CPU runs, unless use_isa() chose another.
std::atomic<const RowKernel *> row_kernel{nullptr};

// parse_field(data) -> (kind, value)
//     One field through lab_parse_field (for tests): kind 0 (LAB_FIELD_OK) with its value,
//     1 (LAB_FIELD_HOST) with std::from_chars's value (what parse_rows would write), or
//     2 (LAB_FIELD_BAD) with None.
PyDoc_STRVAR(parse_field_doc,
             "parse_field(data) -> (kind, value)\n\n"
             "One field: (0, value) proved by lab_csv.h, (1, value) converted by std::from_chars, (2, None) refused.");
PyObject *parse_field(PyObject *, PyObject *arg)
{
    Buffer data;
    if (!data.get(arg, PyBUF_SIMPLE))
        return nullptr;
    const char *begin = static_cast<const char *>(data.view.buf);
    const char *end = begin + data.view.len;
    double value = 0.0;
    int kind = lab_parse_field(begin, end, &value);
    if (kind == LAB_FIELD_HOST && convert_on_host(begin, end, &value) != LAB_FIELD_OK)
        return Py_BuildValue("(iO)", LAB_FIELD_BAD, Py_None);  // an overflow lab_csv.h left to the host
    if (kind == LAB_FIELD_BAD)
        return Py_BuildValue("(iO)", kind, Py_None);
    return Py_BuildValue("(id)", kind, value);
}

// parser_isa() -> str;  use_isa(name)
//     The row parser in use, and the choice of another: "avx512" or "avx2" (lab_csv_simd.h: where the CPU has
//     AVX-512 or AVX2) or "x86-64" (scalar); ISAS names those built, CPU_ISAS those this CPU runs, widest first (CNNLAB_CPU_ISA's names).
PyDoc_STRVAR(parser_isa_doc,
             "parser_isa() -> str\n\n"
             "The instruction set of the row parser in use: one of CPU_ISAS (at first the widest).");
PyObject *parser_isa(PyObject *, PyObject *) { return PyUnicode_FromString(row_kernel.load()->name); }

PyDoc_STRVAR(use_isa_doc,
             "use_isa(name) -> None\n\n"
             "Parse rows with the row parser of `name`, one of CPU_ISAS (for every thread, from the next call on).");
PyObject *use_isa(PyObject *, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return nullptr;
    for (const RowKernel &kernel : row_kernels) {
        if (std::strcmp(name, kernel.name))
            continue;
        if (!kernel.runs_here())
            return PyErr_Format(PyExc_ValueError, "use_isa: this CPU cannot run the %s row parser", name);
        row_kernel.store(&kernel);
        Py_RETURN_NONE;
    }
    return PyErr_Format(PyExc_ValueError, "use_isa: no row parser is named '%s'", name);
}

}  // namespace

#endif  // LAB_CSV_ROW_H
