// GGUF metadata through ggml's own gguf API, for the converter: reading a header is fast (no
// tensor data), and a new header copies every key of the source unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace selectinfer {

using GgufValue = std::variant<std::monostate, int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>>;

struct GgufTensor {
    std::string          name;
    int                  type;    // ggml_type
    std::vector<int64_t> ne;      // ggml order: ne[0] is the row length
    uint64_t             offset;  // from the start of the data section
    uint64_t             nbytes;
};

struct GgufHeader {
    std::vector<std::pair<std::string, GgufValue>> kv;  // string arrays longer than 64 entries are left empty
    std::vector<GgufTensor> tensors;
    uint64_t data_offset = 0;
    uint64_t alignment   = 0;
};

// Throws std::runtime_error naming the file when it is not a readable GGUF.
GgufHeader read_gguf_header(const std::string & path);

struct NewKey {
    std::string key;
    std::string type;  // "u32", "i32", "f32", "str", "arr_u32", "arr_i32", "arr_f32"
    GgufValue   value;
};

// Writes to `out_path` the header of a GGUF holding every key of `src_path` except `remove`,
// plus `set` (added or replaced), and the tensor infos `tensors` (offsets are assigned here).
// Returns the header with the data offset and each tensor's offset: the caller writes the data.
GgufHeader write_gguf_header(const std::string & src_path, const std::string & out_path,
                             const std::vector<std::string> & remove, const std::vector<NewKey> & set,
                             const std::vector<GgufTensor> & tensors);

}  // namespace selectinfer
