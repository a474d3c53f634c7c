// The host side of the CUDA kernels' logic, for tests/test_cuda_logic.py:
//   cuda_logic_check decode TYPE N_ROWS N_COLS ROW_BYTES < rows   -> every row as floats, decoded
//       32 values at a time by row_decode.h (the CUDA kernels' dequantization);
//   cuda_logic_check top N K BY_MAGNITUDE < N floats             -> the ids of a token's top K
//       (selection_rule.h: rank key, order bits, radix select, ties to the lower row), int32;
//   cuda_logic_check positives N < N floats                      -> how many count as positive;
//   cuda_logic_check score N SCORE < N floats                    -> each one's select score, floats.
#include "row_decode.h"
#include "selection_rule.h"
#include "sparse_ffn_ops.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

template <ggml_type T> void decode_rows(const std::vector<uint8_t> & data, int n_rows, int64_t n_cols, int64_t row_bytes) {
    std::vector<float> values(n_cols);
    for (int r = 0; r < n_rows; ++r) {
        for (int64_t g = 0; g < n_cols / 32; ++g) si_decode::row_group<T>(data.data() + r * row_bytes, g, values.data() + 32 * g);
        fwrite(values.data(), sizeof(float), n_cols, stdout);
    }
}

int decode(int argc, char ** argv) {
    if (argc != 6) return 2;
    const int type = atoi(argv[2]), n_rows = atoi(argv[3]);
    const int64_t n_cols = atoll(argv[4]), row_bytes = atoll(argv[5]);
    std::vector<uint8_t> data(n_rows * row_bytes);
    if (fread(data.data(), 1, data.size(), stdin) != data.size() || n_cols % 32 != 0) return 2;
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: decode_rows<GGML_TYPE_##T>(data, n_rows, n_cols, row_bytes); break;
        GGML_SI_FUSED_TYPES(SI_CASE)
#undef SI_CASE
        default: return 2;
    }
    return 0;
}

int top(int argc, char ** argv) {
    if (argc != 5) return 2;
    const int64_t n = atoll(argv[2]), k = atoll(argv[3]);
    const bool by_magnitude = atoi(argv[4]) != 0;
    std::vector<float> a(n);
    if (fread(a.data(), sizeof(float), n, stdin) != (size_t) n) return 2;
    std::vector<int32_t> ids;
    std::vector<uint32_t> narrowed(n);
    si_rule::take_top_k([&](int64_t i) { return si_rule::order_bits(si_rule::rank_key(a[i], by_magnitude)); }, n, k,
                        [&](int64_t i, int64_t place) {
                            if (place != (int64_t) ids.size()) std::abort();  // places count up from 0
                            ids.push_back((int32_t) i);
                        },
                        narrowed.data());
    fwrite(ids.data(), sizeof(int32_t), ids.size(), stdout);
    return 0;
}

static bool read_floats(std::vector<float> & a) { return fread(a.data(), sizeof(float), a.size(), stdin) == a.size(); }

int positives(int argc, char ** argv) {
    if (argc != 3) return 2;
    std::vector<float> a(atoll(argv[2]));
    if (!read_floats(a)) return 2;
    int64_t n = 0;
    for (float v : a) n += si_rule::is_positive(v);
    printf("%lld\n", (long long) n);
    return 0;
}

int score(int argc, char ** argv) {
    if (argc != 4) return 2;
    std::vector<float> a(atoll(argv[2]));
    if (!read_floats(a)) return 2;
    for (float & v : a) v = si_rule::score_of(v, atoi(argv[3]));
    fwrite(a.data(), sizeof(float), a.size(), stdout);
    return 0;
}

int main(int argc, char ** argv) {
    int rc = 2;
    if (argc > 1 && std::strcmp(argv[1], "decode") == 0) rc = decode(argc, argv);
    if (argc > 1 && std::strcmp(argv[1], "top") == 0) rc = top(argc, argv);
    if (argc > 1 && std::strcmp(argv[1], "positives") == 0) rc = positives(argc, argv);
    if (argc > 1 && std::strcmp(argv[1], "score") == 0) rc = score(argc, argv);
    if (rc == 2) {
        fprintf(stderr, "usage: %s decode TYPE N_ROWS N_COLS ROW_BYTES < rows | top N K BY_MAGNITUDE < floats | "
                        "positives N < floats | score N SCORE < floats\n", argv[0]);
    }
    return rc;
}
