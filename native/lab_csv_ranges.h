// The range parsers: the non-blank lines of a range of whole lines, already cut (by scan_rows or the summaries of a
// read: lab_csv_reads.h), parsed row by row into their place in `out`. parse_range is the stage; parse_rows runs it on
// the caller's thread, parse_pieces on the pool's threads for each piece of a list.

#ifndef LAB_CSV_RANGES_H
#define LAB_CSV_RANGES_H

#include <Python.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "lab_csv.h"
#include "lab_csv_lines.h"
#include "lab_csv_python.h"
#include "lab_csv_row.h"

namespace {

// Non-blank lines in [p, end), whole '\n'-ended lines.
Py_ssize_t count_rows(const char *p, const char *end)
{
    Py_ssize_t rows = 0;
    while (p < end) {
        const char *nl = static_cast<const char *>(std::memchr(p, '\n', end - p));
        const char *line_end = nl ? nl : end;
        rows += !lab_line_is_blank(p, line_end);
        p = line_end + 1;
    }
    return rows;
}

// Parse the non-blank lines of [base + start, base + stop) (whole lines) into values, `width` a row, at most
// max_rows rows. -1 when every line was good and stood where the blank-line rule lets it (`place`), else the
// index of the first bad one among the non-blank lines; *needed: the rows the range holds (counted past a bad
// line, or past max_rows, for the caller's check).
Py_ssize_t parse_range(const char *base, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t width, double *values, Py_ssize_t max_rows,
                       Py_ssize_t *needed, const RowPlace &place, const char *limit)
{
    const RowParser parse_row = row_kernel.load(std::memory_order_relaxed)->parse;
    const char *const end = base + stop;
    const char *p = base + start;
    Py_ssize_t row = 0;
    bool blank_before = place.matrix_rows > 0 && line_before_is_blank(base, place.bound, start);
    while (p < end) {
        const char *nl = static_cast<const char *>(std::memchr(p, '\n', end - p));  // found: the range ends with '\n'
        const char *line = p;
        p = nl + 1;
        if (row >= max_rows && !lab_line_is_blank(line, nl)) {  // rare: out is full
            *needed = row + count_rows(line, end);
            return -1;
        }
        const Line kind = parse_line(line, nl, parse_row, row, width, values, place, &blank_before, limit);
        if (kind == Line::bad) {
            *needed = row + count_rows(line, end);
            return row;
        }
        row += kind == Line::row;
    }
    *needed = row;
    return -1;
}

// Whether [start, stop) is a range of whole lines of `size` bytes at `base`; a ValueError set if not.
bool whole_lines(const char *base, Py_ssize_t size, Py_ssize_t start, Py_ssize_t stop, const char *function)
{
    if (start < 0 || stop < start || stop > size) {
        PyErr_Format(PyExc_ValueError, "%s: range [%zd, %zd) out of range for %zd bytes", function, start, stop, size);
        return false;
    }
    if (stop > start && base[stop - 1] != '\n') {
        PyErr_Format(PyExc_ValueError, "%s: the range [%zd, %zd) does not end at a line end", function, start, stop);
        return false;
    }
    return true;
}

// parse_rows(data, start, end, width, out[, bound, first_row, matrix_rows, separated]) -> int
//     Parse every non-blank line of data[start:end] (whole lines: data[end-1] must be '\n'
//     unless start == end) as `width` comma-separated numbers into `out`, a writable
//     C-contiguous float64 buffer: non-blank line i fills out[i*width:(i+1)*width]. Returns -1
//     when every line was good; otherwise the 0-based index, among the range's non-blank lines,
//     of the first line that is not (a byte that is not text after the trailing '\r's are
//     dropped, a field count other than `width`, a field float() refuses, '_', a value that is
//     not finite, or a row that breaks lab_csv.h's blank-line rule: row i is row first_row + i
//     of matrices of matrix_rows rows (0, the default: no rule), and whether a blank line comes
//     before the range's first line is read back from data down to `bound`, the start of the
//     span it lies in, default `start`). Lines before it are written; it and the lines after may be partly written.
//     Values are exactly float()'s: lab_csv.h's, or std::from_chars where lab_csv.h cannot
//     prove the rounding.
//     ValueError: out holds fewer than (non-blank lines of the range) * width values (checked
//     before any bad-line index is returned), width < 1, offsets out of range, a range that does
//     not end at a line end. TypeError/BufferError: out is not a writable contiguous float64 buffer.
PyDoc_STRVAR(parse_rows_doc,
             "parse_rows(data, start, end, width, out[, bound, first_row, matrix_rows, separated]) -> int\n\n"
             "Parse the non-blank lines of data[start:end] as `width` numbers each into the float64 buffer\n"
             "`out`; -1 if all were good, else the index among the non-blank lines of the first bad one.");
PyObject *parse_rows(PyObject *, PyObject *args)
{
    PyObject *data_obj, *out_obj;
    Py_ssize_t start, stop, width;
    RowPlace place;
    place.bound = -1;
    int separated = 0;
    if (!PyArg_ParseTuple(args, "OnnnO|nLLp:parse_rows", &data_obj, &start, &stop, &width, &out_obj, &place.bound, &place.first_row,
                          &place.matrix_rows, &separated))
        return nullptr;
    place.separated = separated;
    if (place.bound < 0)
        place.bound = start;
    Buffer data, out;
    if (!data.get(data_obj, PyBUF_SIMPLE) || !float64_out(out_obj, &out, "parse_rows"))
        return nullptr;
    const char *base = static_cast<const char *>(data.view.buf);
    if (width < 1) {
        PyErr_Format(PyExc_ValueError, "parse_rows: width %zd out of range", width);
        return nullptr;
    }
    if (!whole_lines(base, data.view.len, start, stop, "parse_rows"))
        return nullptr;
    if (place.bound > start || place.first_row < 0) {
        PyErr_Format(PyExc_ValueError, "parse_rows: bound %zd after start %zd, or first row %lld below 0", place.bound, start,
                     place.first_row);
        return nullptr;
    }
    const Py_ssize_t capacity = out.view.len / 8;
    double *values = static_cast<double *>(out.view.buf);
    Py_ssize_t bad, needed_rows;
    Py_BEGIN_ALLOW_THREADS
    bad = parse_range(base, start, stop, width, values, capacity / width, &needed_rows, place, base + data.view.len);
    Py_END_ALLOW_THREADS
    if (needed_rows > capacity / width) {
        PyErr_Format(PyExc_ValueError, "parse_rows: out holds %zd values, the range's %zd non-blank lines need %zd", capacity,
                     needed_rows, needed_rows * width);
        return nullptr;
    }
    return PyLong_FromSsize_t(bad);
}

// parse_pieces's `times` into `times`: where given, a buffer of int64 rows (worker, thread id, start ns, end ns), one per
// piece of `count`; false with the error set where it is not.
bool piece_times(PyObject *times_obj, Py_ssize_t count, Buffer *times)
{
    if (times_obj == Py_None)
        return true;
    if (!times->get(times_obj, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
        return false;
    const char *format = times->view.format ? times->view.format : "B";
    if (times->view.itemsize != 8 || times->view.len != count * 32 || !std::strchr("qlLQ", format[std::strlen(format) - 1])) {
        PyErr_SetString(PyExc_TypeError, "parse_pieces: times must be a writable C-contiguous int64 array of 4 values a piece");
        return false;
    }
    return true;
}

// parse_pieces(pool, data, pieces, width, out[, bound, first_row, matrix_rows, separated, times]) -> int
//     parse_rows for each piece (start, end, rows before it in out) of an int64 array of such
//     triples, on the pool's threads; first_row is the row of out's first. -1 if all were
//     good, else the index of the first piece (in order) that holds a bad line.
//     times (a trace, where not None): a writable C-contiguous int64 array of a row per piece,
//     filled with (pool worker, thread id, start ns, end ns), CLOCK_MONOTONIC: the clock of
//     Python's time.perf_counter_ns on Linux.
PyDoc_STRVAR(parse_pieces_doc,
             "parse_pieces(pool, data, pieces, width, out[, bound, first_row, matrix_rows, separated, times]) -> int\n\n"
             "parse_rows for every piece of `pieces` (an int64 array of (start, end, first row) triples; a piece's rows run to the next\n"
             "piece's first row, the last's to the end of `out`), on the pool's threads; -1 if all were good, else the first bad piece.");
PyObject *parse_pieces(PyObject *, PyObject *args)
{
    PyObject *pool_obj, *data_obj, *pieces_obj, *out_obj, *times_obj = Py_None;
    Py_ssize_t width;
    RowPlace span;  // bound: where the pieces' span starts; first_row: the row of out's first
    int separated = 0;
    if (!PyArg_ParseTuple(args, "O!OOnO|nLLpO:parse_pieces", &PoolType, &pool_obj, &data_obj, &pieces_obj, &width, &out_obj, &span.bound,
                          &span.first_row, &span.matrix_rows, &separated, &times_obj))
        return nullptr;
    span.separated = separated;
    cnnlab::Pool *pool = reinterpret_cast<PoolObject *>(pool_obj)->pool;
    if (!pool) {
        PyErr_SetString(PyExc_ValueError, "parse_pieces: the pool is closed");
        return nullptr;
    }
    Buffer data, pieces, out;
    if (!data.get(data_obj, PyBUF_SIMPLE) || !float64_out(out_obj, &out, "parse_pieces") ||
        !pieces.get(pieces_obj, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
        return nullptr;
    const char *piece_format = pieces.view.format ? pieces.view.format : "B";
    if (pieces.view.itemsize != 8 || pieces.view.len % 24 || !(std::strchr("qlLQ", piece_format[std::strlen(piece_format) - 1]))) {
        PyErr_SetString(PyExc_TypeError, "parse_pieces: pieces must be a C-contiguous int64 array of (start, end, first row) triples");
        return nullptr;
    }
    const char *base = static_cast<const char *>(data.view.buf);
    const long long *bounds = static_cast<const long long *>(pieces.view.buf);
    const Py_ssize_t count = pieces.view.len / 24, rows = out.view.len / 8 / std::max<Py_ssize_t>(width, 1);
    if (width < 1) {
        PyErr_Format(PyExc_ValueError, "parse_pieces: width %zd out of range", width);
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < count; ++i) {
        const long long next_row = i + 1 < count ? bounds[3 * i + 5] : rows;
        if (!whole_lines(base, data.view.len, bounds[3 * i], bounds[3 * i + 1], "parse_pieces"))
            return nullptr;
        if (bounds[3 * i] < span.bound || span.first_row < 0) {
            PyErr_Format(PyExc_ValueError, "parse_pieces: piece %zd starts before the bound %zd, or first row %lld below 0", i,
                         span.bound, span.first_row);
            return nullptr;
        }
        if (bounds[3 * i + 2] < 0 || next_row < bounds[3 * i + 2] || next_row > rows) {
            PyErr_Format(PyExc_ValueError, "parse_pieces: piece %zd's rows [%lld, %lld) are not within out's %zd", i, bounds[3 * i + 2],
                         next_row, rows);
            return nullptr;
        }
    }
    Buffer times_buffer;
    if (!piece_times(times_obj, count, &times_buffer))
        return nullptr;
    long long *times = times_buffer.held ? static_cast<long long *>(times_buffer.view.buf) : nullptr;
    double *values = static_cast<double *>(out.view.buf);
    const char *const limit = base + data.view.len;
    std::atomic<Py_ssize_t> next{0}, first_bad{count}, overfull{-1};
    Py_BEGIN_ALLOW_THREADS
    pool->run(
        [&](int worker) {
            for (Py_ssize_t i; (i = next.fetch_add(1)) < count;) {
                if (times)
                    times[4 * i] = worker, times[4 * i + 1] = syscall(SYS_gettid), times[4 * i + 2] = monotonic_ns();
                const long long first = bounds[3 * i + 2], capacity = (i + 1 < count ? bounds[3 * i + 5] : rows) - first;
                Py_ssize_t needed;
                RowPlace place = span;
                place.first_row += first;
                const Py_ssize_t bad =
                    parse_range(base, bounds[3 * i], bounds[3 * i + 1], width, values + first * width, capacity, &needed, place, limit);
                if (times)
                    times[4 * i + 3] = monotonic_ns();
                if (needed > capacity)
                    overfull = i;
                if (bad >= 0) {
                    Py_ssize_t seen = first_bad.load();
                    while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
                    }
                }
            }
        },
        static_cast<int>(std::min<Py_ssize_t>(count, pool->threads())));
    Py_END_ALLOW_THREADS
    if (overfull.load() >= 0) {
        PyErr_Format(PyExc_ValueError, "parse_pieces: piece %zd holds more rows than its space in out", overfull.load());
        return nullptr;
    }
    return PyLong_FromSsize_t(first_bad.load() < count ? first_bad.load() : -1);
}

}  // namespace

#endif  // LAB_CSV_RANGES_H
