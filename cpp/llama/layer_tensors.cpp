// Compiled into libllama (it needs llama.cpp's internal headers).
#include "layer_tensors.h"

#include "ggml-backend.h"
#include "llama-model.h"

#include <map>
#include <stdexcept>

namespace selectinfer {

LayerTensors::LayerTensors(const llama_model * model, const std::vector<int> & layers, ggml_type type,
                           const std::vector<int64_t> & lengths, const char * name) {
    std::map<ggml_backend_buffer_type_t, ggml_context *> ctx_of_buft;
    for (size_t i = 0; i < layers.size(); ++i) {
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(model->dev_layer(layers[i]));
        ggml_context *& ctx = ctx_of_buft[buft];
        if (!ctx) {
            ggml_init_params params = {layers.size() * ggml_tensor_overhead(), nullptr, /*no_alloc=*/true};
            ctx = ggml_init(params);
            ctxs_.push_back(ctx);
        }
        ggml_tensor * t = ggml_new_tensor_1d(ctx, type, lengths[i]);
        ggml_format_name(t, "%s-%d", name, layers[i]);
        tensors_.push_back(t);
    }
    for (const auto & [buft, ctx] : ctx_of_buft) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (!buf) {
            throw std::runtime_error(std::string("could not allocate the ") + name + " buffers");
        }
        bufs_.push_back(buf);
    }
}

LayerTensors::~LayerTensors() {
    for (ggml_backend_buffer_t buf : bufs_) ggml_backend_buffer_free(buf);
    for (ggml_context * ctx : ctxs_) ggml_free(ctx);
}

void LayerTensors::clear() {
    for (ggml_backend_buffer_t buf : bufs_) ggml_backend_buffer_clear(buf, 0);
}

}  // namespace selectinfer
