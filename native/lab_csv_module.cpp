// cnnlab.files._lab_csv: the lab's CSV text walked and parsed at C speed, with the GIL released, so that several
// Python threads parse blocks of one file on several cores. The format's rules (blank lines, CRLF, text bytes, the
// number grammar and its exact conversion) are kernel/lab_csv.h's, which the CUDA parser (kernel/csv.cu) shares.
//
// This file is the module's glue: its table of functions and its init. The stages are headers, each included once,
// here, so that the compiler sees the parser whole as one translation unit; each opens with what it owns, and each
// Python function's contract stands beside it (cnnlab/files/_lab_csv.pyi gives their types):
//
//   lab_csv_python.h      what the stages share with Python: buffers, the float64 `out` check, the Pool type, the clock
//   lab_csv_row.h         one row into `width` doubles: the row parsers and their table (parse_field, parser_isa, use_isa)
//   lab_csv_simd.h          the AVX2 and AVX-512 steps the vector row parsers are made of
//   lab_csv_lines.h       the line: its end, its ink, the blank-line rule's place, parse_line
//   lab_csv_reads.h       the reads and summaries that cut a text (scan_rows, summarize, read_summarized, summarize_parts)
//   lab_csv_ranges.h      the parse of ranges already cut (parse_rows, parse_pieces)
//   lab_csv_walk.h        the parse that finds its own end (parse_walk)
//   lab_csv_format.h      the output's writer (format_rows)
//   lab_csv_from_chars.h  the bench's peer, std::from_chars field by field (from_chars_pieces)

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "isa_table.h"
#include "lab_csv.h"
#include "lab_csv_python.h"
#include "lab_csv_row.h"
#include "lab_csv_lines.h"
#include "lab_csv_reads.h"
#include "lab_csv_ranges.h"
#include "lab_csv_walk.h"
#include "lab_csv_format.h"
#include "lab_csv_from_chars.h"

namespace {

PyMethodDef methods[] = {
    {"scan_rows", scan_rows, METH_VARARGS, scan_rows_doc},
    {"summarize", summarize, METH_VARARGS, summarize_doc},
    {"read_summarized", read_summarized, METH_VARARGS, read_summarized_doc},
    {"summarize_parts", summarize_parts, METH_VARARGS, summarize_parts_doc},
    {"parse_rows", parse_rows, METH_VARARGS, parse_rows_doc},
    {"parse_walk", parse_walk, METH_VARARGS, parse_walk_doc},
    {"parse_pieces", parse_pieces, METH_VARARGS, parse_pieces_doc},
    {"format_rows", format_rows, METH_O, format_rows_doc},
    {"parse_field", parse_field, METH_O, parse_field_doc},
    {"from_chars_pieces", from_chars_pieces, METH_VARARGS, from_chars_pieces_doc},
    {"parser_isa", parser_isa, METH_NOARGS, parser_isa_doc},
    {"use_isa", use_isa, METH_O, use_isa_doc},
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
    if (!ready_pool_type())
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
