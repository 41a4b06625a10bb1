// A table of kernels, one entry per instruction set, widest first, as both native modules keep them (the forward's
// kernels, the CSV row parsers): each entry has `name` (CNNLAB_CPU_ISA's word) and `runs_here()`. What a module does
// with such a table beyond its own kernels is here once: the widest entry this CPU runs, and the names as ISAS/CPU_ISAS.

#ifndef CNNLAB_ISA_TABLE_H
#define CNNLAB_ISA_TABLE_H

#include <Python.h>

#include <cstddef>

// The widest entry this CPU runs; the last (the baseline, which runs everywhere) if none says so.
template <typename Kernel, std::size_t N> const Kernel &widest_runnable(const Kernel (&table)[N])
{
    for (const Kernel &kernel : table)
        if (kernel.runs_here())
            return kernel;
    return table[N - 1];
}

// The module's ISAS (every entry's name, widest first) and CPU_ISAS (those this CPU runs). 0, or -1 with an exception set.
template <typename Kernel, std::size_t N> int add_isa_names(PyObject *module, const Kernel (&table)[N])
{
    for (const bool here_only : {false, true}) {
        PyObject *names = PyList_New(0);
        for (const Kernel &kernel : table) {
            if (!names || (here_only && !kernel.runs_here()))
                continue;
            PyObject *name = PyUnicode_FromString(kernel.name);
            if (!name || PyList_Append(names, name) < 0)
                Py_CLEAR(names);
            Py_XDECREF(name);
        }
        PyObject *tuple = names ? PyList_AsTuple(names) : nullptr;
        Py_XDECREF(names);
        if (!tuple || PyModule_AddObject(module, here_only ? "CPU_ISAS" : "ISAS", tuple) < 0) {
            Py_XDECREF(tuple);
            return -1;
        }
    }
    return 0;
}

#endif  // CNNLAB_ISA_TABLE_H
