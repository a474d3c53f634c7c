// Integer values of a GGUF, of whichever integer type the writer chose: shared by the checks of
// the selectinfer.* keys (si_gguf.cpp) and of the values llama.cpp asserts on (file_checks.cpp).
#pragma once

#include "gguf.h"

#include <cstdint>

namespace selectinfer {

inline bool is_integer(gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
            return true;
        default:
            return false;
    }
}

// Integer element i of a value (scalar: i = 0) or array of any integer type; a uint64 above
// INT64_MAX reads as INT64_MAX.
inline int64_t integer_at(const void * data, gguf_type t, size_t i) {
    switch (t) {
        case GGUF_TYPE_UINT8:  return ((const uint8_t *) data)[i];
        case GGUF_TYPE_INT8:   return ((const int8_t *) data)[i];
        case GGUF_TYPE_UINT16: return ((const uint16_t *) data)[i];
        case GGUF_TYPE_INT16:  return ((const int16_t *) data)[i];
        case GGUF_TYPE_UINT32: return ((const uint32_t *) data)[i];
        case GGUF_TYPE_INT32:  return ((const int32_t *) data)[i];
        case GGUF_TYPE_UINT64: {
            const uint64_t v = ((const uint64_t *) data)[i];
            return v > (uint64_t) INT64_MAX ? INT64_MAX : (int64_t) v;
        }
        case GGUF_TYPE_INT64:  return ((const int64_t *) data)[i];
        default:               return 0;
    }
}

}  // namespace selectinfer
