// Rung 1, lab: the lab's own scheme, one image per launch.
//
// What changes from the lab's CPU program and why: the work moves to the GPU as the Lab 3 report
// moved it, kept as the ladder's first rung so that every later rung has a measured start. For
// each image the host launches conv_lab with 32 thread blocks of 1024
// threads, one thread per convolution output (4,000 of the 32,768 threads have work; the filters
// are read from global memory), then dense_lab with a thread block per (segment, neuron): each
// thread multiplies one activation by its weight into shared memory, and the block adds its 1,024
// products by a tree with interleaved addressing (stride 1, 2, 4, ...: the active threads spread
// over every warp, and half of each warp idles at every level). Each block writes one partial
// sum; the host adds the LAB_SEGMENTS partials of each output.
//
// Threads to data: conv_lab thread t < 4,000 computes conv output t = f * 400 + r * 20 + c;
// dense_lab block (s, n) thread k takes activation s * LAB_SEGMENT + k.
//
// Exactness: the conv is bit-exact (cpu.rs's order, no FMA); the dense sums in tree order, within
// the lab's rule.
//
// Napkin math per image: two launches and their gaps (microseconds each, from the host) against
// about 0.3 microseconds of work; in bytes: 80,000 of image, 32,000 of activations written and read
// back, the 320,000 bytes of weights (from L2), LAB_SEGMENTS x 80 of partials. Bound by launches:
// the measure is launches per second, not bytes.
#include "../cnn.h"

#if !defined(LAB_CONV_BLOCKS) || !defined(LAB_THREADS) || !defined(LAB_SEGMENTS)
#error "lab's sizes missing: build with `python build.py`"
#endif
#define LAB_SEGMENT (OUT_NEURON_DIM / LAB_SEGMENTS)  // activations per dense_lab block
static_assert(LAB_SEGMENT * LAB_SEGMENTS == OUT_NEURON_DIM && LAB_SEGMENT <= LAB_THREADS, "a thread per activation");
static_assert((LAB_THREADS & (LAB_THREADS - 1)) == 0, "the tree halves a power of two");

// conv_lab<<<LAB_CONV_BLOCKS, LAB_THREADS>>>(image, filters, conv_out): one image.
extern "C" __global__ void __launch_bounds__(LAB_THREADS)
conv_lab(const double *__restrict__ image, const double *__restrict__ filters, double *__restrict__ conv_out)
{
    const int output = blockIdx.x * blockDim.x + threadIdx.x;
    if (output >= OUT_NEURON_DIM)
        return;
    const int f = output / MAP_SIZE, r = output % MAP_SIZE / CONV_OUT_DIM, c = output % CONV_OUT_DIM;
    double taps[FILTER_TAPS];
    load_taps(taps, image + r * BAND_DOUBLES + c * FILTER_DIM, INPUT_DIM);
    conv_out[output] = conv_relu_exact(taps, filters + f * FILTER_TAPS);
}

// dense_lab<<<(LAB_SEGMENTS, 10), LAB_THREADS>>>(conv_out, weights, partials, stride): one image;
// partials[s * stride * 10 + n] is segment s's share of output n.
extern "C" __global__ void __launch_bounds__(LAB_THREADS)
dense_lab(const double *__restrict__ conv_out, const double *__restrict__ weights, double *__restrict__ partials, int stride)
{
    __shared__ double products[LAB_THREADS];
    const int s = blockIdx.x, n = blockIdx.y, k = threadIdx.x;
    const int input = s * LAB_SEGMENT + k;
    products[k] = k < LAB_SEGMENT ? conv_out[input] * weights[n * OUT_NEURON_DIM + input] : 0.0;
    __syncthreads();
    for (int step = 1; step < LAB_THREADS; step *= 2) {
        if (k % (2 * step) == 0)
            products[k] += products[k + step];
        __syncthreads();
    }
    if (k == 0)
        partials[(long long)s * stride * OUT_LAYER_SIZE + n] = products[0];
}
