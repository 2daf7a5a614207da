/* Make a process see a lesser x86 CPU: CPUID answers with chosen feature bits cleared.
 *
 * Why by hand: benchmarks must time each CPU class `auto` chooses for (docs/precision.md), and the
 * libraries under test pick their kernels from CPUID themselves. oneDNN, MKL and ATen have their own
 * caps (ONEDNN_MAX_CPU_ISA, ...); ONNX Runtime's MLAS has none, so on an AVX-512 machine it keeps its
 * AVX-512 VNNI int8 kernels whatever we ask. Intel SDE emulates CPUID but runs every instruction under
 * a binary translator (timings meaningless), and cannot be installed here. Linux's CPUID faulting
 * (arch_prctl ARCH_SET_CPUID, the mechanism record-and-replay debuggers use) traps each CPUID
 * instruction, at no cost to any other instruction: the handler runs the real CPUID and clears the
 * bits of the ISA extensions named in CPUID_CAP.
 *
 * Build:  gcc -O2 -shared -fPIC -o cpuid_cap.so cpuid_cap.c   (scripts/bench/bench_encode.py --cpu-cap does this)
 * Use:    CPUID_CAP=avx2 LD_PRELOAD=/path/cpuid_cap.so python ...
 *   CPUID_CAP=avx2          AVX2 + FMA only: no AVX-512, AVX-VNNI, AMX (an AVX2-only EPYC or Haswell-Broadwell Xeon)
 *   CPUID_CAP=avx512        AVX-512 F/CD/BW/DQ/VL, no VNNI/BF16/FP16/AMX (Skylake-SP class)
 *   CPUID_CAP=avx512_bf16   AVX-512 with VNNI and BF16, no AMX (what the rest of the table measures)
 * Needs a kernel and CPU with CPUID faulting (the `cpuid_fault` flag in /proc/cpuinfo). Only the
 * caller's own instructions are fooled: the OS still saves the full register state (XGETBV answers
 * truthfully, which the libraries check only after CPUID says a feature exists). The setting is
 * per thread and inherited by threads and forks, so it is made before main() runs; exec() resets it,
 * and LD_PRELOAD makes each new program set it again. A program that later installs a SIGSEGV
 * handler of its own (Python's faulthandler: `python -X faulthandler`, pytest) takes the next CPUID
 * fault itself and dies: run the benchmarks without it.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_GET_CPUID 0x1011
#define ARCH_SET_CPUID 0x1012

static uint32_t clear7_ebx, clear7_ecx, clear7_edx, clear71_eax;

static int set_cpuid(int allowed) { return (int)syscall(SYS_arch_prctl, ARCH_SET_CPUID, allowed); }

static void on_segv(int sig, siginfo_t *info, void *ctx_) {
    ucontext_t *ctx = (ucontext_t *)ctx_;
    greg_t *r = ctx->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    /* A faulted CPUID comes as SI_KERNEL, like a general-protection fault; a bad memory access
     * (a jump to an unmapped address included, where ip cannot be read) as SEGV_MAPERR/ACCERR. */
    if (info->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) { /* a real fault: die as the program would have */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    uint32_t leaf = (uint32_t)r[REG_RAX], sub = (uint32_t)r[REG_RCX], a, b, c, d;
    set_cpuid(1);
    __cpuid_count(leaf, sub, a, b, c, d);
    set_cpuid(0);
    if (leaf == 7 && sub == 0) { b &= ~clear7_ebx; c &= ~clear7_ecx; d &= ~clear7_edx; }
    if (leaf == 7 && sub == 1) { a &= ~clear71_eax; }
    r[REG_RAX] = a; r[REG_RBX] = b; r[REG_RCX] = c; r[REG_RDX] = d;
    r[REG_RIP] += 2;
}

__attribute__((constructor)) static void cpuid_cap_init(void) {
    const char *cap = getenv("CPUID_CAP");
    if (!cap || !*cap || !strcmp(cap, "native")) return;
    /* leaf 7.0 EBX: AVX512 F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31 */
    uint32_t avx512_ebx = (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31);
    /* leaf 7.0 ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14 */
    uint32_t avx512_ecx_all = (1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14), vnni_ecx = 1u << 11;
    /* leaf 7.0 EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, AVX512-FP16 23, AMX-TILE 24, AMX-INT8 25 */
    uint32_t avx512_edx = (1u << 2) | (1u << 3) | (1u << 8) | (1u << 23), amx_edx = (1u << 22) | (1u << 24) | (1u << 25);
    /* leaf 7.1 EAX: AVX-VNNI 4, AVX512-BF16 5, AMX-FP16 21, AVX-IFMA 23 */
    uint32_t avxvnni = (1u << 4) | (1u << 23), bf16 = 1u << 5, amxfp16 = 1u << 21;
    if (!strcmp(cap, "avx2")) {
        clear7_ebx = avx512_ebx; clear7_ecx = avx512_ecx_all; clear7_edx = avx512_edx | amx_edx; clear71_eax = avxvnni | bf16 | amxfp16;
    } else if (!strcmp(cap, "avx512")) {
        clear7_ecx = vnni_ecx | (1u << 1) | (1u << 6) | (1u << 12) | (1u << 14); clear7_edx = avx512_edx | amx_edx;
        clear71_eax = avxvnni | bf16 | amxfp16;
    } else if (!strcmp(cap, "avx512_bf16")) {
        clear7_edx = amx_edx; clear71_eax = amxfp16;
    } else {
        fprintf(stderr, "cpuid_cap: unknown CPUID_CAP=%s (avx2, avx512, avx512_bf16, native)\n", cap);
        exit(2);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0 || set_cpuid(0) != 0) {
        perror("cpuid_cap: CPUID faulting is not available here (needs the cpuid_fault CPU flag)");
        exit(2);
    }
}
