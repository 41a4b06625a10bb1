// The CPU forward's kernels, compiled once per instruction set by native/cpu_forward.cpp, inside a
// namespace of its own with LANES (doubles a vector), FILTER_BLOCK, COLUMN_BLOCK and NEURON_BLOCK set
// for that set's vectors and registers. No includes here: the file is pasted inside a namespace.
//
// A group is LANES images side by side: a vec holds one value of each, so every operation below is
// the same scalar operation of cpu.rs on LANES independent sums at once. No sum is split or reordered:
// each is a left fold from -0.0 (Rust's f64 Sum starts there, as the numpy forward's sums are told to;
// -0.0 + x is x), its terms a rounded multiply then a rounded add (built with -ffp-contract=off).

typedef double vec __attribute__((vector_size(LANES * 8)));
typedef long long veci __attribute__((vector_size(LANES * 8)));
typedef double v8 __attribute__((vector_size(64)));  // the plain loop's and read_values' 8 doubles, whatever LANES is

// The element indices 0 .. N - 1 as a pack, to spell a vector element by element: a broadcast, a shuffle's mask.
template <int... K>
struct Indices {};
template <int N, int... K>
struct LaneList : LaneList<N - 1, N - 1, K...> {};
template <int... K>
struct LaneList<0, K...> {
    typedef Indices<K...> type;
};

template <typename Vector, int... K>
static inline __attribute__((always_inline)) Vector splat(double x, Indices<K...>)
{
    return Vector{((void)K, x)...};
}

// x in every element: one vbroadcastsd from memory (a loop storing x element by element costs a load and a vinsertf128).
template <typename Vector = vec>
static inline __attribute__((always_inline)) Vector splat(double x)
{
    return splat<Vector>(x, typename LaneList<sizeof(Vector) / sizeof x>::type());
}

template <typename Vector = vec>
static inline __attribute__((always_inline)) Vector load(const double *p)
{
    Vector v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

// One butterfly of the transpose's round of `WIDTH`, on two rows `WIDTH` apart: the first row's odd blocks of
// WIDTH elements swap with the second row's even ones. The masks are constants, so each is one shuffle.
template <int WIDTH, int... K>
static inline __attribute__((always_inline)) void butterfly(vec *first, vec *second, Indices<K...>)
{
    const vec a = *first, b = *second;
    *first = __builtin_shuffle(a, b, veci{(K & WIDTH ? LANES + K - WIDTH : K)...});
    *second = __builtin_shuffle(a, b, veci{(K & WIDTH ? LANES + K : K + WIDTH)...});
}

// The rounds of WIDTH and up: log2(LANES) in all (AVX2: unpacks, then 128-bit permutes; a shuffle a vector a round).
template <int WIDTH>
static inline __attribute__((always_inline)) void butterflies(vec *row)
{
    if constexpr (WIDTH < LANES) {
        for (int i = 0; i < LANES; ++i)
            if (!(i & WIDTH))
                butterfly<WIDTH>(&row[i], &row[i + WIDTH], typename LaneList<LANES>::type());
        butterflies<WIDTH * 2>(row);
    }
}

// LANES rows of LANES doubles (row i from images[i] + at) transposed into out: out[j] element i = row i's j-th.
static inline __attribute__((always_inline)) void transpose(const double *const *images, long at, vec *out)
{
    vec row[LANES];
    for (int i = 0; i < LANES; ++i)
        row[i] = load(images[i] + at);
    butterflies<1>(row);
    for (int j = 0; j < LANES; ++j)
        out[j] = row[j];
}

// Share `block` of `blocks` of band r's cache lines (63 an image), asked of memory ahead of load_band. Spread
// over the conv's register blocks, the reads overlap its arithmetic (AVX2 on Zen 3, one thread: 1.20x;
// all of them at once before the conv gained nothing, and a share a column block 1.12x).
static inline __attribute__((always_inline)) void prefetch_share(const double *const *images, int r, int block, int blocks)
{
    constexpr long LINE = 64 / sizeof(double), LINES = (FILTER_DIM * INPUT_DIM + LINE - 1) / LINE;
    for (int i = 0; i < LANES; ++i)
        for (long line = LINES * block / blocks; line < LINES * (block + 1) / blocks; ++line)
            __builtin_prefetch(images[i] + (long)FILTER_DIM * r * INPUT_DIM + LINE * line);
}

// Rows 5r..5r+4 of the group's images, interleaved: band[x * 100 + col] element i = images[i][5r + x][col].
static void load_band(const double *const *images, int r, vec *band)
{
    for (int x = 0; x < FILTER_DIM; ++x) {
        const long row = (long)(FILTER_DIM * r + x) * INPUT_DIM;
        for (int col = 0; col < INPUT_DIM; col += LANES) {
            const int at = col + LANES <= INPUT_DIM ? col : INPUT_DIM - LANES;  // a last block overlaps the one before
            transpose(images, row + at, band + x * INPUT_DIM + at);
        }
    }
}

// The band's 20 patches times the 10 filters, ReLU'd, into act[f * 400 + r * 20 + c] (the flattening order).
// FILTER_BLOCK x COLUMN_BLOCK sums at a time, each over its 25 taps in cpu.rs's order (x, then y).
// Where `check` is set, the elements whose first filter's sum is not finite are set in *suspect: every
// value of an image is a tap of one patch, and a NaN or an infinity times any weight makes that sum one,
// so 400 vectors of sums a group are looked at instead of 10,000 of values (where all is finite, it is free).
// Where `next` is given (the group's images, but for the last band), band r + 1 is prefetched a share a block,
// after the block's sums (before them, gcc spilled a tap of the AVX-512 block to the stack).
static void conv_band(const vec *band, const double *filters, int r, bool check, veci *suspect, vec *act,
                      const double *const *next)
{
    constexpr int FILTER_BLOCKS = CONV_LAYER_SIZE / FILTER_BLOCK, BLOCKS = CONV_OUT_DIM / COLUMN_BLOCK * FILTER_BLOCKS;
    for (int c0 = 0; c0 < CONV_OUT_DIM; c0 += COLUMN_BLOCK)
        for (int f0 = 0; f0 < CONV_LAYER_SIZE; f0 += FILTER_BLOCK) {
            vec sum[FILTER_BLOCK][COLUMN_BLOCK];
            for (int f = 0; f < FILTER_BLOCK; ++f)
                for (int c = 0; c < COLUMN_BLOCK; ++c)
                    sum[f][c] = splat(-0.0);
            for (int x = 0; x < FILTER_DIM; ++x)
                for (int y = 0; y < FILTER_DIM; ++y) {
                    vec tap[COLUMN_BLOCK];
                    for (int c = 0; c < COLUMN_BLOCK; ++c)
                        tap[c] = band[x * INPUT_DIM + FILTER_DIM * (c0 + c) + y];
                    for (int f = 0; f < FILTER_BLOCK; ++f) {
                        const vec weight = splat(filters[(f0 + f) * FILTER_DIM * FILTER_DIM + x * FILTER_DIM + y]);
                        for (int c = 0; c < COLUMN_BLOCK; ++c)
                            sum[f][c] += tap[c] * weight;
                    }
                }
            if (check && f0 == 0)
                for (int c = 0; c < COLUMN_BLOCK; ++c) {
                    const vec zero = sum[0][c] - sum[0][c];  // NaN where the sum is not finite
                    *suspect |= zero != zero;
                }
            const vec zero = splat(0.0);
            for (int f = 0; f < FILTER_BLOCK; ++f)
                for (int c = 0; c < COLUMN_BLOCK; ++c)  // ReLU as cpu.rs: below zero becomes +0.0; -0.0 and NaN stay
                    act[(f0 + f) * CONV_OUT_DIM * CONV_OUT_DIM + r * CONV_OUT_DIM + c0 + c] = sum[f][c] < zero ? zero : sum[f][c];
            if (next)
                prefetch_share(next, r + 1, c0 / COLUMN_BLOCK * FILTER_BLOCKS + f0 / FILTER_BLOCK, BLOCKS);
        }
}

// The output layer: neuron n's sum over the 4000 activations in order, NEURON_BLOCK neurons at a time.
// weights_t is the weights transposed, (4000, 10), so that the 10 weights of an activation are adjacent.
static void dense(const vec *act, const double *weights_t, vec *out)
{
    for (int n0 = 0; n0 < OUT_LAYER_SIZE; n0 += NEURON_BLOCK) {
        vec sum[NEURON_BLOCK];
        for (int n = 0; n < NEURON_BLOCK; ++n)
            sum[n] = splat(-0.0);
        for (int k = 0; k < OUT_NEURON_DIM; ++k) {
            const vec a = act[k];
            for (int n = 0; n < NEURON_BLOCK; ++n)
                sum[n] += a * splat(weights_t[k * OUT_LAYER_SIZE + n0 + n]);
        }
        for (int n = 0; n < NEURON_BLOCK; ++n)
            out[n0 + n] = sum[n];
    }
}

// One group: the forward of LANES images, outputs[n] element i = image i's output n. Where `check` is set, the
// elements that may hold a NaN or an infinity (the caller looks at their values); none are missed.
static veci forward_group(const double *const *images, const double *filters, const double *weights_t, Scratch *scratch,
                          bool check, vec *outputs)
{
    veci suspect = {};
    vec *band = reinterpret_cast<vec *>(scratch->band);
    vec *act = reinterpret_cast<vec *>(scratch->act);
    for (int r = 0; r < CONV_OUT_DIM; ++r) {
        load_band(images, r, band);
        conv_band(band, filters, r, check, &suspect, act, r + 1 < CONV_OUT_DIM ? images : nullptr);
    }
    dense(act, weights_t, outputs);
    return suspect;
}

// The plain loop, the bench's peer: cpu.rs's loops as written, 8 images a vector gathered value by value.
static void plain_group(const double *const *images, const double *filters, const double *weights, Scratch *scratch, v8 *outputs)
{
    v8 *act = reinterpret_cast<v8 *>(scratch->act);
    for (int f = 0; f < CONV_LAYER_SIZE; ++f)
        for (int r = 0; r < CONV_OUT_DIM; ++r)
            for (int c = 0; c < CONV_OUT_DIM; ++c) {
                v8 sum = splat<v8>(-0.0);
                for (int x = 0; x < FILTER_DIM; ++x)
                    for (int y = 0; y < FILTER_DIM; ++y) {
                        const long at = (long)(FILTER_DIM * r + x) * INPUT_DIM + FILTER_DIM * c + y;
                        v8 value;
                        for (int i = 0; i < 8; ++i)
                            value[i] = images[i][at];
                        sum += value * splat<v8>(filters[f * FILTER_DIM * FILTER_DIM + x * FILTER_DIM + y]);
                    }
                const v8 zero = splat<v8>(0.0);
                act[f * CONV_OUT_DIM * CONV_OUT_DIM + r * CONV_OUT_DIM + c] = sum < zero ? zero : sum;
            }
    for (int n = 0; n < OUT_LAYER_SIZE; ++n) {
        v8 sum = splat<v8>(-0.0);
        for (int k = 0; k < OUT_NEURON_DIM; ++k)
            sum += act[k] * splat<v8>(weights[n * OUT_NEURON_DIM + k]);
        outputs[n] = sum;
    }
}

// Image i's outputs, element i of outputs[0..10), into out[i * 10 ..] for the group's first `count` images.
template <typename Vector>
static void write_outputs(const Vector *outputs, int count, double *out)
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
            sum[j] += load<v8>(values + i + 8 * j);
    double total = 0.0;
    for (; i < count; ++i)
        total += values[i];
    for (int j = 0; j < 8; ++j)
        for (int lane = 0; lane < 8; ++lane)
            total += sum[j][lane];
    return total;
}
