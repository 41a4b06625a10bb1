// Rung 2, batched_global: a whole batch per launch, one thread per output, everything from global memory.
//
// What changes from rung 1 (lab) and why: rung 1 pays two launches per image, microseconds each,
// for a fraction of a microsecond of work. Here one launch of each kernel covers the whole batch,
// so the GPU is filled and the launch cost is paid once per batch. Nothing else is clever yet:
// conv_global has one thread per convolution output (image, f, r, c) that reads its 25 taps and
// its filter from global memory; dense_global has one thread per network output (image, n) that
// walks all 4,000 activations and weights in order.
//
// Threads to data: conv_global thread t -> output t of the batch's [image][10][20][20];
// dense_global thread t -> output (t / 10, t % 10). Consecutive dense threads read 10 rows of
// weights and the same activations: the reads are served by the caches, not coalesced.
//
// Exactness: bit-exact end to end. The conv sums in cpu.rs's order, and each dense thread sums
// its 4,000 products left to right with separately rounded multiplies and adds, as cpu.rs does.
//
// Napkin math per image: 80,000 bytes of image read, 32,000 of activations written and read back,
// 80 of outputs written: 144 KB of device memory. Each image's taps are read 10 times (once per
// filter) and its weights 10 times per image (once per neuron thread) through L1/L2. The dense
// threads' loop of 4,000 dependent adds is the bound: latency, not bandwidth.
#include "../cnn.h"

// Output `output` of the batch's conv_out [image][10][20][20], with the filters read from `filters`
// (global memory here; rung 3 passes its constant array, and the compiler reads it as such).
__device__ __forceinline__ void conv_output(const double *__restrict__ images, const double *filters,
                                            double *__restrict__ conv_out, long long output)
{
    const long long image = output / OUT_NEURON_DIM;
    const int within = (int)(output % OUT_NEURON_DIM);
    const int f = within / MAP_SIZE, r = within % MAP_SIZE / CONV_OUT_DIM, c = within % CONV_OUT_DIM;
    double taps[FILTER_TAPS];
    load_taps(taps, images + image * IMAGE_DOUBLES + r * BAND_DOUBLES + c * FILTER_DIM, INPUT_DIM);
    conv_out[output] = conv_relu_exact(taps, filters + f * FILTER_TAPS);
}

// conv_global(images, filters, conv_out, batch): filters [10][25] in global memory.
extern "C" __global__ void
conv_global(const double *__restrict__ images, const double *__restrict__ filters, double *__restrict__ conv_out, int batch)
{
    const long long output = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (output < (long long)batch * OUT_NEURON_DIM)
        conv_output(images, filters, conv_out, output);
}

// dense_global(conv_out, weights, partials, batch): partials [batch][10], the whole sums (segments = 1).
extern "C" __global__ void
dense_global(const double *__restrict__ conv_out, const double *__restrict__ weights, double *__restrict__ partials, int batch)
{
    const long long output = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (output >= (long long)batch * OUT_LAYER_SIZE)
        return;
    const double *input = conv_out + output / OUT_LAYER_SIZE * OUT_NEURON_DIM;
    const double *weight = weights + output % OUT_LAYER_SIZE * OUT_NEURON_DIM;
    double sum = __dmul_rn(input[0], weight[0]);
    for (int k = 1; k < OUT_NEURON_DIM; ++k)
        sum = __dadd_rn(sum, __dmul_rn(input[k], weight[k]));
    partials[output] = sum;
}
