// Row (de)quantization with ggml's own per-type kernels, for the converter (convert.py): it
// re-lays out the down projection so that every FFN neuron is one row in every FFN matrix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace selectinfer {

// Bytes of one row of n_per_row values in ggml type `type` (a ggml_type / GGMLQuantizationType id).
size_t row_bytes(int type, int64_t n_per_row);

// Values per block of `type` (1 for F32/F16/BF16, 32 for Q8_0..Q5_1, 256 for the K-quants).
int64_t block_size(int type);

// n_rows x n_per_row floats -> the same rows in `type`; n_per_row must be a multiple of the block size.
std::string quantize_rows(int type, const float * data, int64_t n_rows, int64_t n_per_row);

// The inverse: rows stored in `type` -> floats.
std::vector<float> dequantize_rows(int type, const uint8_t * data, int64_t n_rows, int64_t n_per_row);

}  // namespace selectinfer
