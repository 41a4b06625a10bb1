// cnnlab.cpu._forward: the network's forward on every core, bit for bit what the lab's cpu.rs computes.
//
// Build:  pip install -e .   (setup.py; the network's sizes come from cnnlab/network.py as -D flags,
//         and -ffp-contract=off keeps every multiply and add rounded on its own)
// Check:  pytest tests/test_forward.py   (against the numpy forward and tests/reference.py, bit for bit)
// Time:   python -m cnnlab bench --rows cpu   (against the plain loop, PyTorch and the memory-read bound)
//
// Kernels (native/cpu_forward_kernels.h), compiled for AVX-512, AVX2 and plain x86-64, chosen at import:
//   forward_group   8 images a vector: a band of 5 rows transposed into the vector lanes (24 shuffles
//                   per 8x8 block), then the 10 filters' sums of its 20 patches in register blocks,
//                   ReLU, and the output layer's 10 sums over the 4000 activations
//   plain_group     cpu.rs's loops as written, 8 images a vector gathered value by value (the peer)
//   read_values     every double read once (the memory-read bound)
//
// Napkin math: an image is 100,000 conv taps and 40,000 weights, each a multiply and an add: 280,000
// FP64 operations, 35,000 8-wide instructions. A core that issues two of them a cycle (AVX-512 on
// Sapphire Rapids or Zen 4) needs 17,500 cycles, ~170,000 images/s at 3 GHz, plus ~2,000 cycles of
// shuffles; each image is 80,000 bytes read once, so 16 such cores would want 200 GB/s: memory,
// not arithmetic, bounds a big machine.
//
// Python API (arrays: C-contiguous float64, checked here):
//   Forward(filters, weights, threads)       filters (10, 5, 5), weights (10, 4000): copied; threads >= 1
//   .compute(images, out, check) -> int      images (n, 100, 100) -> out (n, 10); -1, or where `check` is
//                                            true the index of the first image that holds a NaN or an
//                                            infinity (out is then undefined)
//   .compute_plain(images, out)              the same outputs by the plain loop
//   .read(values) -> float                   the sum of every value, read once on the threads
//   .close()                                  stops the threads (also when the object goes)
//   .isa                                      "avx512", "avx2" or "x86-64": the kernels in use
//   .threads                                  the threads a call runs on (the caller's among them)

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
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

#include "pool.h"

#if !defined(INPUT_DIM) || !defined(FILTER_DIM) || !defined(CONV_LAYER_SIZE) || !defined(CONV_OUT_DIM) || \
    !defined(OUT_NEURON_DIM) || !defined(OUT_LAYER_SIZE)
#error "the network's sizes come from cnnlab/network.py as -D flags (setup.py)"
#endif

namespace {

constexpr long IMAGE_VALUES = (long)INPUT_DIM * INPUT_DIM;
constexpr int GROUP = 8;  // images a vector

// A thread's work arrays: a band of the group's images (32 KB, in L1) and its activations (256 KB, in L2).
struct Scratch {
    alignas(64) double band[FILTER_DIM * INPUT_DIM * GROUP];
    alignas(64) double act[OUT_NEURON_DIM * GROUP];
};

alignas(64) double ZERO_IMAGE[IMAGE_VALUES];  // stands in for the images past a batch's end (zeros, never written)

// Register blocks: FILTER_BLOCK x COLUMN_BLOCK sums of 8 lanes in flight, each tap's filter values and
// band values loaded once per block. AVX-512 (32 registers): 10 x 2 = 20 sums; measured on the 2-core
// machine, images/s on 2 threads: 10 x 2 211k, 10 x 1 200k, 5 x 4 198k, 2 x 4 188k, 5 x 2 180k. AVX2
// (16 registers of 4 lanes) holds 5 x 1, and the output layer's sums 5 neurons at a time.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq")
namespace avx512 {
#define FILTER_BLOCK 10
#define COLUMN_BLOCK 2
#define NEURON_BLOCK 10
#include "cpu_forward_kernels.h"
#undef FILTER_BLOCK
#undef COLUMN_BLOCK
#undef NEURON_BLOCK
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2 {
#define FILTER_BLOCK 5
#define COLUMN_BLOCK 1
#define NEURON_BLOCK 5
#include "cpu_forward_kernels.h"
#undef FILTER_BLOCK
#undef COLUMN_BLOCK
#undef NEURON_BLOCK
}  // namespace avx2
#pragma GCC pop_options

namespace baseline {
#define FILTER_BLOCK 2
#define COLUMN_BLOCK 1
#define NEURON_BLOCK 2
#include "cpu_forward_kernels.h"
#undef FILTER_BLOCK
#undef COLUMN_BLOCK
#undef NEURON_BLOCK
}  // namespace baseline

// One instruction set's kernels, with the group's outputs written out lane by lane.
struct Kernels {
    const char *name;
    // The group's outputs into out[0 .. count * 10); the lanes where a value was not finite as a bit mask.
    unsigned (*forward)(const double *const *, const double *, const double *, Scratch *, bool, double *, int);
    void (*plain)(const double *const *, const double *, const double *, Scratch *, double *, int);
    double (*read)(const double *, long);
};

#define CNNLAB_KERNELS(ISA, ATTRIBUTES)                                                                                            \
    ATTRIBUTES unsigned ISA##_forward(const double *const *images, const double *filters, const double *weights_t, Scratch *s, \
                                      bool check, double *out, int count)                                                      \
    {                                                                                                                           \
        ISA::v8 outputs[OUT_LAYER_SIZE];                                                                                        \
        const ISA::v8i bad = ISA::forward_group(images, filters, weights_t, s, check, outputs);                                \
        ISA::write_lanes(outputs, count, out);                                                                                  \
        unsigned mask = 0;                                                                                                      \
        for (int i = 0; i < count; ++i)                                                                                         \
            mask |= (bad[i] != 0) << i;                                                                                         \
        return mask;                                                                                                            \
    }                                                                                                                           \
    ATTRIBUTES void ISA##_plain(const double *const *images, const double *filters, const double *weights, Scratch *s,         \
                                double *out, int count)                                                                         \
    {                                                                                                                           \
        ISA::v8 outputs[OUT_LAYER_SIZE];                                                                                        \
        ISA::plain_group(images, filters, weights, s, outputs);                                                                 \
        ISA::write_lanes(outputs, count, out);                                                                                  \
    }

CNNLAB_KERNELS(avx512, __attribute__((target("avx512f,avx512dq"))))
CNNLAB_KERNELS(avx2, __attribute__((target("avx2"))))
CNNLAB_KERNELS(baseline, )

const Kernels AVX512 = {"avx512", avx512_forward, avx512_plain, avx512::read_values};
const Kernels AVX2 = {"avx2", avx2_forward, avx2_plain, avx2::read_values};
const Kernels BASELINE = {"x86-64", baseline_forward, baseline_plain, baseline::read_values};

const Kernels &best_kernels()
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
        return AVX512;
    if (__builtin_cpu_supports("avx2"))
        return AVX2;
    return BASELINE;
}

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

// Groups of 8 images claimed by the threads as they go; the images past the end read as zeros.
template <typename Run>
void over_groups(Forward *self, const double *images, long count, Run run)
{
    const long groups = (count + GROUP - 1) / GROUP;
    std::atomic<long> next{0};
    self->pool->run([&](int worker) {
        Scratch *scratch = scratch_of(self, worker);
        for (long group; (group = next.fetch_add(1)) < groups;) {
            const double *rows[GROUP];
            const int in_group = static_cast<int>(std::min<long>(GROUP, count - group * GROUP));
            for (int i = 0; i < GROUP; ++i)
                rows[i] = i < in_group ? images + (group * GROUP + i) * IMAGE_VALUES : ZERO_IMAGE;
            run(group, rows, in_group, scratch);
        }
    }, static_cast<int>(std::min<long>(groups, self->pool->threads())));
}

int Forward_init(Forward *self, PyObject *args, PyObject *)
{
    PyObject *filters_obj, *weights_obj;
    int threads;
    if (!PyArg_ParseTuple(args, "OOi:Forward", &filters_obj, &weights_obj, &threads))
        return -1;
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
    self->kernels = &best_kernels();
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
        self->pool->stop();
        Py_END_ALLOW_THREADS
        delete self->pool;
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
    Py_BEGIN_ALLOW_THREADS
    over_groups(self, values, count, [&](long group, const double *const *rows, int in_group, Scratch *scratch) {
        const unsigned bad = self->kernels->forward(rows, self->filters, self->weights_t, scratch, check, outputs + group * GROUP * OUT_LAYER_SIZE,
                                                    in_group);
        if (bad) {
            long index = group * GROUP + __builtin_ctz(bad), seen = first_bad.load();
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
    Py_BEGIN_ALLOW_THREADS
    over_groups(self, values, count, [&](long group, const double *const *rows, int in_group, Scratch *scratch) {
        self->kernels->plain(rows, self->filters, self->weights, scratch, outputs + group * GROUP * OUT_LAYER_SIZE, in_group);
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
        sums[worker] = self->kernels->read(data + start, std::min(total, start + share) - start);
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
    ForwardType.tp_doc = "Forward(filters, weights, threads): the network's forward on `threads` threads.";
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
    return m;
}
