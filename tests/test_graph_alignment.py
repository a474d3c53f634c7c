"""Graph tensors in host memory start on a cache line (ggml-patches/0008). ggml's CPU buffer aligns
tensors to 32 bytes; a graph holding a tensor of an odd number of 32-byte units (a 4-byte index
input) then lays the tensors after it across cache lines, and ggml's AMX matmuls ran 1.5x slower
on such a layout, the one a SelectInfer prompt got after every decode step (a graph is laid out
again when its node count changes). The graph allocator is called through the engine's own ggml
(the native module exports it), on a graph that would be misaligned without the patch."""
import ctypes

import pytest

from selectinfer import _native

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26
CACHE_LINE = 64


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    lib = ctypes.CDLL(_native.__file__)
    p = ctypes.c_void_p
    signatures = {
        "ggml_init": (p, [InitParams]),
        "ggml_free": (None, [p]),
        "ggml_new_tensor_1d": (p, [p, ctypes.c_int, ctypes.c_int64]),
        "ggml_new_tensor_2d": (p, [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
        "ggml_set_input": (None, [p]),
        "ggml_get_rows": (p, [p, p, p]),
        "ggml_add": (p, [p, p, p]),
        "ggml_new_graph": (p, [p]),
        "ggml_build_forward_expand": (None, [p, p]),
        "ggml_backend_cpu_buffer_type": (p, []),
        "ggml_gallocr_new": (p, [p]),
        "ggml_gallocr_alloc_graph": (ctypes.c_bool, [p, p]),
        "ggml_gallocr_free": (None, [p]),
        "ggml_get_data": (p, [p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def test_graph_tensors_after_an_odd_sized_input_start_on_a_cache_line(ggml):
    ctx = ggml.ggml_init(InitParams(16 * 1024 * 1024, None, True))  # tensors' metadata only
    assert ctx
    galloc = None
    try:
        index = ggml.ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1)  # 4 bytes: one 32-byte unit
        ggml.ggml_set_input(index)
        rows = ggml.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 48, 4)
        ggml.ggml_set_input(rows)
        picked = ggml.ggml_get_rows(ctx, rows, index)        # [48, 1]: 192 bytes
        summed = ggml.ggml_add(ctx, picked, picked)
        doubled = ggml.ggml_add(ctx, rows, rows)
        graph = ggml.ggml_new_graph(ctx)
        for t in (summed, doubled):
            ggml.ggml_build_forward_expand(graph, t)
        galloc = ggml.ggml_gallocr_new(ggml.ggml_backend_cpu_buffer_type())
        assert ggml.ggml_gallocr_alloc_graph(galloc, graph)
        tensors = {"index": index, "rows": rows, "picked": picked, "summed": summed, "doubled": doubled}
        addresses = {name: ggml.ggml_get_data(t) for name, t in tensors.items()}
        assert all(addresses.values()), addresses
        offsets = {name: address % CACHE_LINE for name, address in addresses.items()}
        assert offsets == dict.fromkeys(tensors, 0), offsets
    finally:
        if galloc:
            ggml.ggml_gallocr_free(galloc)
        ggml.ggml_free(ctx)
