// The walk: the next `rows` rows from a line start parsed with no cut made first, the text split at byte offsets into
// parts that the pool's threads claim, count, and parse in their place once the rows before them are known (Walk);
// parse_walk is its Python entry. Where it declines, the caller cuts the range (lab_csv_reads.h) and parses it as
// before (lab_csv_ranges.h).

#ifndef LAB_CSV_WALK_H
#define LAB_CSV_WALK_H

#include <Python.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "lab_csv_lines.h"
#include "lab_csv_python.h"
#include "lab_csv_row.h"
#include "pool.h"

namespace {

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

    // The lines of [first, stop) (stop a line start or the data's end) from the walk's row `row`, up to `capacity` rows:
    // counted, or parsed. False where a line is bad (parsed) or longer than max_line; *end: where the walk stopped
    // (stop, or past the last row's '\n' where the rows ran out; a tail with no '\n' is not taken).
    bool walk_lines(Py_ssize_t first, Py_ssize_t stop, Py_ssize_t row, Py_ssize_t capacity, bool parse, Count *count, const char **end) const
    {
        const char *p = base_ + first, *const limit = base_ + stop;
        bool blank_before = parse && place_.matrix_rows > 0 && line_before_is_blank(base_, start_, first);
        while (p < limit && count->rows < capacity) {
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

// parse_walk(pool, data, start, rows, width, out, first_row, matrix_rows, separated, max_line_bytes, part_bytes, timed)
//         -> (end, lines, times)
//     parse_rows of the next `rows` non-blank lines from `start` (a line start, the start of a span: the blank-line rule
//     looks back no further), their end found by the walk itself, on the pool's threads: the text is cut at byte
//     offsets into parts of part_bytes, each thread counts the rows of a part it claims, then parses it into its place once
//     the rows before it are known (on one thread, with no count first: the text read once). Where parse_rows needs
//     its range cut first (scan_rows, or the summaries of a read), this reads the text once or twice, in cache.
//     end: just past the last row's '\n'; lines: the lines walked to it, blank ones included (as scan_rows counts
//     them). (-1, 0, ...) where the walk declines: a bad line (as parse_rows finds them), a line longer than
//     max_line_bytes, or data ending before `rows` rows; any row may have been written. The caller then cuts the
//     range and parses it as before, which finds what it found. times (where `timed`, else None): bytes of int64,
//     (pool worker, thread id, start ns, end ns, bytes parsed) for each part parsed.
//     ValueError: out holds fewer than rows * width values, or arguments out of range.
PyDoc_STRVAR(parse_walk_doc,
             "parse_walk(pool, data, start, rows, width, out, first_row, matrix_rows, separated, max_line_bytes, part_bytes, timed)\n"
             "    -> (end, lines, times)\n\n"
             "parse_rows of the next `rows` non-blank lines from `start`, their end found by the walk itself on the pool's threads;\n"
             "(-1, 0, times) where a line is bad or too long, or the data ends first.");
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

}  // namespace

#endif  // LAB_CSV_WALK_H
