// The output's writer: doubles as CSV text, each exactly as Python's repr() writes it (format_repr, laid out by repr's
// rules from std::to_chars's shortest digits); format_rows is its Python entry.

#ifndef LAB_CSV_FORMAT_H
#define LAB_CSV_FORMAT_H

#include <Python.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "lab_csv_python.h"

namespace {

// repr(value) into out (at least 32 bytes); the end. Python's 'r' format: the shortest round-trip
// digits d1 d2 ... dn with value = 0.d1...dn x 10^point; exponent form when point <= -4 or
// point > 16 (d1[.d2...dn]e+XX, at least two exponent digits), else positional with ".0" added
// to whole numbers; "inf", "-inf", "nan" as repr has them.
char *format_repr(double value, char *out)
{
    if (value != value)
        return std::memcpy(out, "nan", 3), out + 3;
    if (value == __builtin_inf() || value == -__builtin_inf()) {
        const char *text = value > 0 ? "inf" : "-inf";
        const size_t length = value > 0 ? 3 : 4;
        return std::memcpy(out, text, length), out + length;
    }
    char scientific[40];
    const std::to_chars_result r = std::to_chars(scientific, scientific + sizeof scientific - 1, value, std::chars_format::scientific);
    *r.ptr = '\0';  // for atoi below
    char *p = out;
    const char *s = scientific;
    if (*s == '-')
        *p++ = *s++;
    char digits[20];
    int count = 0;
    for (; s < r.ptr && *s != 'e'; ++s)
        if (*s != '.')
            digits[count++] = *s;
    const int point = std::atoi(s + 1) + 1;  // s: "e+XX" or "e-XX"
    if (point <= -4 || point > 16) {
        *p++ = digits[0];
        if (count > 1) {
            *p++ = '.';
            std::memcpy(p, digits + 1, count - 1);
            p += count - 1;
        }
        const int exponent = point - 1;
        *p++ = 'e';
        *p++ = exponent < 0 ? '-' : '+';
        const int magnitude = exponent < 0 ? -exponent : exponent;
        if (magnitude >= 100)
            *p++ = char('0' + magnitude / 100);
        *p++ = char('0' + magnitude / 10 % 10);
        *p++ = char('0' + magnitude % 10);
    } else if (point <= 0) {
        *p++ = '0';
        *p++ = '.';
        std::memset(p, '0', -point);
        p += -point;
        std::memcpy(p, digits, count);
        p += count;
    } else if (point < count) {
        std::memcpy(p, digits, point);
        p += point;
        *p++ = '.';
        std::memcpy(p, digits + point, count - point);
        p += count - point;
    } else {
        std::memcpy(p, digits, count);
        p += count;
        std::memset(p, '0', point - count);
        p += point - count;
        *p++ = '.';
        *p++ = '0';
    }
    return p;
}

// format_rows(values) -> str
//     A C-contiguous 2-D float64 array as CSV lines, each value exactly as Python's repr() writes
//     it (the shortest text that reads back as the same double: std::to_chars, laid out by
//     repr's rules), the GIL released.
PyDoc_STRVAR(format_rows_doc,
             "format_rows(values) -> str\n\n"
             "A C-contiguous 2-D float64 array as CSV lines, each value as repr() writes it.");
PyObject *format_rows(PyObject *, PyObject *arg)
{
    Buffer values;
    if (!values.get(arg, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
        return nullptr;
    const char *format = values.view.format ? values.view.format : "B";
    if (values.view.ndim != 2 || values.view.itemsize != 8 || !(std::strcmp(format, "d") == 0 || std::strcmp(format, "<d") == 0 || std::strcmp(format, "=d") == 0)) {
        PyErr_SetString(PyExc_TypeError, "format_rows: values must be a C-contiguous 2-D float64 array");
        return nullptr;
    }
    const Py_ssize_t rows = values.view.shape[0], columns = values.view.shape[1];
    const double *data = static_cast<const double *>(values.view.buf);
    std::string text;
    try {
        text.resize(static_cast<size_t>(rows) * (static_cast<size_t>(columns) * 32 + 1));
    } catch (const std::bad_alloc &) {
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    char *p = text.data();
    for (Py_ssize_t row = 0; row < rows; ++row) {
        for (Py_ssize_t column = 0; column < columns; ++column) {
            if (column)
                *p++ = ',';
            p = format_repr(data[row * columns + column], p);
        }
        *p++ = '\n';
    }
    text.resize(p - text.data());
    Py_END_ALLOW_THREADS
    return PyUnicode_DecodeASCII(text.data(), static_cast<Py_ssize_t>(text.size()), nullptr);
}

}  // namespace

#endif  // LAB_CSV_FORMAT_H
