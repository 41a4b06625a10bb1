// The line, the unit that the reads, the range parsers and the walk all step by: where a line ends within the longest
// allowed (line_end_within), whether it holds a byte that is not blank (holds_ink), where a row stands among the
// matrices for kernel/lab_csv.h's blank-line rule (RowPlace, line_before_is_blank), and parse_line, one line parsed
// with the row parser in use. No Python here.

#ifndef LAB_CSV_LINES_H
#define LAB_CSV_LINES_H

#include <Python.h>

#include <cstring>

#include "lab_csv.h"
#include "lab_csv_row.h"

namespace {

// The '\n' that ends the line at p, looked for in the `left` bytes there: null where none comes before they end, or
// within max_line + 1 bytes (a '\n' further away ends a line too long).
inline const char *line_end_within(const char *p, Py_ssize_t left, Py_ssize_t max_line)
{
    return static_cast<const char *>(std::memchr(p, '\n', left <= max_line ? left : max_line + 1));
}

// Whether [p, nl) holds a byte that is not blank (a line's first byte usually decides).
inline bool holds_ink(const char *p, const char *nl)
{
    return nl != p && !(lab_is_blank_byte((unsigned char)*p) && lab_line_is_blank(p, nl));
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

}  // namespace

#endif  // LAB_CSV_LINES_H
