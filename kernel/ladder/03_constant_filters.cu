// Rung 3, constant_filters: the filters in constant memory.
//
// What changes from rung 2 (batched_global) and why: every thread of a warp of conv_global reads
// the same filter value at the same time (consecutive threads are consecutive columns of one
// filter's map), from global memory, through L1. Constant memory is made for exactly that: one
// read, broadcast to the whole warp from the constant cache, and the compiler can fold the value
// straight into the multiply (an operand c[bank][offset], no load instruction at all). The rest
// of rung 2 stays; dense_global comes from this file's copy of rung 2.
//
// Threads to data, exactness: as rung 2 (bit-exact end to end).
//
// Napkin math per image: as rung 2, less the 10 x 25 filter loads of each of its 4,000 conv
// threads (1,000,000 loads of 8 bytes per image, from L1). The dense kernel is unchanged, so the
// gain is bounded by the conv's share of rung 2's time.
#include "02_batched_global.cu"

__constant__ double filters[CONV_LAYER_SIZE * FILTER_TAPS];

// conv_constant(images, conv_out, batch): conv_global with the filters from constant memory.
extern "C" __global__ void
conv_constant(const double *__restrict__ images, double *__restrict__ conv_out, int batch)
{
    const long long output = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (output < (long long)batch * OUT_NEURON_DIM)
        conv_output(images, filters, conv_out, output);
}
