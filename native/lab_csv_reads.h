// The reads and the summaries: what finds where a text's lines are before any is parsed, so that it can be cut into
// ranges of whole lines: scan_rows walks a given number of rows; summarize tells what the lines of a range say, in a
// form that combines with the ranges beside it; read_summarized reads a file on threads of its own and summarizes each
// piece as it lands, and summarize_parts does the same for bytes already in memory.

#ifndef LAB_CSV_READS_H
#define LAB_CSV_READS_H

#include <Python.h>

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <thread>
#include <vector>

#include "lab_csv_lines.h"
#include "lab_csv_python.h"

namespace {

// scan_rows(data, start, rows, max_line_bytes) -> (end, rows_found, lines_passed)
//     From `start` (a line start) walk '\n'-ended lines until `rows` non-blank ones are taken.
//     end: the offset just past the '\n' of the last line walked; rows_found: non-blank lines
//     taken (< rows only where the data ran out); lines_passed: lines walked, blank ones
//     included. An unterminated tail (bytes after the last '\n') is never taken: the caller
//     appends the next block, or a '\n' at the end of the file.
//     A line longer than max_line_bytes (its '\n' not counted), or an unterminated tail
//     already longer, gives (-1, rows_found, index): index is the 0-based number of that line
//     counted from `start` (= the lines walked before it), rows_found the non-blank lines
//     before it.
PyDoc_STRVAR(scan_rows_doc,
             "scan_rows(data, start, rows, max_line_bytes) -> (end, rows_found, lines_passed)\n\n"
             "Walk '\\n'-ended lines from `start` until `rows` non-blank ones are taken. A line longer than\n"
             "max_line_bytes gives (-1, rows_found, index of that line counted from start).");
PyObject *scan_rows(PyObject *, PyObject *args)
{
    PyObject *data_obj;
    Py_ssize_t start, rows, max_line;
    if (!PyArg_ParseTuple(args, "Onnn:scan_rows", &data_obj, &start, &rows, &max_line))
        return nullptr;
    Buffer data;
    if (!data.get(data_obj, PyBUF_SIMPLE))
        return nullptr;
    const Py_ssize_t size = data.view.len;
    if (start < 0 || start > size || rows < 0 || max_line < 0) {
        PyErr_Format(PyExc_ValueError, "scan_rows: start %zd, rows %zd, max_line_bytes %zd out of range for %zd bytes", start,
                     rows, max_line, size);
        return nullptr;
    }
    const char *base = static_cast<const char *>(data.view.buf);
    Py_ssize_t position = start, found = 0, lines = 0;
    bool too_long = false;
    Py_BEGIN_ALLOW_THREADS
    const char *const end = base + size;
    const char *p = base + start;
    while (found < rows) {
        const Py_ssize_t left = end - p;
        const char *nl = line_end_within(p, left, max_line);
        if (!nl) {
            too_long = left > max_line;
            break;
        }
        found += holds_ink(p, nl);
        p = nl + 1;
        ++lines;
    }
    position = p - base;
    Py_END_ALLOW_THREADS
    if (too_long)
        return Py_BuildValue("(nnn)", (Py_ssize_t)-1, found, lines);
    return Py_BuildValue("(nnn)", position, found, lines);
}

// What summarize() returns: see its comment.
struct Summary {
    Py_ssize_t newlines = 0, inner = 0, first = -1, last = -1, longest = 0;
    bool head_ink = false, tail_ink = false;
};

Summary summarize_range(const char *base, Py_ssize_t start, Py_ssize_t end)
{
    Summary s;
    const char *line = base + start, *const stop = base + end;
    for (;;) {
        const char *nl = static_cast<const char *>(std::memchr(line, '\n', stop - line));
        if (!nl) {
            (s.newlines ? s.tail_ink : s.head_ink) = holds_ink(line, stop);
            return s;
        }
        const Py_ssize_t at = nl - base;
        if (s.newlines) {
            s.inner += holds_ink(line, nl);
            s.longest = std::max(s.longest, at - s.last - 1);
        } else {
            s.head_ink = holds_ink(line, nl);
            s.first = at;
        }
        s.last = at;
        ++s.newlines;
        line = nl + 1;
    }
}

PyObject *summary_tuple(Py_ssize_t start, Py_ssize_t end, const Summary &s, bool with_range)
{
    if (with_range)
        return Py_BuildValue("(nnnOOnnnn)", start, end, s.newlines, s.head_ink ? Py_True : Py_False,
                             s.tail_ink ? Py_True : Py_False, s.inner, s.first, s.last, s.longest);
    return Py_BuildValue("(nOOnnnn)", s.newlines, s.head_ink ? Py_True : Py_False, s.tail_ink ? Py_True : Py_False, s.inner,
                         s.first, s.last, s.longest);
}

// summarize(data, start, end) -> (newlines, head_ink, tail_ink, inner, first, last, longest)
//     What the lines of data[start:end] say, for cutting a text read in parts on several threads
//     (cnnlab/files/lines.py combines the parts' summaries; kernel/csv.cu's Seg is the same monoid):
//     newlines: '\n's in the range; head_ink: a byte that is not blank before the first '\n'
//     (anywhere if none); tail_ink: one after the last '\n'; inner: lines wholly inside (between
//     two '\n's of the range) that are not blank; first, last: offsets of the first and last
//     '\n' (-1 if none); longest: the longest line wholly inside, its '\n' not counted (0 if none).
PyDoc_STRVAR(summarize_doc,
             "summarize(data, start, end) -> (newlines, head_ink, tail_ink, inner, first, last, longest)\n\n"
             "What the lines of data[start:end] say, for combining with the summaries of the ranges beside it.");
PyObject *summarize(PyObject *, PyObject *args)
{
    PyObject *data_obj;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "Onn:summarize", &data_obj, &start, &end))
        return nullptr;
    Buffer data;
    if (!data.get(data_obj, PyBUF_SIMPLE))
        return nullptr;
    if (start < 0 || end < start || end > data.view.len) {
        PyErr_Format(PyExc_ValueError, "summarize: range [%zd, %zd) out of range for %zd bytes", start, end, data.view.len);
        return nullptr;
    }
    Summary s;
    Py_BEGIN_ALLOW_THREADS
    s = summarize_range(static_cast<const char *>(data.view.buf), start, end);
    Py_END_ALLOW_THREADS
    return summary_tuple(start, end, s, false);
}

// The window is read in pieces of this many bytes, claimed by the threads as they go (a thread the
// machine holds up then delays the read by one piece, not by its whole share), each summarized as it
// lands; a cut then walks no more than a piece (lines.cut_summarized).
constexpr Py_ssize_t PIECE_BYTES = 1 << 20;

struct Piece {
    Py_ssize_t start = 0, wanted = 0, count = 0;
    int error = 0;
    Summary summary;
};

void read_piece(int fd, char *base, long long offset, Piece *piece)
{
    while (piece->count < piece->wanted) {
        struct iovec rest = {base + piece->start + piece->count, static_cast<size_t>(piece->wanted - piece->count)};
        const ssize_t got = preadv(fd, &rest, 1, offset + piece->count);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            piece->error = errno;
            return;
        }
        if (got == 0)
            break;  // the file ends here
        piece->count += got;
    }
    piece->summary = summarize_range(base, piece->start, piece->start + piece->count);
}

// The pieces of PIECE_BYTES that [at, at + nbytes) falls into; false with MemoryError set where there is no memory for them.
bool plan_pieces(Py_ssize_t at, Py_ssize_t nbytes, std::vector<Piece> *pieces)
{
    try {
        pieces->resize((nbytes + PIECE_BYTES - 1) / PIECE_BYTES);
    } catch (const std::bad_alloc &) {
        PyErr_NoMemory();
        return false;
    }
    for (size_t i = 0; i < pieces->size(); ++i) {
        (*pieces)[i].start = at + static_cast<Py_ssize_t>(i) * PIECE_BYTES;
        (*pieces)[i].wanted = std::min(PIECE_BYTES, nbytes - static_cast<Py_ssize_t>(i) * PIECE_BYTES);
    }
    return true;
}

// `each` of the pieces, claimed by up to `threads` threads of their own as they go (the caller's among them), the GIL
// released.
template <typename Each>
void on_threads(std::vector<Piece> &pieces, int threads, Each each)
{
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i; (i = next.fetch_add(1)) < pieces.size();)
            each(&pieces[i]);
    };
    Py_BEGIN_ALLOW_THREADS
    std::vector<std::thread> workers;
    try {
        for (size_t i = 1; i < std::min<size_t>(threads, pieces.size()); ++i)
            workers.emplace_back(work);
    } catch (const std::exception &) {  // no more threads (or no memory for one): the others share the work
    }
    work();
    for (std::thread &worker : workers)
        worker.join();
    Py_END_ALLOW_THREADS
}

// (count, parts): the pieces' bytes as a contiguous run from the first, and each one's (start, end, summary...).
PyObject *summarized_parts(const std::vector<Piece> &pieces)
{
    for (const Piece &piece : pieces)
        if (piece.error) {
            errno = piece.error;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    PyObject *list = PyList_New(0);
    if (!list)
        return nullptr;
    Py_ssize_t total = 0;
    for (const Piece &piece : pieces) {
        if (piece.count) {
            PyObject *item = summary_tuple(piece.start, piece.start + piece.count, piece.summary, true);
            if (!item || PyList_Append(list, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(list);
                return nullptr;
            }
            Py_DECREF(item);
        }
        total += piece.count;
        if (piece.count < piece.wanted)  // the file ends in this piece: later pieces' bytes (a growing file) are read again
            break;
    }
    PyObject *result = Py_BuildValue("(nO)", total, list);
    Py_DECREF(list);
    return result;
}

// read_summarized(fd, window, at, nbytes, offset, threads) -> (count, parts)
//     Fill window[at:at + nbytes] from the regular file `fd` at `offset` in pieces of 1 MB, read
//     (preadv) by up to `threads` threads of its own at once (the GIL released), each piece
//     summarized as it lands (in cache). count: the bytes read, a contiguous run (fewer at the
//     file's end); parts: (start, end, summary...) for each piece of that run, in order, summary
//     as summarize gives it. OSError where a read fails.
PyDoc_STRVAR(read_summarized_doc,
             "read_summarized(fd, window, at, nbytes, offset, threads) -> (count, parts)\n\n"
             "Fill window[at:at + nbytes] from fd at offset with `threads` reads at once, each part summarized.");
PyObject *read_summarized(PyObject *, PyObject *args)
{
    int fd, threads;
    PyObject *window_obj;
    Py_ssize_t at, nbytes;
    long long offset;
    if (!PyArg_ParseTuple(args, "iOnnLi:read_summarized", &fd, &window_obj, &at, &nbytes, &offset, &threads))
        return nullptr;
    Buffer window;
    if (!window.get(window_obj, PyBUF_WRITABLE))
        return nullptr;
    if (at < 0 || nbytes < 0 || at + nbytes > window.view.len || offset < 0 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "read_summarized: %zd bytes at %zd out of range for %zd bytes (offset %lld, %d threads)",
                     nbytes, at, window.view.len, offset, threads);
        return nullptr;
    }
    char *base = static_cast<char *>(window.view.buf);
    std::vector<Piece> pieces;
    if (!plan_pieces(at, nbytes, &pieces))
        return nullptr;
    on_threads(pieces, threads, [&](Piece *piece) { read_piece(fd, base, offset + (piece->start - at), piece); });
    return summarized_parts(pieces);
}

// summarize_parts(data, start, end, threads) -> (count, parts)
//     data[start:end] (a mapped file's bytes, say) summarized as read_summarized summarizes what it reads: in
//     pieces of 1 MB on up to `threads` threads of its own, the GIL released; count is end - start.
PyDoc_STRVAR(summarize_parts_doc,
             "summarize_parts(data, start, end, threads) -> (count, parts)\n\n"
             "data[start:end] summarized in parts of 1 MB on `threads` threads, as read_summarized's parts.");
PyObject *summarize_parts(PyObject *, PyObject *args)
{
    PyObject *data_obj;
    Py_ssize_t start, end;
    int threads;
    if (!PyArg_ParseTuple(args, "Onni:summarize_parts", &data_obj, &start, &end, &threads))
        return nullptr;
    Buffer data;
    if (!data.get(data_obj, PyBUF_SIMPLE))
        return nullptr;
    if (start < 0 || end < start || end > data.view.len || threads < 1) {
        PyErr_Format(PyExc_ValueError, "summarize_parts: range [%zd, %zd) out of range for %zd bytes (%d threads)", start, end,
                     data.view.len, threads);
        return nullptr;
    }
    const char *base = static_cast<const char *>(data.view.buf);
    std::vector<Piece> pieces;
    if (!plan_pieces(start, end - start, &pieces))
        return nullptr;
    on_threads(pieces, threads, [&](Piece *piece) {
        piece->count = piece->wanted;
        piece->summary = summarize_range(base, piece->start, piece->start + piece->count);
    });
    return summarized_parts(pieces);
}

}  // namespace

#endif  // LAB_CSV_READS_H
