// The peer that `cnnlab bench` and tools/bench_parser.py measure the row parsers against (from_chars_pieces): the
// same pieces on the same pool, each field read by std::from_chars.

#ifndef LAB_CSV_FROM_CHARS_H
#define LAB_CSV_FROM_CHARS_H

#include <Python.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <system_error>

#include "lab_csv_python.h"

namespace {

// The bench's peer, not cnnlab's parser: the text as a C++ user would parse it with the standard library, each
// field split at ',' and '\n' and handed to std::from_chars (libstdc++ 12: correctly rounded), blank lines skipped;
// no rule of the lab's format checked beyond what from_chars refuses. The values written, or -1 where from_chars
// refused a field or out ran out of space.
long long from_chars_range(const char *p, const char *end, double *out, long long capacity)
{
    long long count = 0;
    while (p < end) {
        const char *field_end = p;
        while (field_end < end && *field_end != ',' && *field_end != '\n')
            ++field_end;
        if (field_end > p) {
            if (count == capacity)
                return -1;
            const std::from_chars_result r = std::from_chars(p, field_end, out[count], std::chars_format::general);
            if (r.ec != std::errc() || r.ptr != field_end)
                return -1;
            ++count;
        }
        p = field_end + 1;
    }
    return count;
}

// from_chars_pieces(pool, data, pieces, width, out) -> int
//     The bench's peer, not cnnlab's parser: each piece (start, end, first row) of the text split at ',' and '\n'
//     (blank lines skipped) and each field read by std::from_chars as a C++ user would write it, on the pool's
//     threads, into out from first_row * width on. The values written, or -1 where from_chars refused a field.
PyDoc_STRVAR(from_chars_pieces_doc,
             "from_chars_pieces(pool, data, pieces, width, out) -> int\n\n"
             "The bench's peer, not cnnlab's parser: each piece's fields split at ',' and '\\n' and read by std::from_chars, on the\n"
             "pool's threads; a piece's values go to out from its first row * width on. The values written, or -1.");
PyObject *from_chars_pieces(PyObject *, PyObject *args)
{
    PyObject *pool_obj, *data_obj, *pieces_obj, *out_obj;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "O!OOnO:from_chars_pieces", &PoolType, &pool_obj, &data_obj, &pieces_obj, &width, &out_obj))
        return nullptr;
    cnnlab::Pool *pool = reinterpret_cast<PoolObject *>(pool_obj)->pool;
    Buffer data, pieces, out;
    if (!pool) {
        PyErr_SetString(PyExc_ValueError, "from_chars_pieces: the pool is closed");
        return nullptr;
    }
    if (!data.get(data_obj, PyBUF_SIMPLE) || !float64_out(out_obj, &out, "from_chars_pieces") ||
        !pieces.get(pieces_obj, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
        return nullptr;
    const Py_ssize_t count = pieces.view.len / 24, capacity = out.view.len / 8;
    const long long *bounds = static_cast<const long long *>(pieces.view.buf);
    if (pieces.view.itemsize != 8 || pieces.view.len % 24 || width < 1) {
        PyErr_SetString(PyExc_ValueError, "from_chars_pieces: pieces must be int64 (start, end, first row) triples, width >= 1");
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < count; ++i)
        if (bounds[3 * i] < 0 || bounds[3 * i + 1] < bounds[3 * i] || bounds[3 * i + 1] > data.view.len || bounds[3 * i + 2] < 0 ||
            bounds[3 * i + 2] * width > capacity) {
            PyErr_Format(PyExc_ValueError, "from_chars_pieces: piece %zd out of range", i);
            return nullptr;
        }
    const char *base = static_cast<const char *>(data.view.buf);
    double *values = static_cast<double *>(out.view.buf);
    std::atomic<Py_ssize_t> next{0};
    std::atomic<long long> total{0};
    std::atomic<bool> failed{false};
    Py_BEGIN_ALLOW_THREADS
    pool->run(
        [&](int) {
            for (Py_ssize_t i; (i = next.fetch_add(1)) < count;) {
                const long long first = bounds[3 * i + 2] * width;
                const long long got = from_chars_range(base + bounds[3 * i], base + bounds[3 * i + 1], values + first, capacity - first);
                if (got < 0)
                    failed = true;
                else
                    total += got;
            }
        },
        static_cast<int>(std::min<Py_ssize_t>(count, pool->threads())));
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(failed.load() ? -1 : total.load());
}

}  // namespace

#endif  // LAB_CSV_FROM_CHARS_H
