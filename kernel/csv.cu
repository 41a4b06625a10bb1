// The lab's input CSV parsed on the GPU, exactly: one block of text (cut at line ends)
// into rows of 100 doubles, each equal to Python's float() of its text, with the layout checked.
//
// Build:  nvcc -fatbin -arch=sm_90 -std=c++17 -O3 -Ikernel -o csv.fatbin kernel/csv.cu
//         (a module of its own, apart from kernel.cu; PyCUDA loads it with module_from_file)
// Run:    cnnlab/cuda/csv_parser.py: CsvParser.parse() launches the five kernels below on a stream
// Check:  pytest -m gpu tests/test_csv_gpu.py        (builds this file itself; float() is the reference)
// Time:   python tools/bench_csv_gpu.py IN_CSV       (GB/s of text, CUDA events)
//
// A regular file's text is copied straight to the device in ranges of up to 512 MB cut just after a
// row (cnnlab/cuda/csv_double_buffer.py), and each range parsed as one block whose rows the device counts:
// the host passes `rows` < 0, the spans' capacity. Text from a pipe is read by the host in blocks cut at
// line ends, knowing each block's non-blank lines, `rows`, from the summaries its read threads made of
// 1 MB pieces as they landed (files/lines.py's Lines, the Seg below on the CPU). Either way, in
// stream order:
//   csv_tile_summaries  a thread block per 8 KB tile: the tile's line summary (reduce)
//   csv_scan_tiles      one thread block: exclusive scan of the tile summaries; the block's line count
//   csv_index_rows      a thread block per tile: each non-blank line's row and byte span (scan)
//   csv_split_rows      a warp per row: commas by bit masks and a warp scan, text bytes checked
//   csv_parse_fields    a thread per field: lab_parse_field, the double written in place
//   csv_patch_fields    (only when the host converted HOST fields) the host's doubles written in
//
// The block must start at a line start and must not hold the file's first line (N); it may end
// without a '\n' (the file's end). `block` must be 16-byte aligned (the start of a device buffer).
//
// Finding the lines is one scan (the scan of the ECE408 notes, reduce-then-scan) with an operator
// that also tells blank lines from non-blank ones, so one scan gives every non-blank line its row.
// A segment of bytes is summarised by Seg: whether it holds a '\n', whether its bytes before the
// first '\n' hold ink (a byte that is not blank: blank is " \t\r\v\f", as Python's bytes.strip()),
// whether its bytes after the last '\n' do, how many complete lines strictly between its '\n's hold
// ink, and the offset of its last '\n'. Two summaries combine associatively (seg_combine), so
// thread, warp, block and tile summaries scan like sums. A thread's 32 bytes become two bit masks
// ('\n', ink) with SIMD byte compares, and its summary comes from the masks (ffs, clz).
//
// Napkin math per image (100 lines of 100 values, ~19 bytes each): ~190 KB of text, 80 KB of
// doubles out, 40 KB of field ends written and read, 0.8 KB of row spans. The text is read three
// times (summaries, index, split) and its fields once more (parse); a block of a few MB stays in
// the 50 MB L2 between kernels, so DRAM sees about the text once, the ends twice and the doubles:
// ~350 KB per image, ~0.12 us at ~3 TB/s, i.e. ~1.6 TB/s of text if bandwidth bound. Arithmetic:
// 10,000 fields x ~300 integer instructions (digits, a 64x64->128 multiply, the checks) = 3 M lane
// instructions per image; the H100 issues ~30 T/s (132 SMs x 128 cores x ~1.75 GHz): 0.1 us per
// image, ~2 TB/s of text at full occupancy, a few hundred GB/s with idle threads and latency. Each
// block also costs 5 launches (a few us each on the GPU, ~5 us each from Python). So the kernels
// should run at a few hundred GB/s of text; the whole pipeline's bound is the host (page-cache
// read and the H2D copy, ~25-50 GB/s), which the kernels need only outrun (aim: >= 50 GB/s).
// Measured (H100, tools/bench_csv_gpu.py on a generated 188 MB file): 8 MB blocks 157 GB/s on
// one stream (11 + 7 + 11 + 12 + 19 us per block, kernel by kernel), 256 GB/s over 3 streams;
// 32 MB blocks 220 and 269 GB/s; the pinned H2D copy on the same machine: 55 GB/s.
//
// Everything the host needs back is one CsvStatus per block (4112 bytes, copied D2H async):
//   bad_row     the smallest bad row (block-relative non-blank line index), CSV_NO_BAD_ROW if none:
//               a line with other than 100 fields, a byte that is not text (after the line's
//               trailing '\r's are removed), a BAD field, a line (blank or not) longer than
//               CSV_MAX_LINE_BYTES; or the first row past the shorter of the device's and the
//               host's line counts when they differ. The host re-checks the block (or re-reads
//               the file) with its own line checker for the message.
//   lines       the non-blank lines the device found
//   host_count  fields lab_parse_field could not prove (LAB_FIELD_HOST); the first CSV_HOST_SLOTS
//               are listed in host[] as (row, field, offset, length), offsets within the block;
//               their doubles are left NaN until the host converts them with float() and calls
//               csv_patch_fields. overflow != 0: more than CSV_HOST_SLOTS, convert the whole block
//               on the host.
//
// Scratch per parse (cnnlab/cuda/csv_parser.py scratch_bytes): 12 bytes per 8 KB tile, 8 bytes (span) and
// 400 bytes (field ends) per row, 2 KB of patch values.

#include "lab_csv.h"

#ifndef CSV_WIDTH
#define CSV_WIDTH 100  // values per line (network.INPUT_DIM)
#endif
#define CSV_HOST_SLOTS 256                  // HOST fields listed per block
#define CSV_NO_BAD_ROW 0x7fffffff
#define CSV_MAX_LINE_BYTES (1 << 20)        // a longer line is bad, blank or not (files/lines.py's MAX_LINE_BYTES)
#define CSV_TILE_THREADS 256                // csv_tile_summaries, csv_index_rows
#define CSV_THREAD_BYTES 32                 // two 16-byte loads per thread
#define CSV_TILE_BYTES (CSV_TILE_THREADS * CSV_THREAD_BYTES)
#define CSV_SCAN_THREADS 1024               // csv_scan_tiles: one block
#define CSV_SPLIT_THREADS 256               // csv_split_rows: 8 warps, a row each at a time
#define CSV_FIELD_THREADS 256               // csv_parse_fields: a thread per field
#define CSV_PATCH_THREADS 256
#define WARP 32

struct CsvHostField {
    int row, field, offset, length;
};

struct CsvStatus {
    int bad_row;
    int lines;
    int host_count;
    int overflow;
    CsvHostField host[CSV_HOST_SLOTS];
};

// The layout, read by cnnlab/cuda/csv_parser.py when it loads the module, so the two sides cannot disagree.
extern "C" __constant__ int csv_layout[7] = {(int)sizeof(CsvStatus), CSV_HOST_SLOTS, CSV_WIDTH,
                                             CSV_TILE_BYTES, (int)sizeof(int2), 12 /* sizeof(Seg) */,
                                             CSV_MAX_LINE_BYTES};

// ---------------------------------------------------------------------------------------------
// The segment summary and its operator

enum { SEG_NL = 1, SEG_HEAD_INK = 2, SEG_TAIL_INK = 4 };

struct Seg {
    int inner;       // complete lines strictly between the segment's first and last '\n' that hold ink
    int last;        // offset of the last '\n' in the block, -1 if none
    unsigned flags;  // SEG_NL: holds a '\n'; SEG_HEAD_INK: ink before the first '\n' (anywhere if
                     // none); SEG_TAIL_INK: ink after the last '\n'
};
static_assert(sizeof(Seg) == 12, "csv_layout says 12");

__device__ __forceinline__ Seg seg_identity() { return Seg{0, -1, 0u}; }

// The summary of segment a followed by segment b.
__device__ __forceinline__ Seg seg_combine(Seg a, Seg b)
{
    if (!(a.flags & SEG_NL))  // a's ink belongs to b's first line
        return Seg{b.inner, b.last, b.flags | (a.flags & SEG_HEAD_INK)};
    if (!(b.flags & SEG_NL))  // b's ink belongs to a's last line
        return Seg{a.inner, a.last, a.flags | ((b.flags & SEG_HEAD_INK) ? SEG_TAIL_INK : 0u)};
    const int joined = ((a.flags & SEG_TAIL_INK) || (b.flags & SEG_HEAD_INK)) ? 1 : 0;
    return Seg{a.inner + b.inner + joined, b.last, SEG_NL | (a.flags & SEG_HEAD_INK) | (b.flags & SEG_TAIL_INK)};
}

// Non-blank lines that end before the segment's end (the block starts at a line start, so the
// bytes before the first '\n' are a whole line), the ink of the line still open, and its start.
__device__ __forceinline__ int seg_rows(Seg s) { return (s.flags & SEG_NL) ? ((s.flags & SEG_HEAD_INK) ? 1 : 0) + s.inner : 0; }
__device__ __forceinline__ bool seg_open_ink(Seg s) { return (s.flags & SEG_NL) ? (s.flags & SEG_TAIL_INK) : (s.flags & SEG_HEAD_INK); }
__device__ __forceinline__ int seg_open_start(Seg s) { return s.last + 1; }

__device__ __forceinline__ Seg seg_shfl_up(Seg s, int delta)
{
    return Seg{__shfl_up_sync(0xffffffffu, s.inner, delta), __shfl_up_sync(0xffffffffu, s.last, delta),
               __shfl_up_sync(0xffffffffu, s.flags, delta)};
}

__device__ __forceinline__ Seg warp_inclusive_scan(Seg s, int lane)
{
#pragma unroll
    for (int d = 1; d < WARP; d <<= 1) {
        const Seg before = seg_shfl_up(s, d);
        if (lane >= d)
            s = seg_combine(before, s);
    }
    return s;
}

// Exclusive scan of one Seg per thread over the thread block (any multiple of 32 up to 1024
// threads); *total gets the block's whole summary. Every thread must call it.
__device__ Seg block_exclusive_scan(Seg s, Seg *total)
{
    __shared__ Seg warp_totals[WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    const Seg inclusive = warp_inclusive_scan(s, lane);
    if (lane == WARP - 1)
        warp_totals[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const Seg t = warp_inclusive_scan(lane < warps ? warp_totals[lane] : seg_identity(), lane);
        if (lane < warps)
            warp_totals[lane] = t;
    }
    __syncthreads();
    Seg exclusive = seg_shfl_up(inclusive, 1);
    if (lane == 0)
        exclusive = seg_identity();
    if (warp > 0)
        exclusive = seg_combine(warp_totals[warp - 1], exclusive);
    *total = warp_totals[warps - 1];
    __syncthreads();  // warp_totals may be reused by the next call
    return exclusive;
}

// Bytes at [p0, p0 + 16): one 16-byte load, or byte loads at the block's end (bytes past it read
// as ' ', which is blank, no comma and text, so it changes no summary and no row).
__device__ __forceinline__ uint4 load_16(const unsigned char *__restrict__ block, int p0, int nbytes)
{
    if (p0 + 16 <= nbytes)
        return __ldg(reinterpret_cast<const uint4 *>(block + p0));
    unsigned w[4] = {0x20202020u, 0x20202020u, 0x20202020u, 0x20202020u};
    for (int i = 0; i < 16 && p0 + i < nbytes; ++i)
        w[i / 4] = (w[i / 4] & ~(0xffu << (8 * (i % 4)))) | ((unsigned)block[p0 + i] << (8 * (i % 4)));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// SIMD within a word: __vcmp*4 give 0xff per matching byte; byte_bits packs bit 0 of each byte
// into 4 bits, byte i to bit i (the multiply's cross terms land below bit 24 or past bit 31).
__device__ __forceinline__ unsigned byte_bits(unsigned m) { return ((m & 0x01010101u) * 0x01020408u) >> 24; }
__device__ __forceinline__ unsigned newline_bytes(unsigned w) { return __vcmpeq4(w, 0x0a0a0a0au); }
__device__ __forceinline__ unsigned ink_bytes(unsigned w)  // neither '\n' nor lab_is_blank_byte
{
    return ~(__vcmpeq4(w, 0x20202020u) | (__vcmpgeu4(w, 0x09090909u) & __vcmpleu4(w, 0x0d0d0d0du)));
}
__device__ __forceinline__ unsigned comma_bytes(unsigned w) { return __vcmpeq4(w, 0x2c2c2c2cu); }
__device__ __forceinline__ unsigned non_text_bytes(unsigned w)  // lab_is_text_byte's complement
{
    return ~(__vcmpeq4(w, 0x09090909u) | (__vcmpgeu4(w, 0x20202020u) & __vcmpleu4(w, 0x7e7e7e7eu)));
}
__device__ __forceinline__ unsigned low_bits(int n) { return n >= 32 ? 0xffffffffu : n <= 0 ? 0u : (1u << n) - 1u; }

// A thread's CSV_THREAD_BYTES (32) bytes as two bit masks, bit i for byte p0 + i: '\n's and ink.
struct Chunk {
    unsigned newlines, ink;
};

__device__ __forceinline__ Chunk load_chunk(const unsigned char *__restrict__ block, int p0, int nbytes)
{
    Chunk c{0u, 0u};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const uint4 v = load_16(block, p0 + 16 * half, nbytes);
        const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            c.newlines |= byte_bits(newline_bytes(words[k])) << (16 * half + 4 * k);
            c.ink |= byte_bits(ink_bytes(words[k])) << (16 * half + 4 * k);
        }
    }
    return c;
}

__device__ __forceinline__ Seg chunk_summary(Chunk c, int p0)
{
    if (!c.newlines)
        return Seg{0, -1, c.ink ? (unsigned)SEG_HEAD_INK : 0u};
    const int first = __ffs(c.newlines) - 1, last = 31 - __clz(c.newlines);
    unsigned flags = SEG_NL;
    if (c.ink & low_bits(first))
        flags |= SEG_HEAD_INK;
    if (c.ink & ~low_bits(last + 1))
        flags |= SEG_TAIL_INK;
    int inner = 0, previous = first;
    for (unsigned rest = c.newlines & (c.newlines - 1); rest; rest &= rest - 1) {  // lines inside the chunk
        const int b = __ffs(rest) - 1;
        inner += (c.ink & low_bits(b) & ~low_bits(previous + 1)) ? 1 : 0;
        previous = b;
    }
    return Seg{inner, p0 + last, flags};
}

// ---------------------------------------------------------------------------------------------
// The kernels

// csv_tile_summaries: block b reduces tile b (CSV_TILE_BYTES bytes from b * CSV_TILE_BYTES) to one
// Seg in tiles[b]. Grid: ceil(nbytes / CSV_TILE_BYTES) blocks of CSV_TILE_THREADS.
extern "C" __global__ void __launch_bounds__(CSV_TILE_THREADS)
csv_tile_summaries(const unsigned char *__restrict__ block, int nbytes, Seg *__restrict__ tiles)
{
    const int p0 = blockIdx.x * CSV_TILE_BYTES + threadIdx.x * CSV_THREAD_BYTES;
    Seg total;
    block_exclusive_scan(chunk_summary(load_chunk(block, p0, nbytes), p0), &total);
    if (threadIdx.x == 0)
        tiles[blockIdx.x] = total;
}

// csv_scan_tiles: one block of CSV_SCAN_THREADS replaces tiles[0..count) by their exclusive
// prefixes (each thread a run of consecutive tiles: combine, one block scan, write back), counts
// the block's non-blank lines and starts the block's status: lines, bad_row (the first row past
// the shorter count if the device's and the host's counts differ), no HOST fields. `rows` < 0:
// the host has not counted (a range of a file's text, copied straight to the device), and any
// count up to -rows (the spans' capacity) is good; past it, row -rows is bad.
extern "C" __global__ void __launch_bounds__(CSV_SCAN_THREADS)
csv_scan_tiles(Seg *__restrict__ tiles, int count, int rows, CsvStatus *__restrict__ status)
{
    const int per_thread = (count + blockDim.x - 1) / blockDim.x;
    const int from = min(count, (int)threadIdx.x * per_thread), to = min(count, from + per_thread);
    Seg run = seg_identity();
    for (int i = from; i < to; ++i)
        run = seg_combine(run, tiles[i]);
    Seg total;
    Seg carry = block_exclusive_scan(run, &total);
    for (int i = from; i < to; ++i) {
        const Seg tile = tiles[i];
        tiles[i] = carry;
        carry = seg_combine(carry, tile);
    }
    if (threadIdx.x == 0) {
        const int lines = seg_rows(total) + (seg_open_ink(total) ? 1 : 0);  // the last line may lack its '\n'
        status->lines = lines;
        if (rows < 0)
            status->bad_row = lines <= -rows ? CSV_NO_BAD_ROW : -rows;
        else
            status->bad_row = lines == rows ? CSV_NO_BAD_ROW : min(lines, rows);
        status->host_count = 0;
        status->overflow = 0;
    }
}

// csv_index_rows: block b rescans tile b, starting from its prefix tiles[b]; the thread holding
// the '\n' that ends non-blank line `row` writes spans[row] = (first byte, '\n' offset) for
// row < rows (the host's count: a block whose counts differ is already bad). A line longer than
// CSV_MAX_LINE_BYTES (its '\n' not counted), blank or not, makes the row it is or comes before bad,
// as the host refuses it (a block copied straight from a file was never read by the host). Grid and
// block as csv_tile_summaries.
extern "C" __global__ void __launch_bounds__(CSV_TILE_THREADS)
csv_index_rows(const unsigned char *__restrict__ block, int nbytes, const Seg *__restrict__ tiles, int rows,
               int2 *__restrict__ spans, CsvStatus *__restrict__ status)
{
    const int p0 = blockIdx.x * CSV_TILE_BYTES + threadIdx.x * CSV_THREAD_BYTES;
    const Chunk c = load_chunk(block, p0, nbytes);
    Seg total;
    const Seg before = seg_combine(tiles[blockIdx.x], block_exclusive_scan(chunk_summary(c, p0), &total));
    int row = seg_rows(before), start = seg_open_start(before), previous = -1;
    bool ink = seg_open_ink(before);
    for (unsigned rest = c.newlines; rest; rest &= rest - 1) {
        const int b = __ffs(rest) - 1;
        if (p0 + b - start > CSV_MAX_LINE_BYTES)
            atomicMin(&status->bad_row, row);
        if (ink || (c.ink & low_bits(b) & ~low_bits(previous + 1))) {
            if (row < rows)
                spans[row] = make_int2(start, p0 + b);
            ++row;
        }
        ink = false;
        start = p0 + b + 1;
        previous = b;
    }
    ink = ink || (c.ink & ~low_bits(previous + 1));
    const bool last = p0 < nbytes && nbytes <= p0 + CSV_THREAD_BYTES;  // this thread holds the block's last byte
    if (last && nbytes - start > CSV_MAX_LINE_BYTES)  // the last line, without '\n'
        atomicMin(&status->bad_row, row);
    if (ink && last && row < rows)
        spans[row] = make_int2(start, nbytes);
}

// csv_split_rows: warp w checks rows w, w + warps, ... of the block's min(rows, lines) rows. The
// row's trailing '\r's are dropped; the warp walks it in 512-byte windows (16 bytes a lane, one
// load), each lane finding its commas and non-text bytes as bit masks; a warp scan of the lanes'
// comma counts numbers the commas, and each lane writes its commas' offsets to ends[row][field]
// (the end of field `field`; ends[row][99] = the row's end). A row with other than 99 commas, a
// byte that is not text, or that stands where lab_csv.h's blank-line rule does not let it (row r
// is the file's row file_row + r of images of matrix_rows rows, 0: no rule; a blank line comes
// before it where its span starts past the end of the row before, or, for row 0, past the block's
// start, since a block starts just after a row) is reported (atomicMin) and marked bad for
// csv_parse_fields (ends[row][99] = -1). Grid: ceil(rows / 8) blocks (or fewer: it strides) of
// CSV_SPLIT_THREADS.
extern "C" __global__ void __launch_bounds__(CSV_SPLIT_THREADS)
csv_split_rows(const unsigned char *__restrict__ block, int nbytes, const int2 *__restrict__ spans, int rows,
               int *__restrict__ ends, CsvStatus *__restrict__ status, long long file_row, int matrix_rows, int separated)
{
    const int lane = threadIdx.x % WARP;
    const int count = min(rows, status->lines);
    for (int row = (blockIdx.x * blockDim.x + threadIdx.x) / WARP; row < count; row += gridDim.x * blockDim.x / WARP) {
        const int2 span = spans[row];
        const int start = span.x;
        int end = span.y;
        const bool blank_before = start > (row == 0 ? 0 : spans[row - 1].y + 1);
        const bool placed = lab_row_placed(file_row + row, matrix_rows, separated != 0, blank_before);
        while (end > start && block[end - 1] == '\r')
            --end;
        int *row_ends = ends + (long long)row * CSV_WIDTH;
        int commas = 0;
        bool bad = false;
        for (int base = start & ~15; base < end && !bad; base += 16 * WARP) {
            const int p = base + 16 * lane;
            const uint4 v = load_16(block, p, nbytes);
            const unsigned words[4] = {v.x, v.y, v.z, v.w};
            unsigned comma = 0, other = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                comma |= byte_bits(comma_bytes(words[k])) << (4 * k);
                other |= byte_bits(non_text_bytes(words[k])) << (4 * k);
            }
            const unsigned inside = low_bits(min(max(end - p, 0), 16)) & ~low_bits(min(max(start - p, 0), 16));
            comma &= inside;
            other &= inside;
            const int mine = __popc(comma);
            int upto = mine;  // inclusive scan of the lanes' comma counts
#pragma unroll
            for (int d = 1; d < WARP; d <<= 1) {
                const int t = __shfl_up_sync(0xffffffffu, upto, d);
                if (lane >= d)
                    upto += t;
            }
            int index = commas + upto - mine;
            for (unsigned m = comma; m; m &= m - 1, ++index)
                if (index < CSV_WIDTH - 1)
                    row_ends[index] = p + __ffs(m) - 1;
            commas += __shfl_sync(0xffffffffu, upto, WARP - 1);
            bad = __any_sync(0xffffffffu, other != 0) || commas > CSV_WIDTH - 1;
        }
        if (lane == 0) {
            if (bad || commas != CSV_WIDTH - 1 || !placed) {
                atomicMin(&status->bad_row, row);
                row_ends[CSV_WIDTH - 1] = -1;
            } else {
                row_ends[CSV_WIDTH - 1] = end;
            }
        }
    }
}

// csv_parse_fields: thread i converts field i % 100 of row i / 100 (rows the split found good)
// with lab_parse_field and writes images[(first_row + row) * 100 + field]: consecutive threads,
// consecutive doubles. A HOST field is left NaN and listed (atomicAdd) for the host; a BAD one is
// reported (atomicMin). Grid: ceil(rows * 100 / CSV_FIELD_THREADS) blocks of CSV_FIELD_THREADS,
// or fewer where `rows` is only the text buffer's bound (it strides).
extern "C" __global__ void __launch_bounds__(CSV_FIELD_THREADS)
csv_parse_fields(const unsigned char *__restrict__ block, const int2 *__restrict__ spans, const int *__restrict__ ends,
                 int rows, int first_row, double *__restrict__ images, CsvStatus *__restrict__ status)
{
    const long long fields = (long long)min(rows, status->lines) * CSV_WIDTH;
    const char *text = reinterpret_cast<const char *>(block);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < fields; i += (long long)gridDim.x * blockDim.x) {
        const int row = (int)(i / CSV_WIDTH), field = (int)(i % CSV_WIDTH);
        const int2 span = spans[row];
        if (ends[(long long)row * CSV_WIDTH + CSV_WIDTH - 1] < 0)  // a bad row, already reported
            continue;
        const int from = field == 0 ? span.x : ends[i - 1] + 1, to = ends[i];
        double value;
        const int kind = lab_parse_field(text + from, text + to, &value);
        double *out = images + (long long)first_row * CSV_WIDTH + i;
        if (kind == LAB_FIELD_OK) {
            *out = value;
        } else if (kind == LAB_FIELD_HOST) {
            *out = __longlong_as_double(0x7ff8000000000000LL);  // NaN until the host's patch
            const int slot = atomicAdd(&status->host_count, 1);
            if (slot < CSV_HOST_SLOTS)
                status->host[slot] = CsvHostField{row, field, from, to - from};
            else
                status->overflow = 1;
        } else {
            atomicMin(&status->bad_row, row);
        }
    }
}

// csv_patch_fields: the host's float() of the first `count` listed HOST fields, values[i] for
// status->host[i], written to their places. Grid: ceil(count / CSV_PATCH_THREADS) blocks.
extern "C" __global__ void __launch_bounds__(CSV_PATCH_THREADS)
csv_patch_fields(double *__restrict__ images, int first_row, const CsvStatus *__restrict__ status,
                 const double *__restrict__ values, int count)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        const CsvHostField f = status->host[i];
        images[((long long)first_row + f.row) * CSV_WIDTH + f.field] = values[i];
    }
}
