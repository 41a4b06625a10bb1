// cnnlab.files._lab_csv: the lab's CSV text walked and parsed at C speed, with the GIL released, so
// that several Python threads parse blocks of one file on several cores. The format's rules
// (blank lines, CRLF, text bytes, the number grammar and its exact conversion) are
// kernel/lab_csv.h's, which the CUDA parser (kernel/csv.cu) shares.
//
// Python API (every `data` is any object with a contiguous buffer of bytes: bytes, bytearray,
// memoryview, a uint8 numpy array; offsets are byte offsets into it):
//
//   scan_rows(data, start, rows, max_line_bytes) -> (end, rows_found, lines_passed)
//       From `start` (a line start) walk '\n'-ended lines until `rows` non-blank ones are taken.
//       end: the offset just past the '\n' of the last line walked; rows_found: non-blank lines
//       taken (< rows only where the data ran out); lines_passed: lines walked, blank ones
//       included. An unterminated tail (bytes after the last '\n') is never taken: the caller
//       appends the next block, or a '\n' at the end of the file.
//       A line longer than max_line_bytes (its '\n' not counted), or an unterminated tail
//       already longer, gives (-1, rows_found, index): index is the 0-based number of that line
//       counted from `start` (= the lines walked before it), rows_found the non-blank lines
//       before it.
//
//   summarize(data, start, end) -> (newlines, head_ink, tail_ink, inner, first, last, longest)
//       What the lines of data[start:end] say, for cutting a text read in parts on several threads
//       (cnnlab/files/lines.py combines the parts' summaries; kernel/csv.cu's Seg is the same monoid):
//       newlines: '\n's in the range; head_ink: a byte that is not blank before the first '\n'
//       (anywhere if none); tail_ink: one after the last '\n'; inner: lines wholly inside (between
//       two '\n's of the range) that are not blank; first, last: offsets of the first and last
//       '\n' (-1 if none); longest: the longest line wholly inside, its '\n' not counted (0 if none).
//
//   read_summarized(fd, window, at, nbytes, offset, threads) -> (count, parts)
//       Fill window[at:at + nbytes] from the regular file `fd` at `offset` in pieces of 1 MB, read
//       (preadv) by up to `threads` threads of its own at once (the GIL released), each piece
//       summarized as it lands (in cache). count: the bytes read, a contiguous run (fewer at the
//       file's end); parts: (start, end, summary...) for each piece of that run, in order, summary
//       as summarize gives it. OSError where a read fails.
//
//   summarize_parts(data, start, end, threads) -> (count, parts)
//       data[start:end] (a mapped file's bytes, say) summarized as read_summarized summarizes what it reads: in
//       pieces of 1 MB on up to `threads` threads of its own, the GIL released; count is end - start.
//
//   parse_rows(data, start, end, width, out[, bound, first_row, matrix_rows, separated]) -> int
//       Parse every non-blank line of data[start:end] (whole lines: data[end-1] must be '\n'
//       unless start == end) as `width` comma-separated numbers into `out`, a writable
//       C-contiguous float64 buffer: non-blank line i fills out[i*width:(i+1)*width]. Returns -1
//       when every line was good; otherwise the 0-based index, among the range's non-blank lines,
//       of the first line that is not (a byte that is not text after the trailing '\r's are
//       dropped, a field count other than `width`, a field float() refuses, '_', a value that is
//       not finite, or a row that breaks lab_csv.h's blank-line rule: row i is row first_row + i
//       of matrices of matrix_rows rows (0, the default: no rule), and whether a blank line comes
//       before the range's first line is read back from data down to `bound`, the start of the
//       span it lies in, default `start`). Lines before it are written; it and the lines after may be partly written.
//       Values are exactly float()'s: lab_csv.h's, or std::from_chars where lab_csv.h cannot
//       prove the rounding.
//       ValueError: out holds fewer than (non-blank lines of the range) * width values (checked
//       before any bad-line index is returned), width < 1, offsets out of range, a range that does
//       not end at a line end. TypeError/BufferError: out is not a writable contiguous float64 buffer.
//
//   parse_walk(pool, data, start, rows, width, out, first_row, matrix_rows, separated, max_line_bytes, part_bytes, timed)
//           -> (end, lines, times)
//       parse_rows of the next `rows` non-blank lines from `start` (a line start, the start of a span: the blank-line rule
//       looks back no further), their end found by the walk itself, on the pool's threads: the text is cut at byte
//       offsets into parts of part_bytes, each thread counts the rows of a part it claims, then parses it into its place once
//       the rows before it are known (on one thread, with no count first: the text read once). Where parse_rows needs
//       its range cut first (scan_rows, or the summaries of a read), this reads the text once or twice, in cache.
//       end: just past the last row's '\n'; lines: the lines walked to it, blank ones included (as scan_rows counts
//       them). (-1, 0, ...) where the walk declines: a bad line (as parse_rows finds them), a line longer than
//       max_line_bytes, or data ending before `rows` rows; any row may have been written. The caller then cuts the
//       range and parses it as before, which finds what it found. times (where `timed`, else None): bytes of int64,
//       (pool worker, thread id, start ns, end ns, bytes parsed) for each part parsed.
//       ValueError: out holds fewer than rows * width values, or arguments out of range.
//
//   parse_pieces(pool, data, pieces, width, out[, bound, first_row, matrix_rows, separated, times]) -> int
//       parse_rows for each piece (start, end, rows before it in out) of an int64 array of such
//       triples, on the pool's threads; first_row is the row of out's first. -1 if all were
//       good, else the index of the first piece (in order) that holds a bad line.
//       times (a trace, where not None): a writable C-contiguous int64 array of a row per piece,
//       filled with (pool worker, thread id, start ns, end ns), CLOCK_MONOTONIC: the clock of
//       Python's time.perf_counter_ns on Linux.
//
//   format_rows(values) -> str
//       A C-contiguous 2-D float64 array as CSV lines, each value exactly as Python's repr() writes
//       it (the shortest text that reads back as the same double: std::to_chars, laid out by
//       repr's rules), the GIL released.
//
//   from_chars_pieces(pool, data, pieces, width, out) -> int
//       The bench's peer, not cnnlab's parser: each piece (start, end, first row) of the text split at ',' and '\n'
//       (blank lines skipped) and each field read by std::from_chars as a C++ user would write it, on the pool's
//       threads, into out from first_row * width on. The values written, or -1 where from_chars refused a field.
//
//   parser_isa() -> str;  use_isa(name)
//       The row parser in use, and the choice of another: "avx512" or "avx2" (lab_csv_simd.h: where the CPU has
//       AVX-512 or AVX2) or "x86-64" (scalar); ISAS names those built, CPU_ISAS those this CPU runs, widest first (CNNLAB_CPU_ISA's names).
//
//   parse_field(data) -> (kind, value)
//       One field through lab_parse_field (for tests): kind 0 (LAB_FIELD_OK) with its value,
//       1 (LAB_FIELD_HOST) with std::from_chars's value (what parse_rows would write), or
//       2 (LAB_FIELD_BAD) with None.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "lab_csv.h"
#include "isa_table.h"
#include "lab_csv_simd.h"
#include "pool.h"

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

// The '\n' that ends the line at p, looked for in the `left` bytes there: null where none comes before they end, or
// within max_line + 1 bytes (a '\n' further away ends a line too long).
inline const char *line_end_within(const char *p, Py_ssize_t left, Py_ssize_t max_line)
{
    return static_cast<const char *>(std::memchr(p, '\n', left <= max_line ? left : max_line + 1));
}

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
    const char *field = p;
    long long word = 0;
    uint64_t mask = bits[0];
    for (Py_ssize_t i = 0; i < width; ++i) {
        const char *field_end = line_end;
        if (i + 1 < width) {
            while (mask == 0)
                mask = bits[++word];
            field_end = p + 64 * word + __builtin_ctzll(mask);
            mask &= mask - 1;
        }
        if (!lab_repr_field_avx2(field, field_end, limit, out + i) && !parse_one_field(field, field_end, out + i))
            return false;
        field = field_end + 1;
    }
    return true;
}

// The AVX-512 row parser: where the whole row is repr-shaped fields (lab_repr_row_avx512, one pass of mask compares)
// and 16 bytes past it can be loaded, eight fields at a time are converted in the vector registers' lanes
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
    // that where a field ends costs no branch on the bitmap's words; eight past the last field (lanes left out), 0. A
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
        const __mmask8 lanes = static_cast<__mmask8>(width - i >= 8 ? 0xFF : (1u << (width - i)) - 1);
        for (__mmask8 left = lab_repr_fields8_avx512(p, begins + i, ends + i, lanes, out + i); left != 0; left &= left - 1) {
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

struct Buffer {
    Py_buffer view;
    bool held = false;
    ~Buffer()
    {
        if (held)
            PyBuffer_Release(&view);
    }
    bool get(PyObject *obj, int flags)
    {
        held = PyObject_GetBuffer(obj, &view, flags) == 0;
        return held;
    }
};

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
        // Blank: empty, or every byte blank (a line's first byte usually decides).
        const bool blank = nl == p || (lab_is_blank_byte((unsigned char)*p) && lab_line_is_blank(p, nl));
        found += !blank;
        p = nl + 1;
        ++lines;
    }
    position = p - base;
    Py_END_ALLOW_THREADS
    if (too_long)
        return Py_BuildValue("(nnn)", (Py_ssize_t)-1, found, lines);
    return Py_BuildValue("(nnn)", position, found, lines);
}

// What summarize() returns: see the module's comment.
struct Summary {
    Py_ssize_t newlines = 0, inner = 0, first = -1, last = -1, longest = 0;
    bool head_ink = false, tail_ink = false;
};

// Whether [p, nl) holds a byte that is not blank (a line's first byte usually decides).
inline bool holds_ink(const char *p, const char *nl)
{
    return nl != p && !(lab_is_blank_byte((unsigned char)*p) && lab_line_is_blank(p, nl));
}

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
        struct iovec room = {base + piece->start + piece->count, static_cast<size_t>(piece->wanted - piece->count)};
        const ssize_t got = preadv(fd, &room, 1, offset + piece->count);
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

// The pieces of PIECE_BYTES that [at, at + nbytes) falls into; false with MemoryError set where there is no room for them.
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

// The bytes [start, end) of a buffer already in memory (a mapped file's: its pages are faulted in on these threads),
// summarized in pieces of PIECE_BYTES on up to `threads` threads, as read_summarized's parts.
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

// Where a range's rows stand among the file's matrices, for lab_csv.h's blank-line rule.
struct RowPlace {
    Py_ssize_t bound = 0;        // the start of the span the range lies in: no line before it is looked at
    long long first_row = 0;     // the range's first row, counted from the first matrix's first (0)
    long long matrix_rows = 0;   // rows a matrix; 0: no rule
    bool separated = false;      // the file has a blank line before each matrix after the first
};

// Whether the line that ends just before `start` (a line start after `bound`) is blank. A span starts just after
// a row (or the count line), so at `bound` the line before is not blank. Walks back over blank bytes only: a row
// ends in a digit, so this looks at a byte or two.
bool line_before_is_blank(const char *base, Py_ssize_t bound, Py_ssize_t start)
{
    if (start <= bound)
        return false;
    for (Py_ssize_t at = start - 1; at > bound; --at) {  // base[start - 1] is the line's '\n'
        const unsigned char c = static_cast<unsigned char>(base[at - 1]);
        if (c == '\n')
            return true;
        if (!lab_is_blank_byte(c))
            return false;
    }
    return true;
}

// What parse_line found a line to be.
enum class Line { blank, row, bad };

// One '\n'-ended line [line, nl) of a walk that has parsed `row` rows: blank (noted in *blank_before), or row `row`
// parsed into values[row * width...] where the blank-line rule (`place`) lets it stand, else bad.
inline Line parse_line(const char *line, const char *nl, RowParser parse_row, Py_ssize_t row, Py_ssize_t width, double *values,
                       const RowPlace &place, bool *blank_before, const char *limit)
{
    if (!holds_ink(line, nl)) {
        *blank_before = true;
        return Line::blank;
    }
    if (!lab_row_placed(place.first_row + row, place.matrix_rows, place.separated, *blank_before) ||
        !parse_row(line, lab_line_content_end(line, nl), limit, width, values + row * width))
        return Line::bad;
    *blank_before = false;
    return Line::row;
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

// `out` as a writable float64 buffer, or false with a TypeError set.
bool float64_out(PyObject *out_obj, Buffer *out, const char *function)
{
    if (!out->get(out_obj, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS))
        return false;
    const char *format = out->view.format ? out->view.format : "B";
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const bool little_ok = std::strcmp(format, "<d") == 0;
#else
    const bool little_ok = false;
#endif
    if (out->view.itemsize != 8 ||
        !(std::strcmp(format, "d") == 0 || std::strcmp(format, "=d") == 0 || std::strcmp(format, "@d") == 0 || little_ok)) {
        PyErr_Format(PyExc_TypeError, "%s: out must be a float64 buffer, not format '%s'", function, format);
        return false;
    }
    return true;
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

// A pool of threads that parse_pieces runs on (pool.h), as a Python object a reader keeps for its life.
struct PoolObject {
    PyObject_HEAD
    cnnlab::Pool *pool;
};

int Pool_init(PoolObject *self, PyObject *args, PyObject *)
{
    int threads;
    if (!PyArg_ParseTuple(args, "i:Pool", &threads))
        return -1;
    if (threads < 1) {
        PyErr_Format(PyExc_ValueError, "Pool: threads must be at least 1, not %d", threads);
        return -1;
    }
    if (!self->pool)
        self->pool = new (std::nothrow) cnnlab::Pool(threads);
    return self->pool ? 0 : (PyErr_NoMemory(), -1);
}

void Pool_stop(PoolObject *self)
{
    if (self->pool) {
        Py_BEGIN_ALLOW_THREADS
        self->pool->stop();
        Py_END_ALLOW_THREADS
        delete self->pool;
        self->pool = nullptr;
    }
}

void Pool_dealloc(PoolObject *self)
{
    Pool_stop(self);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyObject *Pool_close(PoolObject *self, PyObject *)
{
    Pool_stop(self);
    Py_RETURN_NONE;
}

PyMethodDef Pool_methods[] = {
    {"close", reinterpret_cast<PyCFunction>(Pool_close), METH_NOARGS, "close()\n\nStop the threads."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject PoolType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Nanoseconds on CLOCK_MONOTONIC, the clock of Python's time.perf_counter_ns on Linux, so a trace's native spans
// line up with its Python ones.
long long monotonic_ns()
{
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
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

// The walk of parse_walk: the text from `start` cut at byte offsets into parts of part_bytes, each part the lines
// that start in it, claimed in order by the pool's threads. On several threads a thread counts its part's rows (the
// part lands in its cache), publishes the count, waits until the rows before the part are known (the parts before it
// were claimed earlier, and each is counted before its thread waits), then parses the part into its place. On one
// thread the rows before a part are known as it is claimed: it is parsed with no count first, the text read once.
class Walk {
  public:
    Walk(const char *base, Py_ssize_t start, Py_ssize_t size, Py_ssize_t rows, Py_ssize_t width, double *values, const RowPlace &place,
         Py_ssize_t max_line, Py_ssize_t part_bytes)
        : base_(base), start_(start), size_(size), rows_(rows), width_(width), values_(values), place_(place), max_line_(max_line),
          part_bytes_(part_bytes), parse_row_(row_kernel.load(std::memory_order_relaxed)->parse)
    {
    }

    // Walk on the pool's threads: the offset just past the last row's '\n' (*lines: the lines walked
    // to it), or -1 where the walk declines. `times` (a trace's): each parsed part's (worker, thread id, start and end
    // ns, bytes).
    Py_ssize_t run(cnnlab::Pool &pool, Py_ssize_t *lines, std::vector<long long> *times)
    {
        if (rows_ == 0) {
            *lines = 0;
            return start_;
        }
        times_ = times;
        direct_ = pool.threads() <= 1;
        pool.run([this](int worker) { claim_parts(worker); }, pool.threads());
        if (declined_.load() || end_ < 0)
            return -1;
        *lines = lines_;
        return end_;
    }

  private:
    struct Count {
        Py_ssize_t rows = 0, lines = 0;
    };

    void claim_parts(int worker)
    {
        while (!declined_.load(std::memory_order_relaxed)) {
            const Py_ssize_t part = next_.fetch_add(1), at = start_ + part * part_bytes_;
            if (at >= size_ || rows_before(part, false) >= rows_)
                return;  // past the data, or past the part that holds the last row
            const long long began = times_ ? monotonic_ns() : 0;
            const Py_ssize_t first = line_start_from(at), stop = line_start_from(at + part_bytes_);
            Py_ssize_t parsed_end = -1;
            if (first < 0)  // inside a line too long: the part where it starts declines where rows follow it
                publish(part, Count());
            else if (!walk_part(part, first, stop < 0 ? size_ : stop, &parsed_end)) {
                declined_.store(true);
                return;
            }
            if (times_ && parsed_end >= 0) {
                std::lock_guard<std::mutex> lock(mutex_);
                times_->insert(times_->end(), {worker, static_cast<long long>(syscall(SYS_gettid)), began, monotonic_ns(), parsed_end - first});
            }
        }
    }

    // The first line start at or after offset `at`: just past the first '\n' from at - 1 (the data's end where none
    // follows), or -1 where the line that holds at - 1 runs longer than max_line (a part that ends in it is walked up
    // to it, where the walk finds it too long).
    Py_ssize_t line_start_from(Py_ssize_t at) const
    {
        if (at <= start_ || at >= size_)
            return std::min(std::max(at, start_), size_);
        const Py_ssize_t left = size_ - (at - 1);
        const char *nl = line_end_within(base_ + at - 1, left, max_line_);
        return nl ? nl + 1 - base_ : (left > max_line_ ? -1 : size_);
    }

    // Part `part`, the lines of [first, stop): counted and its count published where it cannot be parsed at once (up
    // to a line too long, where its parse then stops if it needs rows past it), then parsed in its place. False where
    // a row it must parse is bad or a line before it too long; *parsed_end: where its parse stopped (-1: none).
    bool walk_part(Py_ssize_t part, Py_ssize_t first, Py_ssize_t stop, Py_ssize_t *parsed_end)
    {
        const char *end;
        Count count, parsed;
        if (!direct_) {
            walk_lines(first, stop, 0, PY_SSIZE_T_MAX, false, &count, &end);  // false: counted up to a line too long
            publish(part, count);
        }
        const Py_ssize_t before = rows_before(part, true);
        if (before < 0 || before >= rows_)
            return true;  // declined meanwhile, or a part past the last row (counted only: the next step's text, in cache)
        if (!walk_lines(first, stop, before, rows_ - before, true, &parsed, &end))
            return false;
        *parsed_end = end - base_;
        if (direct_)
            publish(part, parsed);
        if (before + parsed.rows == rows_) {
            std::lock_guard<std::mutex> lock(mutex_);
            end_ = end - base_;
            lines_ = prefix_lines_[part] + parsed.lines;
        }
        return true;
    }

    // The lines of [first, stop) (stop a line start or the data's end) from the walk's row `row`, up to `room` rows:
    // counted, or parsed. False where a line is bad (parsed) or longer than max_line; *end: where the walk stopped
    // (stop, or past the last row's '\n' where the rows ran out; a tail with no '\n' is not taken).
    bool walk_lines(Py_ssize_t first, Py_ssize_t stop, Py_ssize_t row, Py_ssize_t room, bool parse, Count *count, const char **end) const
    {
        const char *p = base_ + first, *const limit = base_ + stop;
        bool blank_before = parse && place_.matrix_rows > 0 && line_before_is_blank(base_, start_, first);
        while (p < limit && count->rows < room) {
            const Py_ssize_t left = limit - p;
            const char *nl = line_end_within(p, left, max_line_);
            if (!nl) {
                if (left > max_line_)
                    return false;
                break;  // the data's tail, with no '\n'
            }
            const char *line = p;
            p = nl + 1;
            ++count->lines;
            if (!parse) {
                count->rows += holds_ink(line, nl);
                continue;
            }
            const Line kind = parse_line(line, nl, parse_row_, row + count->rows, width_, values_, place_, &blank_before, base_ + size_);
            if (kind == Line::bad)
                return false;
            count->rows += kind == Line::row;
        }
        *end = p;
        return true;
    }

    // The rows of the parts before `part` once the counts of all of them are known (rows_ where those known already
    // reach it: the part is past the last row), else -1, or, where `wait`, once they are (-1: the walk declined).
    Py_ssize_t rows_before(Py_ssize_t part, bool wait)
    {
        for (;;) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                if (known_ >= part)
                    return prefix_rows_[part];
                if (prefix_rows_.back() >= rows_)
                    return rows_;
            }
            if (!wait || declined_.load())
                return -1;
            std::this_thread::yield();
        }
    }

    void publish(Py_ssize_t part, const Count &count)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (static_cast<Py_ssize_t>(counts_.size()) <= part)
            counts_.resize(part + 1), counted_.resize(part + 1, false);
        counts_[part] = count;
        counted_[part] = true;
        for (; known_ < static_cast<Py_ssize_t>(counted_.size()) && counted_[known_]; ++known_) {
            prefix_rows_.push_back(prefix_rows_[known_] + counts_[known_].rows);
            prefix_lines_.push_back(prefix_lines_[known_] + counts_[known_].lines);
        }
    }

    const char *const base_;
    const Py_ssize_t start_, size_, rows_, width_;
    double *const values_;
    const RowPlace place_;
    const Py_ssize_t max_line_, part_bytes_;
    const RowParser parse_row_;
    bool direct_ = true;
    std::vector<long long> *times_ = nullptr;
    std::atomic<Py_ssize_t> next_{0};
    std::atomic<bool> declined_{false};
    std::mutex mutex_;  // guards what follows
    std::vector<Count> counts_;
    std::vector<bool> counted_;
    std::vector<Py_ssize_t> prefix_rows_{0}, prefix_lines_{0};  // the rows and lines of the parts before each part up to known_
    Py_ssize_t known_ = 0, end_ = -1, lines_ = 0;
};

PyObject *parse_walk(PyObject *, PyObject *args)
{
    PyObject *pool_obj, *data_obj, *out_obj;
    Py_ssize_t start, rows, width, max_line, part_bytes;
    RowPlace place;
    int separated = 0, timed = 0;
    if (!PyArg_ParseTuple(args, "O!OnnnOLLpnnp:parse_walk", &PoolType, &pool_obj, &data_obj, &start, &rows, &width, &out_obj,
                          &place.first_row, &place.matrix_rows, &separated, &max_line, &part_bytes, &timed))
        return nullptr;
    place.separated = separated;
    place.bound = start;
    cnnlab::Pool *pool = reinterpret_cast<PoolObject *>(pool_obj)->pool;
    if (!pool) {
        PyErr_SetString(PyExc_ValueError, "parse_walk: the pool is closed");
        return nullptr;
    }
    Buffer data, out;
    if (!data.get(data_obj, PyBUF_SIMPLE) || !float64_out(out_obj, &out, "parse_walk"))
        return nullptr;
    if (width < 1 || rows < 0 || max_line < 0 || part_bytes < 1 || start < 0 || start > data.view.len || place.first_row < 0) {
        PyErr_Format(PyExc_ValueError, "parse_walk: start %zd, rows %zd, width %zd, first row %lld, max_line_bytes %zd or part_bytes "
                     "%zd out of range for %zd bytes", start, rows, width, place.first_row, max_line, part_bytes, data.view.len);
        return nullptr;
    }
    if (out.view.len / 8 / width < rows) {
        PyErr_Format(PyExc_ValueError, "parse_walk: out holds %zd values, %zd rows need %zd", out.view.len / 8, rows, rows * width);
        return nullptr;
    }
    part_bytes = std::min(part_bytes, std::max<Py_ssize_t>(data.view.len - start, 1));  // a part past the data's end: none
    Walk walk(static_cast<const char *>(data.view.buf), start, data.view.len, rows, width, static_cast<double *>(out.view.buf), place,
              max_line, part_bytes);
    std::vector<long long> times;
    Py_ssize_t end, lines = 0;
    Py_BEGIN_ALLOW_THREADS
    end = walk.run(*pool, &lines, timed ? &times : nullptr);
    Py_END_ALLOW_THREADS
    if (!timed)
        return Py_BuildValue("(nnO)", end, lines, Py_None);
    return Py_BuildValue("(nny#)", end, lines, reinterpret_cast<const char *>(times.data()), static_cast<Py_ssize_t>(times.size() * 8));
}

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
                const long long first = bounds[3 * i + 2], room = (i + 1 < count ? bounds[3 * i + 5] : rows) - first;
                Py_ssize_t needed;
                RowPlace place = span;
                place.first_row += first;
                const Py_ssize_t bad =
                    parse_range(base, bounds[3 * i], bounds[3 * i + 1], width, values + first * width, room, &needed, place, limit);
                if (times)
                    times[4 * i + 3] = monotonic_ns();
                if (needed > room)
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
        PyErr_Format(PyExc_ValueError, "parse_pieces: piece %zd holds more rows than its room in out", overfull.load());
        return nullptr;
    }
    return PyLong_FromSsize_t(first_bad.load() < count ? first_bad.load() : -1);
}

// The bench's peer, not cnnlab's parser: the text as a C++ user would parse it with the standard library, each
// field split at ',' and '\n' and handed to std::from_chars (libstdc++ 12: correctly rounded), blank lines skipped;
// no rule of the lab's format checked beyond what from_chars refuses. The values written, or -1 where from_chars
// refused a field or out ran out of room.
long long from_chars_range(const char *p, const char *end, double *out, long long room)
{
    long long count = 0;
    while (p < end) {
        const char *field_end = p;
        while (field_end < end && *field_end != ',' && *field_end != '\n')
            ++field_end;
        if (field_end > p) {
            if (count == room)
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

PyObject *parser_isa(PyObject *, PyObject *) { return PyUnicode_FromString(row_kernel.load()->name); }

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

PyMethodDef methods[] = {
    {"scan_rows", scan_rows, METH_VARARGS,
     "scan_rows(data, start, rows, max_line_bytes) -> (end, rows_found, lines_passed)\n\n"
     "Walk '\\n'-ended lines from `start` until `rows` non-blank ones are taken. A line longer than\n"
     "max_line_bytes gives (-1, rows_found, index of that line counted from start)."},
    {"summarize", summarize, METH_VARARGS,
     "summarize(data, start, end) -> (newlines, head_ink, tail_ink, inner, first, last, longest)\n\n"
     "What the lines of data[start:end] say, for combining with the summaries of the ranges beside it."},
    {"read_summarized", read_summarized, METH_VARARGS,
     "read_summarized(fd, window, at, nbytes, offset, threads) -> (count, parts)\n\n"
     "Fill window[at:at + nbytes] from fd at offset with `threads` reads at once, each part summarized."},
    {"summarize_parts", summarize_parts, METH_VARARGS,
     "summarize_parts(data, start, end, threads) -> (count, parts)\n\n"
     "data[start:end] summarized in parts of 1 MB on `threads` threads, as read_summarized's parts."},
    {"parse_rows", parse_rows, METH_VARARGS,
     "parse_rows(data, start, end, width, out[, bound, first_row, matrix_rows, separated]) -> int\n\n"
     "Parse the non-blank lines of data[start:end] as `width` numbers each into the float64 buffer\n"
     "`out`; -1 if all were good, else the index among the non-blank lines of the first bad one."},
    {"parse_walk", parse_walk, METH_VARARGS,
     "parse_walk(pool, data, start, rows, width, out, first_row, matrix_rows, separated, max_line_bytes, part_bytes, timed)\n"
     "    -> (end, lines, times)\n\n"
     "parse_rows of the next `rows` non-blank lines from `start`, their end found by the walk itself on the pool's threads;\n"
     "(-1, 0, times) where a line is bad or too long, or the data ends first."},
    {"parse_pieces", parse_pieces, METH_VARARGS,
     "parse_pieces(pool, data, pieces, width, out[, bound, first_row, matrix_rows, separated, times]) -> int\n\n"
     "parse_rows for every piece of `pieces` (an int64 array of (start, end, first row) triples; a piece's rows run to the next\n"
     "piece's first row, the last's to the end of `out`), on the pool's threads; -1 if all were good, else the first bad piece."},
    {"format_rows", format_rows, METH_O,
     "format_rows(values) -> str\n\n"
     "A C-contiguous 2-D float64 array as CSV lines, each value as repr() writes it."},
    {"parse_field", parse_field, METH_O,
     "parse_field(data) -> (kind, value)\n\n"
     "One field: (0, value) proved by lab_csv.h, (1, value) converted by std::from_chars, (2, None) refused."},
    {"from_chars_pieces", from_chars_pieces, METH_VARARGS,
     "from_chars_pieces(pool, data, pieces, width, out) -> int\n\n"
     "The bench's peer, not cnnlab's parser: each piece's fields split at ',' and '\\n' and read by std::from_chars, on the\n"
     "pool's threads; a piece's values go to out from its first row * width on. The values written, or -1."},
    {"parser_isa", parser_isa, METH_NOARGS,
     "parser_isa() -> str\n\n"
     "The instruction set of the row parser in use: one of CPU_ISAS (at first the widest)."},
    {"use_isa", use_isa, METH_O,
     "use_isa(name) -> None\n\n"
     "Parse rows with the row parser of `name`, one of CPU_ISAS (for every thread, from the next call on)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cnnlab.files._lab_csv",
    "The lab's CSV walked and parsed natively (kernel/lab_csv.h's rules), the GIL released.", -1, methods,
    nullptr,           nullptr,
    nullptr,           nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__lab_csv(void)
{
    PoolType.tp_name = "cnnlab.files._lab_csv.Pool";
    PoolType.tp_basicsize = sizeof(PoolObject);
    PoolType.tp_flags = Py_TPFLAGS_DEFAULT;
    PoolType.tp_doc = "Pool(threads): threads that parse_pieces runs on (the caller's among them).";
    PoolType.tp_new = PyType_GenericNew;
    PoolType.tp_init = reinterpret_cast<initproc>(Pool_init);
    PoolType.tp_dealloc = reinterpret_cast<destructor>(Pool_dealloc);
    PoolType.tp_methods = Pool_methods;
    if (PyType_Ready(&PoolType) < 0)
        return nullptr;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return nullptr;
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "Pool", reinterpret_cast<PyObject *>(&PoolType)) < 0) {
        Py_DECREF(&PoolType);
        Py_DECREF(m);
        return nullptr;
    }
    row_kernel.store(&widest_runnable(row_kernels));
    if (add_isa_names(m, row_kernels) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    if (PyModule_AddIntConstant(m, "FIELD_OK", LAB_FIELD_OK) < 0 || PyModule_AddIntConstant(m, "FIELD_HOST", LAB_FIELD_HOST) < 0 ||
        PyModule_AddIntConstant(m, "FIELD_BAD", LAB_FIELD_BAD) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
