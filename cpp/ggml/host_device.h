// What the code shared by the CPU and the CUDA kernels (row_decode.h, selection_rule.h) needs to
// compile for both: SI_HD marks a function for the host and the device, and a float's bits are
// read and written with the device's intrinsics or, on the host, memcpy.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SI_HD __host__ __device__ __forceinline__
#else
#define SI_HD inline
#endif

namespace si_hd {

SI_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}

SI_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
#endif
}

}  // namespace si_hd
