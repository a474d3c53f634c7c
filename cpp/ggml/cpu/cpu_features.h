// The CPU levels the sparse FFN kernels are built for, in one place: every SI_ feature macro of
// the CPU backend (block_loops.h and the kernel families sparse_ffn_cpu.h declares) is defined
// here, from the compiler's target macros, so each CPU variant of ggml-cpu compiles the kernels
// its flags allow. A family's file is wrapped in its macro: a build without it compiles it to
// nothing.
#pragma once

// vector width of the block loops (block_loops.h): 16 floats with AVX-512 or off x86 (NEON), 8 on other x86
#if defined(__AVX512F__) || !(defined(__x86_64__) || defined(__i386__))
#define SI_LANES 16
#else
#define SI_LANES 8
#endif

#if defined(__AVX2__)
// x86 AVX2: rows added in integers at decode, the transposed down projection (block_loops.h AddRows)
#define SI_INT_ROWS 1
#if defined(__F16C__)
// x86 AVX2 + F16C: rows dotted in integers at decode, x quantized to int8 (block_loops.h DotRowsInt; rows_one_token.cpp)
#define SI_INT_DOTS 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
// x86 AVX-512 VNNI (F, BW, VL): Q4_0/Q4_1 dotted four blocks per vector, Q8_0/Q4_0/Q4_1 added four rows per dpbusd (block_loops.h)
#define SI_INT_DOTS_512 1
#endif
#endif
#endif

#if defined(__AVX2__)
// x86 AVX2: several tokens of Q4_0/Q4_1 gate and up through upstream's repacked GEMM (repacked_gemm.cpp)
#define SI_REPACKED_GEMM 1
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// x86 AVX-512 VNNI + BW: a prompt's down projection of quantized rows in int8 (int8_prompt.cpp)
#define SI_INT8_PROMPT 1
#endif

#if defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__linux__)
// x86 AMX-TILE + AVX512-BF16 on Linux: a prompt's gate, up and down on AMX bf16 tiles, where the CPU permits them at run time (amx_bf16.cpp)
#define SI_AMX_BF16 1
// the attribute of the functions that run AMX-BF16 tile products (ggml's sapphirerapids variant names only AMX_TILE and AMX_INT8)
#define SI_AMX_BF16_TARGET __attribute__((target("amx-bf16")))
#endif

#if defined(__AVX512F__)
// x86 AVX-512F: a token's top k by partitions in vectors for count and select (select.cpp), else the radix select
#define SI_PARTITION_SELECT 1
#endif
