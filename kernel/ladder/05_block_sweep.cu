// Rung 5, block_sweep: rung 4's kernels at the block sizes a sweep finds fastest.
//
// What changes from rung 4 (shared_tiles) and why: nothing in the code. A block size sets how
// many warps a multiprocessor can hold (registers, shared memory, the 2,048-thread limit), how
// much of a tile is reused, and how many barriers a tree pays; the best value is measured, not
// guessed (EECS 498's sweep took one kernel from 0.7 s to 0.4 s). This file is built once per
// conv size in SWEEP_BANDS (CONV_BANDS_PER_BLOCK bands of 4,000 bytes of tile and 20 threads per
// conv2d_relu block; 12 bands fill the 48 KB a static tile may take), and the bench times each
// against every dense_tree size in SWEEP_THREADS (cnnlab/cuda/launchers.py); the fastest pair is the
// rung, and `cnnlab cuda --kernel block_sweep` uses the pair the H100 sweep found (BLOCK_SWEEP_BEST).
//
// Threads to data, exactness: as rung 4.
//
// Napkin math: as rung 4; the sweep can only move the kernels closer to that 144 KB per image.
#include "../kernel.cu"
#include "04_shared_tiles.cu"
