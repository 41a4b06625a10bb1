// The CPU forward's kernels, compiled once per instruction set by native/cpu_forward.cpp, inside a
// namespace of its own with FILTER_BLOCK, COLUMN_BLOCK and NEURON_BLOCK set for that set's registers.
// No includes here: the file is pasted inside a namespace.
//
// A group is 8 images side by side: a v8 holds one value of each, so every operation below is the
// same scalar operation of cpu.rs on 8 independent sums at once. No sum is split or reordered: each
// is a left fold from -0.0 (numpy's reduce and Rust's f64 Sum start there; -0.0 + x is x), its terms
// a rounded multiply then a rounded add (the extension is built with -ffp-contract=off).

typedef double v8 __attribute__((vector_size(64)));
typedef long long v8i __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) v8 splat(double x) { return v8{x, x, x, x, x, x, x, x}; }

static inline __attribute__((always_inline)) v8 load8(const double *p)
{
    v8 v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// 8 rows of 8 doubles (row i from images[i] + at) transposed into out[0..8): out[j] lane i = row i's j-th.
static inline __attribute__((always_inline)) void transpose8(const double *const *images, long at, v8 *out)
{
    const v8i even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i pairs_lo = {0, 1, 8, 9, 4, 5, 12, 13}, pairs_hi = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i halves_lo = {0, 1, 2, 3, 8, 9, 10, 11}, halves_hi = {4, 5, 6, 7, 12, 13, 14, 15};
    v8 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        const v8 r0 = load8(images[i] + at), r1 = load8(images[i + 1] + at);
        a[i] = __builtin_shuffle(r0, r1, even);  // r0[0] r1[0] r0[2] r1[2] ...
        a[i + 1] = __builtin_shuffle(r0, r1, odd);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = __builtin_shuffle(a[i], a[i + 2], pairs_lo);  // rows i..i+3 of columns 0 and 4
        b[i + 1] = __builtin_shuffle(a[i + 1], a[i + 3], pairs_lo);  // columns 1 and 5
        b[i + 2] = __builtin_shuffle(a[i], a[i + 2], pairs_hi);  // columns 2 and 6
        b[i + 3] = __builtin_shuffle(a[i + 1], a[i + 3], pairs_hi);  // columns 3 and 7
    }
    for (int j = 0; j < 4; ++j) {
        out[j] = __builtin_shuffle(b[j], b[j + 4], halves_lo);
        out[j + 4] = __builtin_shuffle(b[j], b[j + 4], halves_hi);
    }
}

// Rows 5r..5r+4 of the group's images, interleaved: band[x * 100 + col] lane i = images[i][5r + x][col].
// Where `check` is set, also whether any value is a NaN or an infinity, lane by lane (x - x is NaN there).
static void load_band(const double *const *images, int r, v8 *band, bool check, v8i *nonfinite)
{
    for (int x = 0; x < FILTER_DIM; ++x) {
        const long row = (long)(FILTER_DIM * r + x) * INPUT_DIM;
        v8 *out = band + x * INPUT_DIM;
        for (int col = 0; col < INPUT_DIM; col += 8) {
            const int at = col + 8 <= INPUT_DIM ? col : INPUT_DIM - 8;  // the last block overlaps the one before
            transpose8(images, row + at, out + at);
        }
        if (check)
            for (int col = 0; col < INPUT_DIM; ++col) {
                const v8 zero = out[col] - out[col];
                *nonfinite |= zero != zero;
            }
    }
}

// The band's 20 patches times the 10 filters, ReLU'd, into act[f * 400 + r * 20 + c] (the flattening order).
// FILTER_BLOCK x COLUMN_BLOCK sums at a time, each over its 25 taps in cpu.rs's order (x, then y).
static void conv_band(const v8 *band, const double *filters, int r, v8 *act)
{
    for (int c0 = 0; c0 < CONV_OUT_DIM; c0 += COLUMN_BLOCK)
        for (int f0 = 0; f0 < CONV_LAYER_SIZE; f0 += FILTER_BLOCK) {
            v8 sum[FILTER_BLOCK][COLUMN_BLOCK];
            for (int f = 0; f < FILTER_BLOCK; ++f)
                for (int c = 0; c < COLUMN_BLOCK; ++c)
                    sum[f][c] = splat(-0.0);
            for (int x = 0; x < FILTER_DIM; ++x)
                for (int y = 0; y < FILTER_DIM; ++y) {
                    v8 tap[COLUMN_BLOCK];
                    for (int c = 0; c < COLUMN_BLOCK; ++c)
                        tap[c] = band[x * INPUT_DIM + FILTER_DIM * (c0 + c) + y];
                    for (int f = 0; f < FILTER_BLOCK; ++f) {
                        const v8 weight = splat(filters[(f0 + f) * FILTER_DIM * FILTER_DIM + x * FILTER_DIM + y]);
                        for (int c = 0; c < COLUMN_BLOCK; ++c)
                            sum[f][c] += tap[c] * weight;
                    }
                }
            const v8 zero = splat(0.0);
            for (int f = 0; f < FILTER_BLOCK; ++f)
                for (int c = 0; c < COLUMN_BLOCK; ++c)  // ReLU as cpu.rs: below zero becomes +0.0; -0.0 and NaN stay
                    act[(f0 + f) * CONV_OUT_DIM * CONV_OUT_DIM + r * CONV_OUT_DIM + c0 + c] = sum[f][c] < zero ? zero : sum[f][c];
        }
}

// The output layer: neuron n's sum over the 4000 activations in order, NEURON_BLOCK neurons at a time.
// weights_t is the weights transposed, (4000, 10), so that the 10 weights of an activation are adjacent.
static void dense(const v8 *act, const double *weights_t, v8 *out)
{
    for (int n0 = 0; n0 < OUT_LAYER_SIZE; n0 += NEURON_BLOCK) {
        v8 sum[NEURON_BLOCK];
        for (int n = 0; n < NEURON_BLOCK; ++n)
            sum[n] = splat(-0.0);
        for (int k = 0; k < OUT_NEURON_DIM; ++k) {
            const v8 a = act[k];
            for (int n = 0; n < NEURON_BLOCK; ++n)
                sum[n] += a * splat(weights_t[k * OUT_LAYER_SIZE + n0 + n]);
        }
        for (int n = 0; n < NEURON_BLOCK; ++n)
            out[n0 + n] = sum[n];
    }
}

// One group: the forward of 8 images, outputs[n] lane i = image i's output n; true where a value was not finite.
static v8i forward_group(const double *const *images, const double *filters, const double *weights_t, Scratch *scratch, bool check,
                         v8 *outputs)
{
    v8i nonfinite = {};
    v8 *band = reinterpret_cast<v8 *>(scratch->band);
    v8 *act = reinterpret_cast<v8 *>(scratch->act);
    for (int r = 0; r < CONV_OUT_DIM; ++r) {
        load_band(images, r, band, check, &nonfinite);
        conv_band(band, filters, r, act);
    }
    dense(act, weights_t, outputs);
    return nonfinite;
}

// The plain loop, the bench's peer: cpu.rs's loops as written, 8 images a vector gathered value by value.
static void plain_group(const double *const *images, const double *filters, const double *weights, Scratch *scratch, v8 *outputs)
{
    v8 *act = reinterpret_cast<v8 *>(scratch->act);
    for (int f = 0; f < CONV_LAYER_SIZE; ++f)
        for (int r = 0; r < CONV_OUT_DIM; ++r)
            for (int c = 0; c < CONV_OUT_DIM; ++c) {
                v8 sum = splat(-0.0);
                for (int x = 0; x < FILTER_DIM; ++x)
                    for (int y = 0; y < FILTER_DIM; ++y) {
                        const long at = (long)(FILTER_DIM * r + x) * INPUT_DIM + FILTER_DIM * c + y;
                        v8 value;
                        for (int i = 0; i < 8; ++i)
                            value[i] = images[i][at];
                        sum += value * splat(filters[f * FILTER_DIM * FILTER_DIM + x * FILTER_DIM + y]);
                    }
                const v8 zero = splat(0.0);
                act[f * CONV_OUT_DIM * CONV_OUT_DIM + r * CONV_OUT_DIM + c] = sum < zero ? zero : sum;
            }
    for (int n = 0; n < OUT_LAYER_SIZE; ++n) {
        v8 sum = splat(-0.0);
        for (int k = 0; k < OUT_NEURON_DIM; ++k)
            sum += act[k] * splat(weights[n * OUT_NEURON_DIM + k]);
        outputs[n] = sum;
    }
}

// Image i's outputs, lane i of outputs[0..10), into out[i * 10 ..] for the group's first `count` images.
static void write_lanes(const v8 *outputs, int count, double *out)
{
    for (int i = 0; i < count; ++i)
        for (int n = 0; n < OUT_LAYER_SIZE; ++n)
            out[i * OUT_LAYER_SIZE + n] = outputs[n][i];
}

// Every double of values[0, count) read once: 8 sums side by side, so that the adds keep up with the loads.
static double read_values(const double *values, long count)
{
    v8 sum[8] = {};
    long i = 0;
    for (; i + 64 <= count; i += 64)
        for (int j = 0; j < 8; ++j)
            sum[j] += load8(values + i + 8 * j);
    double total = 0.0;
    for (; i < count; ++i)
        total += values[i];
    for (int j = 0; j < 8; ++j)
        for (int lane = 0; lane < 8; ++lane)
            total += sum[j][lane];
    return total;
}
