// Runs the fused block loops (cpp/ggml/cpu/block_loops.h) as built for one CPU level, for
// tests/test_block_loops.py:  block_loops_check TYPE N_ROWS N_COLS ROW_BYTES < rows v x
// stdin: N_ROWS rows of ROW_BYTES, then N_ROWS floats v and N_COLS floats x (native order).
// stdout: every row as floats (N_ROWS x N_COLS), x + sum_k v[k] row k (N_COLS), row k . x (N_ROWS),
// row k . x with x quantized to int8 (DotRowsInt where the build has it, else the float loop again;
// N_ROWS), then 1 where rows are added in integers (8-bit factors, block_loops.h), else 0, and 1
// where they are dotted in integers, else 0.
#include "block_loops.h"
#include "sparse_ffn_ops.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace si_blocks;

template <ggml_type T> struct Check {
    static void run(const std::vector<const char *> & rows, const float * v, const float * x, int64_t n_cols) {
        const int n_rows = (int) rows.size();
        std::vector<float> values(n_cols);
        for (int k = 0; k < n_rows; ++k) {
            BlocksToFloat<T>::run(rows[k], 0, n_cols / 32, values.data());
            fwrite(values.data(), sizeof(float), n_cols, stdout);
        }
        std::vector<float> y(x, x + n_cols), dots(n_rows);
        // as the kernels call them: ADD_GROUP rows at a time added, GROUP at a time dotted
        for (int k0 = 0; k0 < n_rows; k0 += ADD_GROUP) {
            AddRows<T>::run(rows.data() + k0, v + k0, std::min(ADD_GROUP, n_rows - k0), n_cols, y.data());
        }
        for (int k0 = 0; k0 < n_rows; k0 += GROUP) {
            DotRows<T>::run(rows.data() + k0, std::min(GROUP, n_rows - k0), x, n_cols, dots.data() + k0);
        }
        std::vector<float> int_dots(dots);
#if defined(SI_INT_DOTS)
        if constexpr (has_int_dots<T>) {
            std::vector<char> buf(int8_vector_bytes(n_cols));
            const Int8Vector xq = int8_vector_at(buf.data(), n_cols);
            quantize_int8(x, n_cols, xq);
            DotRowsInt<T>::arrange_input(xq, n_cols);
            // GROUP at a time, each group reading the next one ahead, as the kernel calls them
            for (int k0 = 0; k0 < n_rows; k0 += GROUP) {
                const int nr = std::min(GROUP, n_rows - k0), n_next = std::max(0, std::min(GROUP, n_rows - k0 - GROUP));
                DotRowsInt<T>::run(rows.data() + k0, nr, xq, n_cols, int_dots.data() + k0, rows.data() + k0 + nr, n_next);
            }
        }
#endif
        fwrite(y.data(), sizeof(float), n_cols, stdout);
        fwrite(dots.data(), sizeof(float), n_rows, stdout);
        fwrite(int_dots.data(), sizeof(float), n_rows, stdout);
        const float flags[2] = {has_int_rows<T> ? 1.0f : 0.0f, has_int_dots<T> ? 1.0f : 0.0f};
        fwrite(flags, sizeof(float), 2, stdout);
    }
};

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TYPE N_ROWS N_COLS ROW_BYTES < rows v x\n", argv[0]);
        return 2;
    }
    const int type = atoi(argv[1]), n_rows = atoi(argv[2]);
    const int64_t n_cols = atoll(argv[3]), row_bytes = atoll(argv[4]);
    std::vector<char> data(n_rows * row_bytes);
    std::vector<float> v(n_rows), x(n_cols);
    if (fread(data.data(), 1, data.size(), stdin) != data.size() || fread(v.data(), 4, n_rows, stdin) != (size_t) n_rows ||
        fread(x.data(), 4, n_cols, stdin) != (size_t) n_cols || n_cols % 32 != 0) {
        fprintf(stderr, "block_loops_check: short input or N_COLS not a multiple of 32\n");
        return 2;
    }
    std::vector<const char *> rows(n_rows);
    for (int k = 0; k < n_rows; ++k) rows[k] = data.data() + k * row_bytes;
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: Check<GGML_TYPE_##T>::run(rows, v.data(), x.data(), n_cols); break;
        GGML_SI_FUSED_TYPES(SI_CASE)
#undef SI_CASE
        default: fprintf(stderr, "block_loops_check: no block loop for type %d\n", type); return 2;
    }
    return 0;
}
