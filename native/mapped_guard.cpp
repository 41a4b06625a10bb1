// cnnlab.files._mapped_guard: a file mapped into memory, read without the risk of a crash.
//
// A mapped file that another process truncates turns every read of its lost pages into SIGBUS,
// which ends the process without a word. While a range is guarded, this module's SIGBUS handler
// puts a page of zeros in place of each lost page it faults on (the read then goes on) and marks
// the range faulted; the caller checks the mark, and the file's size, before trusting what it
// computed, and refuses the run in one line where either says the file shrank. A SIGBUS anywhere
// else goes to the handler installed before this one (Python's faulthandler, say), or ends the
// process as it would have.
//
// Python API:
//   MappedFile(fd, length)        the first `length` bytes of the open file `fd`, mapped read-only
//                                 and guarded; a read-only buffer (numpy.frombuffer takes it), so
//                                 every view of it keeps the mapping, and its guard, alive
//   .faulted -> bool              whether a page of it was lost (read as zeros) since it was made
//   .drop(offset, length)         unmap the whole pages within those bytes from this process (the
//                                 page cache keeps them; a later read maps them again), so that a
//                                 run's resident memory stays a few batches however large the file
//
// The handler is installed with the first MappedFile (again with a later one, where other code
// has put its own in place since) and stays: removing it while another thread may fault would
// race, and with nothing guarded it only passes each signal on.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace {

constexpr int kRanges = 64;  // guarded at once: a run maps one file; tests and the API a few more

struct Range {
    std::atomic<uintptr_t> begin{0};  // 0: a free slot
    std::atomic<uintptr_t> end{0};
    std::atomic<bool> faulted{false};
};

Range ranges[kRanges];
struct sigaction previous;  // the handler before ours, called for every SIGBUS outside a guarded range
uintptr_t page_bytes;  // set once, at the module's import, before any handler can run

// What would have happened without this handler. A fault (si_code > 0) the kernel delivers even where SIGBUS is
// ignored, and it ends the process; so does a SIGBUS sent by kill under the default action. Either is raised again
// under the default action: blocked while this handler runs, it ends the process as it returns.
void pass_on(int signum, siginfo_t *info, void *context)
{
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(signum, info, context);
        return;
    }
    if (previous.sa_handler == SIG_IGN && info->si_code <= 0)
        return;
    if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
        signal(signum, SIG_DFL);
        raise(signum);
        return;
    }
    previous.sa_handler(signum);
}

void on_bus_error(int signum, siginfo_t *info, void *context)
{
    if (info->si_code <= 0) {  // sent by a process (kill, raise): its address means nothing
        pass_on(signum, info, context);
        return;
    }
    const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Range &range : ranges) {
        const uintptr_t begin = range.begin.load(std::memory_order_acquire);
        if (begin != 0 && begin <= address && address < range.end.load(std::memory_order_acquire)) {
            // A private page of zeros over the lost one (mmap is a plain system call: safe in a handler).
            void *page = reinterpret_cast<void *>(address & ~(page_bytes - 1));
            if (mmap(page, page_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
                break;  // no memory for it: the signal takes its course
            range.faulted.store(true, std::memory_order_release);
            return;
        }
    }
    pass_on(signum, info, context);
}

// Ours on top, whatever came before: checked at every mapping, since faulthandler.enable() or disable() (or any
// other code) may have put its own in place since the last one; what it put becomes the handler passed on to.
bool install_handler()
{
    struct sigaction current;
    if (sigaction(SIGBUS, nullptr, &current) != 0)
        return false;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_bus_error)
        return true;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_bus_error;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGBUS, &action, &previous) == 0;
}

// The first free slot, filled (the caller holds the GIL: only the handler reads at once); null if none.
Range *guard(uintptr_t begin, uintptr_t end)
{
    for (Range &range : ranges) {
        if (range.begin.load() != 0)
            continue;
        range.faulted.store(false);
        range.end.store(end);
        range.begin.store(begin, std::memory_order_release);  // last: the range is whole
        return &range;
    }
    return nullptr;
}

struct MappedFileObject {
    PyObject_HEAD
    char *data;
    Py_ssize_t length;
    Range *range;
};

void mapped_file_dealloc(PyObject *self)
{
    MappedFileObject *mapped = reinterpret_cast<MappedFileObject *>(self);
    if (mapped->range != nullptr)
        mapped->range->begin.store(0, std::memory_order_release);  // unguarded before unmapped: nothing reads it now
    if (mapped->data != nullptr)
        munmap(mapped->data, static_cast<size_t>(mapped->length));
    Py_TYPE(self)->tp_free(self);
}

PyObject *mapped_file_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    int fd;
    Py_ssize_t length;
    static const char *keywords[] = {"fd", "length", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "in", const_cast<char **>(keywords), &fd, &length))
        return nullptr;
    if (length <= 0) {
        PyErr_SetString(PyExc_ValueError, "MappedFile needs a length above 0");
        return nullptr;
    }
    if (!install_handler())
        return PyErr_SetFromErrno(PyExc_OSError);
    MappedFileObject *mapped = reinterpret_cast<MappedFileObject *>(type->tp_alloc(type, 0));
    if (mapped == nullptr)
        return nullptr;
    void *data = mmap(nullptr, static_cast<size_t>(length), PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
        Py_DECREF(mapped);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    mapped->data = static_cast<char *>(data);
    mapped->length = length;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
    mapped->range = guard(begin, begin + static_cast<uintptr_t>(length));
    if (mapped->range == nullptr) {
        Py_DECREF(mapped);
        PyErr_Format(PyExc_OSError, "more than %d mapped files at once", kRanges);
        return nullptr;
    }
    return reinterpret_cast<PyObject *>(mapped);
}

int mapped_file_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    MappedFileObject *mapped = reinterpret_cast<MappedFileObject *>(self);
    return PyBuffer_FillInfo(view, self, mapped->data, mapped->length, 1, flags);
}

PyObject *mapped_file_faulted(PyObject *self, void *)
{
    return PyBool_FromLong(reinterpret_cast<MappedFileObject *>(self)->range->faulted.load(std::memory_order_acquire));
}

PyObject *mapped_file_drop(PyObject *self, PyObject *args)
{
    MappedFileObject *mapped = reinterpret_cast<MappedFileObject *>(self);
    Py_ssize_t offset, length;
    if (!PyArg_ParseTuple(args, "nn", &offset, &length))
        return nullptr;
    if (offset < 0 || length < 0 || offset > mapped->length - length) {
        PyErr_SetString(PyExc_ValueError, "drop() past the mapping");
        return nullptr;
    }
    const uintptr_t start = reinterpret_cast<uintptr_t>(mapped->data + offset);
    const uintptr_t first = (start + page_bytes - 1) & ~(page_bytes - 1);  // whole pages only: their neighbours' bytes stay
    const uintptr_t end = (start + static_cast<uintptr_t>(length)) & ~(page_bytes - 1);
    if (first < end) {
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = madvise(reinterpret_cast<void *>(first), end - first, MADV_DONTNEED);
        Py_END_ALLOW_THREADS
        if (failed != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

PyMethodDef mapped_file_methods[] = {
    {"drop", mapped_file_drop, METH_VARARGS,
     "drop(offset, length)\n\nUnmap the whole pages within those bytes from this process; the page cache keeps them."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef mapped_file_getset[] = {
    {"faulted", mapped_file_faulted, nullptr, "Whether a page was lost to a truncation (and read as zeros) since the file was mapped.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyBufferProcs mapped_file_buffer = {mapped_file_getbuffer, nullptr};

PyTypeObject MappedFileType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cnnlab.files._mapped_guard",
    "Files mapped into memory and read without a crash where another process truncates them.", -1,
    nullptr, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__mapped_guard(void)
{
    page_bytes = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    MappedFileType.tp_name = "cnnlab.files._mapped_guard.MappedFile";
    MappedFileType.tp_basicsize = sizeof(MappedFileObject);
    MappedFileType.tp_flags = Py_TPFLAGS_DEFAULT;
    MappedFileType.tp_doc = "MappedFile(fd, length): a file's first bytes mapped read-only, guarded against truncation.";
    MappedFileType.tp_new = mapped_file_new;
    MappedFileType.tp_dealloc = mapped_file_dealloc;
    MappedFileType.tp_as_buffer = &mapped_file_buffer;
    MappedFileType.tp_getset = mapped_file_getset;
    MappedFileType.tp_methods = mapped_file_methods;
    if (PyType_Ready(&MappedFileType) < 0)
        return nullptr;
    PyObject *created = PyModule_Create(&module);
    if (created == nullptr)
        return nullptr;
    Py_INCREF(&MappedFileType);
    if (PyModule_AddObject(created, "MappedFile", reinterpret_cast<PyObject *>(&MappedFileType)) < 0) {
        Py_DECREF(&MappedFileType);
        Py_DECREF(created);
        return nullptr;
    }
    return created;
}
