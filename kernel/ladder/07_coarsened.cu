// Rung 7, coarsened: thread coarsening in the dense layer, several images' outputs per thread.
//
// What changes from rung 6 (warp_shuffle, kernel/kernel.cu) and why: in flattened_to_dense every
// weight a thread loads serves one image: 320 KB of weights per image pass through L1/L2, four
// times the image itself, and each FMA needs a load. Here a thread block takes COARSE_IMAGES
// images at once: a thread loads each pair of weights of its 10 neurons once and uses it for all
// of them, keeping 10 x COARSE_IMAGES running sums in registers (every loop unrolled, so the sums
// stay in registers). Weight traffic and load instructions per image drop COARSE_IMAGES-fold;
// the warp-shuffle reduction of rung 6 then runs on all of the sums at once.
//
// Threads to data: block (x, s) takes segment s of image groups x, x + gridDim.x, ... (a group:
// COARSE_IMAGES consecutive images); thread t the 16-byte pairs begin + 2t, begin + 2t + 2 *
// blockDim.x, ... of every image of the group. The conv is rung 6's conv2d_relu.
//
// Exactness: the conv is bit-exact; the dense sums per thread, per warp, per segment: within the
// lab's rule.
//
// Napkin math per image: as rung 6 in device memory (~144 KB: image, activations round trip,
// partials); weights from L1/L2 cut from 320 KB to 320 KB / COARSE_IMAGES; registers per thread
// ~2 x 10 x COARSE_IMAGES for the sums.
#include "../cnn.h"

#if !defined(COARSE_IMAGES) || !defined(COARSE_MAX_THREADS)
#error "coarsened's sizes missing: build with `python build.py`"
#endif
#define COARSE_SUMS (COARSE_IMAGES * OUT_LAYER_SIZE)

// dense_coarsened(conv_out, weights, partials, batch, stride): partials[s][image][n], row stride
// `stride`. Launch with a multiple of 32 threads, at most COARSE_MAX_THREADS.
extern "C" __global__ void __launch_bounds__(COARSE_MAX_THREADS)
dense_coarsened(const double *__restrict__ conv_out, const double *__restrict__ weights, double *__restrict__ partials,
                int batch, int stride)
{
    __shared__ double warp_sums[COARSE_MAX_THREADS / WARP * COARSE_SUMS];
    const int segment_length = (OUT_NEURON_DIM / 2 + gridDim.y - 1) / gridDim.y * 2;  // even: 16-byte loads
    const int begin = blockIdx.y * segment_length, end = min(begin + segment_length, OUT_NEURON_DIM);
    const long long groups = (batch + COARSE_IMAGES - 1) / COARSE_IMAGES;
    for (long long group = blockIdx.x; group < groups; group += gridDim.x) {
        const long long first = group * COARSE_IMAGES;
        double sums[COARSE_SUMS];
#pragma unroll
        for (int j = 0; j < COARSE_SUMS; ++j)
            sums[j] = 0.0;
        for (int k = begin + 2 * threadIdx.x; k < end; k += 2 * blockDim.x) {
            double2 w[OUT_LAYER_SIZE];
#pragma unroll
            for (int n = 0; n < OUT_LAYER_SIZE; ++n)
                w[n] = __ldg(reinterpret_cast<const double2 *>(weights + n * OUT_NEURON_DIM + k));
#pragma unroll
            for (int m = 0; m < COARSE_IMAGES; ++m) {
                const bool real = first + m < batch;  // a group past the batch's end adds zeros
                const double2 x = real ? *reinterpret_cast<const double2 *>(conv_out + (first + m) * OUT_NEURON_DIM + k)
                                       : make_double2(0.0, 0.0);
#pragma unroll
                for (int n = 0; n < OUT_LAYER_SIZE; ++n) {
                    sums[m * OUT_LAYER_SIZE + n] = fma(x.x, w[n].x, sums[m * OUT_LAYER_SIZE + n]);
                    sums[m * OUT_LAYER_SIZE + n] = fma(x.y, w[n].y, sums[m * OUT_LAYER_SIZE + n]);
                }
            }
        }
        const double total = block_totals(sums, warp_sums);
        const long long image = first + threadIdx.x / OUT_LAYER_SIZE;
        if (threadIdx.x < COARSE_SUMS && image < batch)
            partials[((long long)blockIdx.y * stride + image) * OUT_LAYER_SIZE + threadIdx.x % OUT_LAYER_SIZE] = total;
    }
}
