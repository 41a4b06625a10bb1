// Rung 4, shared_tiles: shared memory for both layers, coalesced tiles for the conv and a
// reduction tree with sequential addressing for the dense layer.
//
// What changes from rung 3 (constant_filters) and why:
// - conv: rung 3's threads each read their patch's 25 taps straight from global memory, 40 bytes
//   apart across a warp, and all 10 filter threads of a patch read the same taps again. Here the
//   design card's conv2d_relu (kernel/kernel.cu) copies whole bands of 5 image rows into shared
//   memory with 16-byte loads, 32 consecutive per warp (coalesced), and one thread computes all
//   10 filters of its patch from there: every byte of the image is read from device memory once.
// - dense: rung 3 has one thread walk 4,000 activations in a chain of dependent adds. Here a
//   thread block shares one image's segment of activations: its threads take every
//   blockDim.x-th activation (consecutive threads, consecutive addresses), keep 10 running sums,
//   then add the block's sums by a tree in shared memory with sequential addressing (ECE 408):
//   at each level the first half of the active threads adds the second half, so whole warps
//   retire together and no bank is hit twice.
//
// Threads to data: conv2d_relu as kernel/kernel.cu says; dense_tree block (x, s) takes segment
// s of images x, x + gridDim.x, ...; thread t its activations begin + t, begin + t + blockDim.x...
// Launch with a power-of-two block size and blockDim.x * 10 doubles of dynamic shared memory.
//
// Exactness: the conv is bit-exact; the dense sums in tree order, within the lab's rule.
//
// Napkin math per image: 80,000 bytes of image read, 32,000 of activations written and read back,
// segments x 80 of partials written: ~144 KB of device memory, so at ~3 TB/s ~48 ns an image.
// The tree costs log2(blockDim.x) barriers per image and segment.
#include "../cnn.h"

// dense_tree(conv_out, weights, partials, batch, stride): partials[s][image][n], row stride `stride`.
extern "C" __global__ void
dense_tree(const double *__restrict__ conv_out, const double *__restrict__ weights, double *__restrict__ partials, int batch,
           int stride)
{
    extern __shared__ double sums[];  // [neuron][thread]
    const int segment_length = (OUT_NEURON_DIM + gridDim.y - 1) / gridDim.y;
    const int begin = blockIdx.y * segment_length, end = min(begin + segment_length, OUT_NEURON_DIM);
    const int t = threadIdx.x, threads = blockDim.x;
    for (long long image = blockIdx.x; image < batch; image += gridDim.x) {
        const double *input = conv_out + image * OUT_NEURON_DIM;
        double own[OUT_LAYER_SIZE];
#pragma unroll
        for (int n = 0; n < OUT_LAYER_SIZE; ++n)
            own[n] = 0.0;
        for (int k = begin + t; k < end; k += threads) {
            const double x = input[k];
#pragma unroll
            for (int n = 0; n < OUT_LAYER_SIZE; ++n)
                own[n] = fma(x, __ldg(weights + n * OUT_NEURON_DIM + k), own[n]);
        }
#pragma unroll
        for (int n = 0; n < OUT_LAYER_SIZE; ++n)
            sums[n * threads + t] = own[n];
        __syncthreads();
        for (int half = threads / 2; half > 0; half /= 2) {
            if (t < half)
#pragma unroll
                for (int n = 0; n < OUT_LAYER_SIZE; ++n)
                    sums[n * threads + t] += sums[n * threads + t + half];
            __syncthreads();
        }
        if (t < OUT_LAYER_SIZE)
            partials[((long long)blockIdx.y * stride + image) * OUT_LAYER_SIZE + t] = sums[t * threads];
        __syncthreads();  // sums is rewritten for the next image
    }
}
