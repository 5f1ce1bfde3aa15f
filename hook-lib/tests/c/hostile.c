// Adversarial programs for libfgpu.so's tests (hook-lib/tests/hostile.sh), against the
// fake CUDA driver. The driver is reached through dlopen + dlsym (so the shim's dlsym
// answers). Usage: hostile <scenario> [args]; exit 0 = the check passed, 1 = it failed
// (message on stderr), 2 = usage.
//   quota DEV BYTES          device DEV reports BYTES total, takes BYTES, refuses 1 more
//   alloc DEV BYTES          an allocation of BYTES on DEV succeeds (then freed)
//   hold DEV BYTES MODE      holds BYTES, then closes descriptors it did not open (MODE:
//                            none | closefrom | close_range | dup2 | close), says
//                            "holding", sleeps
//   max-gap SECS DEV         launches synchronously for SECS; prints the longest gap
//   forge FILE SECS AHEAD_MS stamps FILE (a priority file) with now + AHEAD_MS every 2 ms
//   feed FILE UUID DEV PID SECS  plays the node monitor: every 100 ms writes the
//                            utilisation feed (contract v1) with PID's share of DEV
//   spill DEV GRANT PHYSICAL ACCOUNT  research tier: cuMemAlloc up to PHYSICAL bytes is
//                            device memory, the rest of GRANT managed memory (the fake's
//                            count and the claim's ACCOUNT say so), 1 byte more refused
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static CUresult (*Init)(unsigned);
static CUresult (*PrimaryCtxRetain)(void **, int);
static CUresult (*CtxSetCurrent)(void *);
static CUresult (*CtxSynchronize)(void);
static CUresult (*MemAlloc)(CUdeviceptr *, size_t);
static CUresult (*MemFree)(CUdeviceptr);
static CUresult (*MemGetInfo)(size_t *, size_t *);
static CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, void *, void **, void **);

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
#include <stdarg.h>
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void *sym(void *h, const char *n) {
    void *p = dlsym(h, n);
    if (!p) fail("no %s", n);
    return p;
}

static void start(int dev) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) fail("dlopen libcuda.so.1: %s", dlerror());
    Init = sym(h, "cuInit");
    PrimaryCtxRetain = sym(h, "cuDevicePrimaryCtxRetain");
    CtxSetCurrent = sym(h, "cuCtxSetCurrent");
    CtxSynchronize = sym(h, "cuCtxSynchronize");
    MemAlloc = sym(h, "cuMemAlloc_v2");
    MemFree = sym(h, "cuMemFree_v2");
    MemGetInfo = sym(h, "cuMemGetInfo_v2");
    LaunchKernel = sym(h, "cuLaunchKernel");
    void *c;
    if (Init(0) || PrimaryCtxRetain(&c, dev) || CtxSetCurrent(c)) fail("no context on device %d", dev);
}

static unsigned long long mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static int s_quota(int dev, size_t want) {
    start(dev);
    size_t f, t;
    CUdeviceptr a, b;
    if (MemGetInfo(&f, &t)) fail("cuMemGetInfo");
    if (t != want) fail("device %d: total %zu, want %zu", dev, t, want);
    CUresult r = MemAlloc(&a, want);
    if (r) fail("device %d: cuMemAlloc(%zu) -> %d", dev, want, r);
    r = MemAlloc(&b, 1);
    if (r != 2) fail("device %d: cuMemAlloc(1) past the quota -> %d, want 2", dev, r);
    MemFree(a);
    printf("device %d quota %zu ok\n", dev, want);
    return 0;
}

// The claim's account (state.rs layout): device entry 0's used and managed bytes.
static unsigned long long account_u64(const char *path, long off) {
    unsigned long long v = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || pread(fd, &v, sizeof v, off) != (ssize_t)sizeof v) fail("read %s at %ld", path, off);
    close(fd);
    return v;
}
#define ACCOUNT_USED 96
#define ACCOUNT_MANAGED 112

static int s_spill(int dev, size_t grant, size_t physical, const char *account) {
    start(dev);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long long (*used)(int) = (unsigned long long (*)(int))sym(h, "fakeCudaUsedBytes");
    unsigned long long (*managed)(int) = (unsigned long long (*)(int))sym(h, "fakeCudaManagedBytes");
    CUdeviceptr p[4], m, x;
    size_t quarter = physical / 4, rest = grant - physical, f, t;
    for (int i = 0; i < 4; i++)
        if (MemAlloc(&p[i], quarter)) fail("cuMemAlloc(%zu) #%d within the physical part", quarter, i);
    if (used(dev) != 4 * quarter || managed(dev) != 0)
        fail("within the physical part: device %llu, managed %llu", used(dev), managed(dev));
    CUresult r = MemAlloc(&m, rest);
    if (r) fail("cuMemAlloc(%zu) past the physical part, within the grant -> %d", rest, r);
    if (used(dev) != 4 * quarter || managed(dev) != rest)
        fail("past the physical part: device %llu (want %zu), managed %llu (want %zu)", used(dev),
             4 * quarter, managed(dev), rest);
    if (account_u64(account, ACCOUNT_USED) != grant || account_u64(account, ACCOUNT_MANAGED) != rest)
        fail("account: used %llu (want %zu), managed %llu (want %zu)", account_u64(account, ACCOUNT_USED), grant,
             account_u64(account, ACCOUNT_MANAGED), rest);
    if (MemGetInfo(&f, &t) || t != grant || f != 0) fail("cuMemGetInfo: free %zu of %zu, want 0 of %zu", f, t, grant);
    r = MemAlloc(&x, 1);
    if (r != 2) fail("cuMemAlloc(1) past the grant -> %d, want 2", r);
    if (MemFree(m) || managed(dev) != 0 || account_u64(account, ACCOUNT_MANAGED) != 0)
        fail("cuMemFree of the managed pointer: fake %llu, account %llu managed left", managed(dev),
             account_u64(account, ACCOUNT_MANAGED));
    for (int i = 0; i < 4; i++) MemFree(p[i]);
    if (used(dev) != 0 || account_u64(account, ACCOUNT_USED) != 0) fail("freed all: device %llu left", used(dev));
    printf("device %d: %zu device + %zu managed of %zu granted, 1 byte more refused\n", dev, 4 * quarter, rest,
           grant);
    return 0;
}

static int s_alloc(int dev, size_t n) {
    start(dev);
    CUdeviceptr a;
    CUresult r = MemAlloc(&a, n);
    if (r) fail("device %d: cuMemAlloc(%zu) -> %d", dev, n, r);
    MemFree(a);
    printf("device %d alloc %zu ok\n", dev, n);
    return 0;
}

static int s_hold(int dev, size_t n, const char *mode) {
    start(dev);
    CUdeviceptr a;
    CUresult r = MemAlloc(&a, n);
    if (r) fail("cuMemAlloc(%zu) -> %d", n, r);
    if (!strcmp(mode, "closefrom")) {
        closefrom(3);
    } else if (!strcmp(mode, "close_range")) {
        close_range(3, ~0u, 0);
    } else if (!strcmp(mode, "dup2")) {
        int z = open("/dev/null", O_RDONLY);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != z) dup2(z, fd);
    } else if (!strcmp(mode, "close")) {
        for (int fd = 3; fd < 1024; fd++) close(fd);
    } else if (strcmp(mode, "none")) {
        fail("unknown mode %s", mode);
    }
    printf("holding\n");
    fflush(stdout);
    pause();
    return 0;
}

static int s_max_gap(double secs, int dev) {
    start(dev);
    unsigned long long t0 = mono_ns(), last = t0, gap = 0;
    long n = 0;
    while (mono_ns() - t0 < (unsigned long long)(secs * 1e9)) {
        if (LaunchKernel((void *)0x1234, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)) fail("launch");
        CtxSynchronize();
        unsigned long long now = mono_ns();
        if (now - last > gap) gap = now - last;
        last = now;
        n++;
    }
    printf("max_gap_ms=%.1f launches=%ld\n", gap / 1e6, n);
    return 0;
}

static int s_forge(const char *file, double secs, double ahead_ms) {
    int fd = open(file, O_RDWR);
    if (fd < 0) fail("cannot open %s for writing", file);
    volatile uint64_t *p = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail("mmap %s", file);
    unsigned long long t0 = mono_ns();
    while (mono_ns() - t0 < (unsigned long long)(secs * 1e9)) {
        *p = mono_ns() + (unsigned long long)(ahead_ms * 1e6);
        usleep(2000);
    }
    return 0;
}

static unsigned long long real_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (unsigned long long)t.tv_sec * 1000ull + (unsigned long long)t.tv_nsec / 1000000ull;
}

static int s_feed(const char *file, const char *uuid, int dev, int pid, double secs) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) fail("dlopen libcuda.so.1: %s", dlerror());
    unsigned long long (*busy)(int, int) = (unsigned long long (*)(int, int))sym(h, "fakeCudaBusyNs");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    unsigned long long t0 = mono_ns(), last_t = t0, last_b = busy(dev, pid);
    while (mono_ns() - t0 < (unsigned long long)(secs * 1e9)) {
        usleep(100000);
        unsigned long long t = mono_ns(), b = busy(dev, pid);
        unsigned permille = (unsigned)((double)(b - last_b) * 1000.0 / (double)(t - last_t) + 0.5);
        if (permille > 1000) permille = 1000;
        last_t = t;
        last_b = b;
        FILE *o = fopen(tmp, "w");
        if (!o) fail("cannot write %s", tmp);
        fprintf(o, "version=1\nsampled_unix_ms=%llu\nwindow_ms=100\ngpu.%s.sm_permille=%u\n", real_ms(), uuid, permille);
        fclose(o);
        if (rename(tmp, file)) fail("rename %s", tmp);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *s = argv[1];
    if (!strcmp(s, "quota") && argc > 3) return s_quota(atoi(argv[2]), strtoull(argv[3], NULL, 0));
    if (!strcmp(s, "alloc") && argc > 3) return s_alloc(atoi(argv[2]), strtoull(argv[3], NULL, 0));
    if (!strcmp(s, "hold") && argc > 4) return s_hold(atoi(argv[2]), strtoull(argv[3], NULL, 0), argv[4]);
    if (!strcmp(s, "max-gap") && argc > 3) return s_max_gap(atof(argv[2]), atoi(argv[3]));
    if (!strcmp(s, "forge") && argc > 4) return s_forge(argv[2], atof(argv[3]), atof(argv[4]));
    if (!strcmp(s, "spill") && argc > 5)
        return s_spill(atoi(argv[2]), strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0), argv[5]);
    if (!strcmp(s, "feed") && argc > 6)
        return s_feed(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atof(argv[6]));
    fprintf(stderr, "unknown scenario %s\n", s);
    return 2;
}
