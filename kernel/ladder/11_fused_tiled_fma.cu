// Rung 11, fused_tiled_fma: rung 9 with the conv's multiply-adds fused: the price of bit-exactness.
//
// What changes from rung 9 (fused_tiled) and why: rung 9's conv is bit-exact because every product
// and every sum is rounded on its own, as cpu.rs rounds them: 490 FP64 instructions a patch, and
// each of the 250 filter values is fetched into a uniform register for its one use in a step (the
// SASS shows ULDC beside every DMUL). On the H100 that arithmetic, not memory, keeps rung 9 under
// the copy bound: built with the conv's sums as FMAs (fma(tap, filter, sum), in cpu.rs's order but
// each product unrounded) it ran 1.2x faster in the same sweep, at ~92% of the bound. This rung is
// that build: nothing else changes. What it gives up: the ReLU outputs are no longer the CPU's bit
// for bit (an FMA rounds once where cpu.rs rounds twice); the outputs stay within the lab's rule,
// as the other rungs' dense sums in another order do.
//
// Threads to data: as rung 9 (this file is rung 9's source, built with FT_EXACT_CONV = 0).
//
// Exactness: neither layer bit-exact; outputs within the lab's rule.
//
// Napkin math per image: as rung 9 in bytes (80,000 read, 80 written, 320 KB / FT_TILE_IMAGES of
// weights from L2); 250 fewer FP64 instructions a patch: 100,000 conv FMAs and 40,000 dense FMAs,
// 140,000 FP64 instructions an image, ~8 us per million images on the H100's FP64 pipe against
// ~27 us to read them: memory-bound with time to spare.
#include "09_fused_tiled.cu"
