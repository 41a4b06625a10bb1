// What the CSV parser's stages share with Python: Buffer, a buffer held for one call (every `data` a function takes is
// any object with a contiguous buffer of bytes: bytes, bytearray, memoryview, a uint8 numpy array; its offsets are byte
// offsets into it); float64_out, the check of the `out` that rows are written to; the Pool type, the threads that
// parse_pieces, parse_walk and from_chars_pieces run on; and monotonic_ns, the clock of their traces.
//
// This and the other stage headers (lab_csv_*.h, lab_csv_simd.h aside) are included once, by lab_csv_module.cpp: the
// parser is one translation unit, and what they define is internal to it (namespace {}).

#ifndef LAB_CSV_PYTHON_H
#define LAB_CSV_PYTHON_H

#include <Python.h>

#include <time.h>

#include <cstring>
#include <new>

#include "pool.h"

namespace {

// A buffer of a Python object, held for one call and released when it goes.
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
        cnnlab::release(self->pool);
        Py_END_ALLOW_THREADS
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

// The Pool type made ready to add to the module; false with the error set.
bool ready_pool_type()
{
    PoolType.tp_name = "cnnlab.files._lab_csv.Pool";
    PoolType.tp_basicsize = sizeof(PoolObject);
    PoolType.tp_flags = Py_TPFLAGS_DEFAULT;
    PoolType.tp_doc = "Pool(threads): threads that parse_pieces runs on (the caller's among them).";
    PoolType.tp_new = PyType_GenericNew;
    PoolType.tp_init = reinterpret_cast<initproc>(Pool_init);
    PoolType.tp_dealloc = reinterpret_cast<destructor>(Pool_dealloc);
    PoolType.tp_methods = Pool_methods;
    return PyType_Ready(&PoolType) == 0;
}

// Nanoseconds on CLOCK_MONOTONIC, the clock of Python's time.perf_counter_ns on Linux, so a trace's native spans
// line up with its Python ones.
long long monotonic_ns()
{
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

}  // namespace

#endif  // LAB_CSV_PYTHON_H
