// Runs ggml's AMX tile-configuration routine, compiled exactly as the build compiles it, and
// reports the 64 bytes that `ldtilecfg` receives (cmake/amx_tilecfg_check.py writes the routine
// into TILECFG_SOURCE and compiles this file with the build's compiler and flags).
//
// No AMX CPU is needed: on a CPU without AMX, ldtilecfg raises SIGILL before it reads memory; the
// handler decodes the instruction's memory operand from the saved registers and copies the
// configuration. On an AMX CPU the instruction runs and `sttilecfg` reads back what the CPU
// loaded. Either way a compiler that drops the stores of `rows` and `colsb` shows zeros.
#include <immintrin.h>

#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ucontext.h>
#include <unistd.h>

#include TILECFG_SOURCE  // struct tile_config_t and ggml_tile_config_init(), verbatim from ggml

namespace {

alignas(64) unsigned char g_config[64];
sigjmp_buf g_jump;
const char * g_how = "the CPU's loaded configuration (sttilecfg)";

// General-purpose register n (ModRM/SIB numbering, 0..15) from the signal context.
uint64_t reg(const mcontext_t & m, int n) {
    static const int map[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
    return (uint64_t) m.gregs[map[n]];
}

// Effective address of `ldtilecfg m512` (VEX.128.NP.0F38.W0 49 /0) at rip, or 0 if it is not one.
uint64_t ldtilecfg_address(const mcontext_t & m) {
    const auto * p = (const uint8_t *) m.gregs[REG_RIP];
    if (p[0] != 0xC4 || (p[1] & 0x1F) != 0x02 || p[3] != 0x49) return 0;
    const int x = (p[1] & 0x40) ? 0 : 8, b = (p[1] & 0x20) ? 0 : 8;  // VEX.X, VEX.B are stored inverted
    const uint8_t modrm = p[4];
    const int mod = modrm >> 6, rm = modrm & 7;
    if (mod == 3 || ((modrm >> 3) & 7) != 0) return 0;
    const uint8_t * q = p + 5;
    uint64_t ea = 0;
    bool rip_relative = false;
    if (rm == 4) {  // SIB
        const uint8_t sib = *q++;
        const int scale = sib >> 6, index = ((sib >> 3) & 7) | x, base = (sib & 7) | b;
        if (index != 4) ea += reg(m, index) << scale;
        if ((sib & 7) == 5 && mod == 0) {
            int32_t d; std::memcpy(&d, q, 4); q += 4; ea += (int64_t) d;
        } else {
            ea += reg(m, base);
        }
    } else if (rm == 5 && mod == 0) {
        rip_relative = true;
    } else {
        ea += reg(m, rm | b);
    }
    if (mod == 1) { ea += (int64_t) (int8_t) *q++; }
    if (mod == 2 || rip_relative) { int32_t d; std::memcpy(&d, q, 4); q += 4; ea += (int64_t) d; }
    if (rip_relative) ea += (uint64_t) q;  // relative to the next instruction
    return ea;
}

void on_sigill(int, siginfo_t *, void * uc) {
    const mcontext_t & m = ((ucontext_t *) uc)->uc_mcontext;
    const uint64_t ea = ldtilecfg_address(m);
    if (ea == 0) {
        static const char msg[] = "error: SIGILL outside ldtilecfg\n";
        (void) !write(2, msg, sizeof(msg) - 1);
        _exit(3);
    }
    std::memcpy(g_config, (const void *) ea, sizeof(g_config));
    g_how = "the operand of the faulting ldtilecfg (this CPU has no AMX)";
    siglongjmp(g_jump, 1);
}

// ggml calls the routine at the start of each thread's work; here too it is inlined into a
// function of its own, with no setjmp around it to make the compiler careful.
__attribute__((noinline)) void configure_tiles() {
    ggml_tile_config_init();
}

}  // namespace

int main() {
    static_assert(sizeof(tile_config_t) == 64, "tile_config_t is 64 bytes");
    struct sigaction sa = {};
    sa.sa_sigaction = on_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGILL, &sa, nullptr);
    if (sigsetjmp(g_jump, 1) == 0) {
        configure_tiles();
        _tile_storeconfig(g_config);
    }
    tile_config_t tc;
    std::memcpy(&tc, g_config, sizeof(tc));
    std::printf("read from %s\npalette_id %d\nrows", g_how, tc.palette_id);
    for (int i = 0; i < 8; ++i) std::printf(" %d", tc.rows[i]);
    std::printf("\ncolsb");
    for (int i = 0; i < 8; ++i) std::printf(" %d", tc.colsb[i]);
    std::printf("\n");
    return 0;
}
