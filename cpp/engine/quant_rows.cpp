#include "quant_rows.h"

#include "ggml.h"

#include <stdexcept>

namespace selectinfer {

namespace {

ggml_type checked_type(int type, int64_t n_per_row) {
    if (type < 0 || type >= GGML_TYPE_COUNT || ggml_get_type_traits((ggml_type) type)->blck_size == 0) {
        throw std::invalid_argument("unknown ggml type id " + std::to_string(type));
    }
    const ggml_type t = (ggml_type) type;
    const int64_t block = ggml_blck_size(t);
    if (n_per_row % block != 0) {
        throw std::invalid_argument(std::string("rows of ") + std::to_string(n_per_row) + " values cannot be stored as " +
                                    ggml_type_name(t) + " (blocks of " + std::to_string(block) + ")");
    }
    return t;
}

}  // namespace

size_t row_bytes(int type, int64_t n_per_row) {
    return ggml_row_size(checked_type(type, n_per_row), n_per_row);
}

int64_t block_size(int type) {
    return ggml_blck_size(checked_type(type, 0));
}

std::string quantize_rows(int type, const float * data, int64_t n_rows, int64_t n_per_row) {
    const ggml_type t = checked_type(type, n_per_row);
    if (ggml_quantize_requires_imatrix(t)) {
        throw std::invalid_argument(std::string(ggml_type_name(t)) + " needs an importance matrix to quantize");
    }
    std::string out(ggml_row_size(t, n_per_row) * n_rows, '\0');
    ggml_quantize_init(t);
    ggml_quantize_chunk(t, data, out.data(), 0, n_rows, n_per_row, nullptr);
    return out;
}

std::vector<float> dequantize_rows(int type, const uint8_t * data, int64_t n_rows, int64_t n_per_row) {
    const ggml_type t = checked_type(type, n_per_row);
    const auto * traits = ggml_get_type_traits(t);
    if (!traits->to_float) {
        throw std::invalid_argument(std::string("cannot convert ") + ggml_type_name(t) + " to float");
    }
    std::vector<float> out(n_rows * n_per_row);
    const size_t stride = ggml_row_size(t, n_per_row);
    for (int64_t r = 0; r < n_rows; ++r) {
        traits->to_float(data + r * stride, out.data() + r * n_per_row, n_per_row);
    }
    return out;
}

}  // namespace selectinfer
