#include "gguf_meta.h"

#include "ggml.h"
#include "gguf.h"

#include <memory>
#include <stdexcept>

namespace selectinfer {

namespace {

struct GgufDeleter {
    void operator()(gguf_context * ctx) const { gguf_free(ctx); }
};
struct GgmlDeleter {
    void operator()(ggml_context * ctx) const { ggml_free(ctx); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;

GgufPtr open_gguf(const std::string & path) {
    gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/nullptr};
    GgufPtr ctx(gguf_init_from_file(path.c_str(), params));
    if (!ctx) {
        throw std::runtime_error(path + " is not a readable GGUF file");
    }
    return ctx;
}

template <typename T> std::vector<int64_t> ints(const void * data, size_t n) {
    const T * p = static_cast<const T *>(data);
    return std::vector<int64_t>(p, p + n);
}

template <typename T> std::vector<double> reals(const void * data, size_t n) {
    const T * p = static_cast<const T *>(data);
    return std::vector<double>(p, p + n);
}

GgufValue value_of(const gguf_context * ctx, int64_t id) {
    switch (gguf_get_kv_type(ctx, id)) {
        case GGUF_TYPE_UINT8:   return (int64_t) gguf_get_val_u8(ctx, id);
        case GGUF_TYPE_INT8:    return (int64_t) gguf_get_val_i8(ctx, id);
        case GGUF_TYPE_UINT16:  return (int64_t) gguf_get_val_u16(ctx, id);
        case GGUF_TYPE_INT16:   return (int64_t) gguf_get_val_i16(ctx, id);
        case GGUF_TYPE_UINT32:  return (int64_t) gguf_get_val_u32(ctx, id);
        case GGUF_TYPE_INT32:   return (int64_t) gguf_get_val_i32(ctx, id);
        case GGUF_TYPE_UINT64:  return (int64_t) gguf_get_val_u64(ctx, id);
        case GGUF_TYPE_INT64:   return (int64_t) gguf_get_val_i64(ctx, id);
        case GGUF_TYPE_FLOAT32: return (double) gguf_get_val_f32(ctx, id);
        case GGUF_TYPE_FLOAT64: return gguf_get_val_f64(ctx, id);
        case GGUF_TYPE_BOOL:    return gguf_get_val_bool(ctx, id);
        case GGUF_TYPE_STRING:  return std::string(gguf_get_val_str(ctx, id));
        case GGUF_TYPE_ARRAY: {
            const size_t n = gguf_get_arr_n(ctx, id);
            const enum gguf_type at = gguf_get_arr_type(ctx, id);
            if (at == GGUF_TYPE_STRING) {
                std::vector<std::string> out;
                for (size_t i = 0; n <= 64 && i < n; ++i) out.emplace_back(gguf_get_arr_str(ctx, id, i));
                return out;
            }
            const void * d = gguf_get_arr_data(ctx, id);
            switch (at) {
                case GGUF_TYPE_UINT8:   return ints<uint8_t>(d, n);
                case GGUF_TYPE_INT8:    return ints<int8_t>(d, n);
                case GGUF_TYPE_UINT16:  return ints<uint16_t>(d, n);
                case GGUF_TYPE_INT16:   return ints<int16_t>(d, n);
                case GGUF_TYPE_UINT32:  return ints<uint32_t>(d, n);
                case GGUF_TYPE_INT32:   return ints<int32_t>(d, n);
                case GGUF_TYPE_UINT64:  return ints<uint64_t>(d, n);
                case GGUF_TYPE_INT64:   return ints<int64_t>(d, n);
                case GGUF_TYPE_FLOAT32: return reals<float>(d, n);
                case GGUF_TYPE_FLOAT64: return reals<double>(d, n);
                case GGUF_TYPE_BOOL:    return ints<int8_t>(d, n);
                default:                return std::monostate{};
            }
        }
        default: return std::monostate{};
    }
}

GgufHeader header_of(const gguf_context * ctx) {
    GgufHeader h;
    for (int64_t i = 0; i < gguf_get_n_kv(ctx); ++i) {
        h.kv.emplace_back(gguf_get_key(ctx, i), value_of(ctx, i));
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx); ++i) {
        const int64_t * ne = gguf_get_tensor_ne(ctx, i);
        h.tensors.push_back({gguf_get_tensor_name(ctx, i), (int) gguf_get_tensor_type(ctx, i),
                             std::vector<int64_t>(ne, ne + GGML_MAX_DIMS), gguf_get_tensor_offset(ctx, i),
                             gguf_get_tensor_size(ctx, i)});
    }
    h.data_offset = gguf_get_data_offset(ctx);
    h.alignment   = gguf_get_alignment(ctx);
    return h;
}

void set_key(gguf_context * ctx, const NewKey & k) {
    const char * key = k.key.c_str();
    if (k.type == "u32") {
        gguf_set_val_u32(ctx, key, (uint32_t) std::get<int64_t>(k.value));
    } else if (k.type == "i32") {
        gguf_set_val_i32(ctx, key, (int32_t) std::get<int64_t>(k.value));
    } else if (k.type == "f32") {
        gguf_set_val_f32(ctx, key, (float) std::get<double>(k.value));
    } else if (k.type == "str") {
        gguf_set_val_str(ctx, key, std::get<std::string>(k.value).c_str());
    } else if (k.type == "arr_u32" || k.type == "arr_i32") {
        const auto & v = std::get<std::vector<int64_t>>(k.value);
        if (k.type == "arr_u32") {
            std::vector<uint32_t> d(v.begin(), v.end());
            gguf_set_arr_data(ctx, key, GGUF_TYPE_UINT32, d.data(), d.size());
        } else {
            std::vector<int32_t> d(v.begin(), v.end());
            gguf_set_arr_data(ctx, key, GGUF_TYPE_INT32, d.data(), d.size());
        }
    } else if (k.type == "arr_f32") {
        const auto & v = std::get<std::vector<double>>(k.value);
        std::vector<float> d(v.begin(), v.end());
        gguf_set_arr_data(ctx, key, GGUF_TYPE_FLOAT32, d.data(), d.size());
    } else {
        throw std::invalid_argument("unknown GGUF key type '" + k.type + "' for " + k.key);
    }
}

}  // namespace

GgufHeader read_gguf_header(const std::string & path) {
    return header_of(open_gguf(path).get());
}

GgufHeader write_gguf_header(const std::string & src_path, const std::string & out_path,
                             const std::vector<std::string> & remove, const std::vector<NewKey> & set,
                             const std::vector<GgufTensor> & tensors) {
    GgufPtr src = open_gguf(src_path);
    GgufPtr out(gguf_init_empty());
    gguf_set_kv(out.get(), src.get());
    for (const auto & key : remove) gguf_remove_key(out.get(), key.c_str());
    for (const auto & k : set) set_key(out.get(), k);

    ggml_init_params params = {tensors.size() * ggml_tensor_overhead() + 1024, nullptr, /*no_alloc=*/true};
    std::unique_ptr<ggml_context, GgmlDeleter> meta(ggml_init(params));
    for (const auto & t : tensors) {
        if (t.ne.empty() || t.ne.size() > GGML_MAX_DIMS) throw std::invalid_argument("bad shape for tensor " + t.name);
        ggml_tensor * tensor = ggml_new_tensor(meta.get(), (ggml_type) t.type, (int) t.ne.size(), t.ne.data());
        ggml_set_name(tensor, t.name.c_str());
        gguf_add_tensor(out.get(), tensor);
    }
    if (!gguf_write_to_file(out.get(), out_path.c_str(), /*only_meta=*/true)) {
        throw std::runtime_error("could not write " + out_path);
    }
    GgufHeader h = header_of(out.get());
    h.data_offset = gguf_get_meta_size(out.get());
    return h;
}

}  // namespace selectinfer
