// cnnlab.cpu._forward: the network's forward on every core, bit for bit what the lab's cpu.rs computes.
//
// Build:  pip install -e .   (setup.py; the network's sizes come from cnnlab/network.py as -D flags,
//         and -ffp-contract=off keeps every multiply and add rounded on its own)
// Check:  pytest tests/test_forward.py   (against the numpy forward and tests/reference.py, bit for bit)
// Time:   python -m cnnlab bench --rows cpu   (against the plain loop, PyTorch and the memory-read bound)
//
// Kernels (native/cpu_forward_kernels.h), compiled for AVX-512, AVX2 and plain x86-64 (SSE2):
//   forward_group   a group of images a vector (8 on AVX-512, 4 on AVX2, 2 on x86-64): a band of 5 rows
//                   transposed into the elements (log2(elements) rounds of constant shuffles a block), the 10
//                   filters' sums of its 20 patches in register blocks, ReLU, and the output layer's 10
//                   sums over the 4000 activations; where asked, the elements that may hold a NaN or an infinity
//   plain_group     cpu.rs's loops as written, 8 images a vector gathered value by value (the peer)
//   read_values     every double read once (the memory-read bound)
// The forward runs the widest kernels this CPU has, or those named at construction (CNNLAB_CPU_ISA, in
// cnnlab/cpu/backend.py); the plain loop runs the same instruction set, as -march=native would build it on a
// machine whose widest that is (measured on the Zen 3 machine: the same rate as the plain loop compiled with
// -march=native), and read_values the widest (the memory-read bound is the machine's, whatever the kernels).
//
// Napkin math: an image is 100,000 conv taps and 40,000 weights, each a multiply and an add: 280,000
// FP64 operations, 35,000 8-wide instructions. A core that issues two of them a cycle (AVX-512 on
// Sapphire Rapids or Zen 4) needs 17,500 cycles, ~170,000 images/s at 3 GHz, plus ~2,000 cycles of
// shuffles; each image is 80,000 bytes read once, so 16 such cores would want 200 GB/s: memory,
// not arithmetic, bounds a big machine. AVX2 on Zen 3 (4 elements; two multiplies and two adds a cycle):
// 35,000 multiplies, again 17,500 cycles, ~180,000 images/s at 3.2 GHz. Measured on one core: ~112,000
// with the images in cache (the conv issues ~1.4 multiplies a cycle: gcc keeps few taps in the 16
// registers, so a multiply takes a load, and the loads bound it), 70,000-95,000 reading them from memory,
// where a group of 4 waits ~16 us for its 320 KB (~20 GB/s a core) unless its next band is prefetched.
//
// Python API (arrays: C-contiguous float64, checked here):
//   Forward(filters, weights, threads, isa=None)   filters (10, 5, 5), weights (10, 4000): copied; threads >= 1;
//                                            isa: one of ISAS and CPU_ISAS (None: the widest this CPU runs)
//   .compute(images, out, check) -> int      images (n, 100, 100) -> out (n, 10); -1, or where `check` is
//                                            true the index of the first image that holds a NaN or an
//                                            infinity (out is then undefined)
//   .compute_plain(images, out)              the same outputs by the plain loop, in isa's instructions
//   .read(values) -> float                   the sum of every value, read once on the threads
//   .close()                                  stops the threads (also when the object goes)
//   .isa                                      "avx512", "avx2" or "x86-64": the forward's kernels
//   .threads                                  the threads a call runs on (the caller's among them)
//   ISAS, CPU_ISAS                            every kernels' name, and those this CPU runs; widest first

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "isa_table.h"
#include "pool.h"

#if !defined(INPUT_DIM) || !defined(FILTER_DIM) || !defined(CONV_LAYER_SIZE) || !defined(CONV_OUT_DIM) || \
    !defined(OUT_NEURON_DIM) || !defined(OUT_LAYER_SIZE)
#error "the network's sizes come from cnnlab/network.py as -D flags (setup.py)"
#endif

namespace {

constexpr long IMAGE_VALUES = (long)INPUT_DIM * INPUT_DIM;
constexpr int PLAIN_GROUP = 8;  // the plain loop's images a vector, whatever the kernels' width
constexpr int MAX_LANES = 8;  // the widest kernels' images a vector (AVX-512)

// A thread's work arrays: a band of the group's images (32 KB at 8 elements, in L1) and its activations (256 KB, in L2).
struct Scratch {
    alignas(64) double band[FILTER_DIM * INPUT_DIM * MAX_LANES];
    alignas(64) double act[OUT_NEURON_DIM * MAX_LANES];
};

alignas(64) double ZERO_IMAGE[IMAGE_VALUES];  // stands in for the images past a batch's end (zeros, never written)

// Register blocks: FILTER_BLOCK x COLUMN_BLOCK sums of LANES images in flight, each tap's filter values and
// band values loaded once per block. AVX-512 (32 registers): 10 x 2 = 20 sums; measured on an AVX-512 2-core
// machine, images/s on 2 threads: 10 x 2 211k, 10 x 1 200k, 5 x 4 198k, 2 x 4 188k, 5 x 2 180k. AVX2 and
// x86-64 (16 registers): 2 x 5 = 10 sums, enough to hide the adds' latency (3 cycles, 2 a cycle); measured on
// the Zen 3 2-core machine, one thread: 2 x 5, 2 x 4, 1 x 5, 5 x 2 and 10 x 1 within the noise (76k-83k),
// the output layer's sums 5 neurons at a time rather than 10 0.9x.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq")
namespace avx512 {
#define LANES 8
#define FILTER_BLOCK 10
#define COLUMN_BLOCK 2
#define NEURON_BLOCK 10
#include "cpu_forward_kernels.h"
#undef LANES
#undef FILTER_BLOCK
#undef COLUMN_BLOCK
#undef NEURON_BLOCK
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2 {
#define LANES 4
#define FILTER_BLOCK 2
#define COLUMN_BLOCK 5
#define NEURON_BLOCK 10
#include "cpu_forward_kernels.h"
#undef LANES
#undef FILTER_BLOCK
#undef COLUMN_BLOCK
#undef NEURON_BLOCK
}  // namespace avx2
#pragma GCC pop_options

namespace baseline {
#define LANES 2
#define FILTER_BLOCK 2
#define COLUMN_BLOCK 5
#define NEURON_BLOCK 10
#include "cpu_forward_kernels.h"
#undef LANES
#undef FILTER_BLOCK
#undef COLUMN_BLOCK
#undef NEURON_BLOCK
}  // namespace baseline

// Image i of a group holds a NaN or an infinity: the exact look behind forward_group's suspect elements, which
// an overflowing sum also raises.
bool holds_nonfinite(const double *image)
{
    for (long k = 0; k < IMAGE_VALUES; ++k)
        if (!std::isfinite(image[k]))
            return true;
    return false;
}

// One instruction set's kernels, with the group's outputs written out element by element.
struct Kernels {
    const char *name;  // as CNNLAB_CPU_ISA names it
    bool (*runs_here)();  // whether this CPU has the instructions
    int width;  // the forward's images a group
    // The group's outputs into out[0 .. count * 10); the elements that hold a NaN or an infinity as a bit mask.
    unsigned (*forward)(const double *const *, const double *, const double *, Scratch *, bool, double *, int);
    void (*plain)(const double *const *, const double *, const double *, Scratch *, double *, int);
    double (*read)(const double *, long);
};

#define CNNLAB_KERNELS(ISA, ATTRIBUTES)                                                                                            \
    ATTRIBUTES unsigned ISA##_forward(const double *const *images, const double *filters, const double *weights_t, Scratch *s, \
                                      bool check, double *out, int count)                                                      \
    {                                                                                                                           \
        ISA::vec outputs[OUT_LAYER_SIZE];                                                                                       \
        const ISA::veci suspect = ISA::forward_group(images, filters, weights_t, s, check, outputs);                           \
        ISA::write_outputs(outputs, count, out);                                                                                  \
        unsigned mask = 0;                                                                                                      \
        for (int i = 0; i < count; ++i)                                                                                         \
            mask |= (suspect[i] && holds_nonfinite(images[i])) << i;                                                            \
        return mask;                                                                                                            \
    }                                                                                                                           \
    ATTRIBUTES void ISA##_plain(const double *const *images, const double *filters, const double *weights, Scratch *s,         \
                                double *out, int count)                                                                         \
    {                                                                                                                           \
        ISA::v8 outputs[OUT_LAYER_SIZE];                                                                                        \
        ISA::plain_group(images, filters, weights, s, outputs);                                                                 \
        ISA::write_outputs(outputs, count, out);                                                                                  \
    }

CNNLAB_KERNELS(avx512, __attribute__((target("avx512f,avx512dq"))))
CNNLAB_KERNELS(avx2, __attribute__((target("avx2"))))
CNNLAB_KERNELS(baseline, )

#define CNNLAB_LANES(ISA) static_cast<int>(sizeof(ISA::vec) / sizeof(double))

const Kernels KERNELS[] = {  // widest first
    {"avx512", [] { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }, CNNLAB_LANES(avx512),
     avx512_forward, avx512_plain, avx512::read_values},
    {"avx2", [] { return static_cast<bool>(__builtin_cpu_supports("avx2")); }, CNNLAB_LANES(avx2), avx2_forward, avx2_plain,
     avx2::read_values},
    {"x86-64", [] { return true; }, CNNLAB_LANES(baseline), baseline_forward, baseline_plain, baseline::read_values},
};

// The plain loop's and read's kernels, and the forward's where none is asked for: the widest this CPU runs.
const Kernels &best_kernels() { return widest_runnable(KERNELS); }

struct Forward {
    PyObject_HEAD
    const Kernels *kernels;
    cnnlab::Pool *pool;
    std::vector<Scratch *> *scratch;  // a thread's own, made by the thread on first use
    double filters[CONV_LAYER_SIZE * FILTER_DIM * FILTER_DIM];
    double weights[OUT_LAYER_SIZE * OUT_NEURON_DIM];  // as given: (10, 4000), for the plain loop
    double weights_t[OUT_NEURON_DIM * OUT_LAYER_SIZE];  // transposed: (4000, 10)
};

struct Buffer {
    Py_buffer view;
    bool held = false;
    ~Buffer()
    {
        if (held)
            PyBuffer_Release(&view);
    }
};

// `obj` as a C-contiguous float64 buffer of `dims` dimensions whose sizes after the first are `shape`
// (the first any, written to *first); false with a Python error set otherwise.
bool float64_array(PyObject *obj, Buffer *buffer, int dims, const Py_ssize_t *shape, bool writable, Py_ssize_t *first,
                   const char *what)
{
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &buffer->view, flags) < 0)
        return false;
    buffer->held = true;
    const char *format = buffer->view.format ? buffer->view.format : "B";
    const bool float64 = buffer->view.itemsize == 8 && (!std::strcmp(format, "d") || !std::strcmp(format, "<d") || !std::strcmp(format, "=d"));
    bool shaped = buffer->view.ndim == dims;
    for (int i = 1; shaped && i < dims; ++i)
        shaped = buffer->view.shape[i] == shape[i - 1];
    if (!float64 || !shaped) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous float64 array of %d dimensions, shaped as the network's", what,
                     dims);
        return false;
    }
    *first = buffer->view.shape[0];
    return true;
}

Scratch *scratch_of(Forward *self, int worker)
{
    Scratch *&mine = (*self->scratch)[worker];
    if (!mine)
        mine = new (std::align_val_t(64)) Scratch;
    return mine;
}

// Groups of `size` images claimed by the threads as they go; the images past the end read as zeros.
template <typename Run>
void over_groups(Forward *self, const double *images, long count, int size, Run run)
{
    const long groups = (count + size - 1) / size;
    std::atomic<long> next{0};
    self->pool->run([&](int worker) {
        Scratch *scratch = scratch_of(self, worker);
        for (long group; (group = next.fetch_add(1)) < groups;) {
            const double *rows[std::max(MAX_LANES, PLAIN_GROUP)];
            const int in_group = static_cast<int>(std::min<long>(size, count - group * size));
            for (int i = 0; i < size; ++i)
                rows[i] = i < in_group ? images + (group * size + i) * IMAGE_VALUES : ZERO_IMAGE;
            run(group * size, rows, in_group, scratch);
        }
    }, static_cast<int>(std::min<long>(groups, self->pool->threads())));
}

int Forward_init(Forward *self, PyObject *args, PyObject *kwargs)
{
    PyObject *filters_obj, *weights_obj;
    int threads;
    const char *isa = nullptr;
    static const char *keywords[] = {"filters", "weights", "threads", "isa", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOi|z:Forward", const_cast<char **>(keywords), &filters_obj, &weights_obj,
                                     &threads, &isa))
        return -1;
    const Kernels *chosen = &best_kernels();
    if (isa) {
        chosen = nullptr;
        for (const Kernels &kernels : KERNELS)
            if (!std::strcmp(isa, kernels.name))
                chosen = &kernels;
        if (!chosen)
            return PyErr_Format(PyExc_ValueError, "Forward: isa must be avx512, avx2 or x86-64, not '%s'", isa), -1;
        if (!chosen->runs_here())
            return PyErr_Format(PyExc_ValueError, "Forward: this CPU cannot run the %s kernels", isa), -1;
    }
    if (threads < 1) {
        PyErr_Format(PyExc_ValueError, "Forward: threads must be at least 1, not %d", threads);
        return -1;
    }
    Buffer filters, weights;
    Py_ssize_t count;
    const Py_ssize_t filter_shape[] = {FILTER_DIM, FILTER_DIM}, weight_shape[] = {OUT_NEURON_DIM};
    if (!float64_array(filters_obj, &filters, 3, filter_shape, false, &count, "filters"))
        return -1;
    if (count != CONV_LAYER_SIZE)
        return PyErr_SetString(PyExc_ValueError, "filters must be (10, 5, 5)"), -1;
    if (!float64_array(weights_obj, &weights, 2, weight_shape, false, &count, "weights"))
        return -1;
    if (count != OUT_LAYER_SIZE)
        return PyErr_SetString(PyExc_ValueError, "weights must be (10, 4000)"), -1;
    std::memcpy(self->filters, filters.view.buf, sizeof self->filters);
    std::memcpy(self->weights, weights.view.buf, sizeof self->weights);
    for (int n = 0; n < OUT_LAYER_SIZE; ++n)
        for (int k = 0; k < OUT_NEURON_DIM; ++k)
            self->weights_t[k * OUT_LAYER_SIZE + n] = self->weights[n * OUT_NEURON_DIM + k];
    self->kernels = chosen;
    if (self->pool)  // __init__ called again
        return 0;
    try {
        self->pool = new cnnlab::Pool(threads);
        self->scratch = new std::vector<Scratch *>(self->pool->threads(), nullptr);
    } catch (const std::bad_alloc &) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void Forward_close_pool(Forward *self)
{
    if (self->pool) {
        Py_BEGIN_ALLOW_THREADS
        cnnlab::release(self->pool);
        Py_END_ALLOW_THREADS
        self->pool = nullptr;
    }
    if (self->scratch) {
        for (Scratch *scratch : *self->scratch)
            ::operator delete(scratch, std::align_val_t(64));
        delete self->scratch;
        self->scratch = nullptr;
    }
}

void Forward_dealloc(Forward *self)
{
    Forward_close_pool(self);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

bool ready(Forward *self)
{
    if (!self->pool)
        PyErr_SetString(PyExc_ValueError, "Forward is closed");
    return self->pool != nullptr;
}

// images and out, checked: (n, 100, 100) and (n, 10) for the same n.
bool batch_arrays(PyObject *args, const char *format, Buffer *images, Buffer *out, int *check, Py_ssize_t *count)
{
    PyObject *images_obj, *out_obj;
    if (!PyArg_ParseTuple(args, format, &images_obj, &out_obj, check))
        return false;
    const Py_ssize_t image_shape[] = {INPUT_DIM, INPUT_DIM}, out_shape[] = {OUT_LAYER_SIZE};
    Py_ssize_t outputs;
    if (!float64_array(images_obj, images, 3, image_shape, false, count, "images") ||
        !float64_array(out_obj, out, 2, out_shape, true, &outputs, "out"))
        return false;
    if (outputs != *count) {
        PyErr_Format(PyExc_ValueError, "out holds %zd rows for %zd images", outputs, *count);
        return false;
    }
    return true;
}

PyObject *Forward_compute(Forward *self, PyObject *args)
{
    Buffer images, out;
    int check = 0;
    Py_ssize_t count;
    if (!ready(self) || !batch_arrays(args, "OOp:compute", &images, &out, &check, &count))
        return nullptr;
    const double *values = static_cast<const double *>(images.view.buf);
    double *outputs = static_cast<double *>(out.view.buf);
    std::atomic<long> first_bad{count};
    const Kernels *kernels = self->kernels;
    Py_BEGIN_ALLOW_THREADS
    over_groups(self, values, count, kernels->width, [&](long first, const double *const *rows, int in_group, Scratch *scratch) {
        const unsigned bad = kernels->forward(rows, self->filters, self->weights_t, scratch, check, outputs + first * OUT_LAYER_SIZE, in_group);
        if (bad) {
            long index = first + __builtin_ctz(bad), seen = first_bad.load();
            while (index < seen && !first_bad.compare_exchange_weak(seen, index)) {
            }
        }
    });
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(first_bad.load() < count ? first_bad.load() : -1);
}

PyObject *Forward_compute_plain(Forward *self, PyObject *args)
{
    Buffer images, out;
    int unused = 0;
    Py_ssize_t count;
    if (!ready(self) || !batch_arrays(args, "OO:compute_plain", &images, &out, &unused, &count))
        return nullptr;
    const double *values = static_cast<const double *>(images.view.buf);
    double *outputs = static_cast<double *>(out.view.buf);
    const Kernels &kernels = *self->kernels;
    Py_BEGIN_ALLOW_THREADS
    over_groups(self, values, count, PLAIN_GROUP, [&](long first, const double *const *rows, int in_group, Scratch *scratch) {
        kernels.plain(rows, self->filters, self->weights, scratch, outputs + first * OUT_LAYER_SIZE, in_group);
    });
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject *Forward_read(Forward *self, PyObject *arg)
{
    Buffer values;
    if (!ready(self))
        return nullptr;
    if (PyObject_GetBuffer(arg, &values.view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return nullptr;
    values.held = true;
    if (values.view.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "read: values must be a C-contiguous float64 array");
        return nullptr;
    }
    const double *data = static_cast<const double *>(values.view.buf);
    const long total = values.view.len / 8;
    const int threads = self->pool->threads();
    std::vector<double> sums(threads, 0.0);
    Py_BEGIN_ALLOW_THREADS
    self->pool->run([&](int worker) {
        const long share = (total + threads - 1) / threads, start = std::min(total, worker * share);
        sums[worker] = best_kernels().read(data + start, std::min(total, start + share) - start);
    }, threads);
    Py_END_ALLOW_THREADS
    double sum = 0.0;
    for (double part : sums)
        sum += part;
    return PyFloat_FromDouble(sum);
}

PyObject *Forward_close(Forward *self, PyObject *)
{
    Forward_close_pool(self);
    Py_RETURN_NONE;
}

PyObject *Forward_isa(Forward *self, void *) { return PyUnicode_FromString(self->kernels ? self->kernels->name : "none"); }

PyObject *Forward_threads(Forward *self, void *) { return PyLong_FromLong(self->pool ? self->pool->threads() : 0); }

PyMethodDef Forward_methods[] = {
    {"compute", reinterpret_cast<PyCFunction>(Forward_compute), METH_VARARGS,
     "compute(images, out, check) -> int\n\nThe outputs of images (n, 100, 100) into out (n, 10), bit for bit cpu.rs's; -1, or "
     "where `check` is true the index of the first image holding a NaN or an infinity."},
    {"compute_plain", reinterpret_cast<PyCFunction>(Forward_compute_plain), METH_VARARGS,
     "compute_plain(images, out)\n\nThe same outputs by cpu.rs's loops as written, 8 images a vector (the bench's peer)."},
    {"read", reinterpret_cast<PyCFunction>(Forward_read), METH_O, "read(values) -> float\n\nThe sum of every value, read once on the threads."},
    {"close", reinterpret_cast<PyCFunction>(Forward_close), METH_NOARGS, "close()\n\nStop the threads."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef Forward_getset[] = {
    {"isa", reinterpret_cast<getter>(Forward_isa), nullptr, "The instruction set of the kernels in use.", nullptr},
    {"threads", reinterpret_cast<getter>(Forward_threads), nullptr, "The threads a call runs on, the caller's among them.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject ForwardType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cnnlab.cpu._forward", "The network's forward in C++ on every core, bit for bit cpu.rs's.", -1,
    nullptr, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__forward(void)
{
    ForwardType.tp_name = "cnnlab.cpu._forward.Forward";
    ForwardType.tp_basicsize = sizeof(Forward);
    ForwardType.tp_flags = Py_TPFLAGS_DEFAULT;
    ForwardType.tp_doc = "Forward(filters, weights, threads, isa=None): the network's forward on `threads` threads, with the kernels "
                         "of `isa` (one of CPU_ISAS; None: the widest this CPU runs).";
    ForwardType.tp_new = PyType_GenericNew;
    ForwardType.tp_init = reinterpret_cast<initproc>(Forward_init);
    ForwardType.tp_dealloc = reinterpret_cast<destructor>(Forward_dealloc);
    ForwardType.tp_methods = Forward_methods;
    ForwardType.tp_getset = Forward_getset;
    if (PyType_Ready(&ForwardType) < 0)
        return nullptr;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return nullptr;
    Py_INCREF(&ForwardType);
    if (PyModule_AddObject(m, "Forward", reinterpret_cast<PyObject *>(&ForwardType)) < 0) {
        Py_DECREF(&ForwardType);
        Py_DECREF(m);
        return nullptr;
    }
    if (add_isa_names(m, KERNELS) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
