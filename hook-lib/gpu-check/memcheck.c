// Real-GPU check of the memory the fake driver models and the shim charges without a
// cuMemAlloc: what a context takes, what a pool gives back at each kind of
// synchronisation (release threshold 0, then 512 MiB), and what cuCtxSetLimit's heap and
// stack take. Figures come from cuMemGetInfo (under the shim with a quota: the shim's
// view; bare: the driver's) and the pool's own attributes. Run it both ways and compare.
// Build: cc -O2 -o memcheck memcheck.c -ldl. Exit 0, or 2 if the driver cannot be used.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr, CUmemPool;
typedef void *CUcontext, *CUstream, *CUevent;

static void *h;
#define SYM(var, name) do { *(void **)&var = dlsym(h, name); if (!var) { printf("no %s\n", name); exit(2); } } while (0)
#define CK(call) do { CUresult r_ = (call); if (r_) { printf("%s -> %d\n", #call, r_); exit(2); } } while (0)

static CUresult (*cuInit)(unsigned), (*cuDevicePrimaryCtxRetain)(CUcontext *, int), (*cuCtxSetCurrent)(CUcontext),
    (*cuCtxCreate)(CUcontext *, unsigned, int), (*cuCtxDestroy)(CUcontext), (*cuCtxSynchronize)(void),
    (*cuStreamCreate)(CUstream *, unsigned), (*cuStreamSynchronize)(CUstream), (*cuEventCreate)(CUevent *, unsigned),
    (*cuEventRecord)(CUevent, CUstream), (*cuEventSynchronize)(CUevent), (*cuMemGetInfo)(size_t *, size_t *),
    (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream), (*cuMemFreeAsync)(CUdeviceptr, CUstream),
    (*cuDeviceGetMemPool)(CUmemPool *, int), (*cuMemPoolSetAttribute)(CUmemPool, int, void *),
    (*cuMemPoolGetAttribute)(CUmemPool, int, void *), (*cuCtxSetLimit)(int, size_t), (*cuCtxGetLimit)(size_t *, int),
    (*cuDeviceGetAttribute)(int *, int, int);

static long long free_now(void) {
    size_t f, t;
    CK(cuMemGetInfo(&f, &t));
    return (long long)f;
}

#define MiB(x) ((double)(x) / (1 << 20))

static void pool_case(const char *kind, unsigned long long threshold) {
    CUmemPool pool;
    CUstream s;
    CUevent e;
    CUdeviceptr p;
    size_t size = 1ull << 30;
    CK(cuDeviceGetMemPool(&pool, 0));
    CK(cuMemPoolSetAttribute(pool, 4, &threshold));
    CK(cuStreamCreate(&s, 0));
    long long f0 = free_now();
    CK(cuMemAllocAsync(&p, size, s));
    CK(cuMemFreeAsync(p, s));
    CK(cuStreamSynchronize(s)); // the free has run; now the pool holds it idle...
    // ... and this synchronisation released what is above the threshold already: so
    // measure the case the shim must follow: allocate again, free, then the kind asked.
    CK(cuMemAllocAsync(&p, size, s));
    CK(cuMemFreeAsync(p, s));
    unsigned long long before = 0, after = 0;
    CK(cuMemPoolGetAttribute(pool, 5, &before));
    long long f1 = free_now();
    if (!strcmp(kind, "ctx")) {
        CK(cuCtxSynchronize());
    } else if (!strcmp(kind, "stream")) {
        CK(cuStreamSynchronize(s));
    } else {
        CK(cuEventCreate(&e, 0));
        CK(cuEventRecord(e, s));
        CK(cuEventSynchronize(e));
    }
    CK(cuMemPoolGetAttribute(pool, 5, &after));
    long long f2 = free_now();
    printf("pool, %s synchronisation, threshold %.0f MiB: reserved %.0f -> %.0f MiB; cuMemGetInfo free %+.0f MiB before, %+.0f MiB after (vs. start)\n",
           kind, MiB(threshold), MiB(before), MiB(after), MiB(f1 - f0), MiB(f2 - f0));
    unsigned long long zero = 0;
    CK(cuMemPoolSetAttribute(pool, 4, &zero));
    CK(cuCtxSynchronize());
}

int main(void) {
    h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    SYM(cuInit, "cuInit"); SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuCtxCreate, "cuCtxCreate_v2"); SYM(cuCtxDestroy, "cuCtxDestroy_v2"); SYM(cuCtxSynchronize, "cuCtxSynchronize");
    SYM(cuStreamCreate, "cuStreamCreate"); SYM(cuStreamSynchronize, "cuStreamSynchronize"); SYM(cuEventCreate, "cuEventCreate");
    SYM(cuEventRecord, "cuEventRecord"); SYM(cuEventSynchronize, "cuEventSynchronize"); SYM(cuMemGetInfo, "cuMemGetInfo_v2");
    SYM(cuMemAllocAsync, "cuMemAllocAsync"); SYM(cuMemFreeAsync, "cuMemFreeAsync"); SYM(cuDeviceGetMemPool, "cuDeviceGetMemPool");
    SYM(cuMemPoolSetAttribute, "cuMemPoolSetAttribute"); SYM(cuMemPoolGetAttribute, "cuMemPoolGetAttribute");
    SYM(cuCtxSetLimit, "cuCtxSetLimit"); SYM(cuCtxGetLimit, "cuCtxGetLimit"); SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    CK(cuInit(0));
    CUcontext primary, c[4];
    CK(cuDevicePrimaryCtxRetain(&primary, 0));
    CK(cuCtxSetCurrent(primary));
    long long f0 = free_now();
    for (int i = 0; i < 4; i++) CK(cuCtxCreate(&c[i], 0, 0));
    CK(cuCtxSetCurrent(primary));
    long long f1 = free_now();
    printf("contexts: 4 created contexts take %.1f MiB, %.1f MiB each (a value for context_overhead)\n", MiB(f0 - f1),
           MiB(f0 - f1) / 4);
    for (int i = 0; i < 4; i++) CK(cuCtxDestroy(c[i]));
    CK(cuCtxSetCurrent(primary));
    printf("contexts: destroyed, free %+.1f MiB vs. before\n", MiB(free_now() - f0));

    pool_case("ctx", 0);
    pool_case("stream", 0);
    pool_case("event", 0);
    pool_case("ctx", 512ull << 20);

    int sms = 0, tps = 0;
    CK(cuDeviceGetAttribute(&sms, 16, 0));
    CK(cuDeviceGetAttribute(&tps, 39, 0));
    size_t heap0, stack0;
    CK(cuCtxGetLimit(&heap0, 2));
    CK(cuCtxGetLimit(&stack0, 0));
    long long g0 = free_now();
    CUresult r = cuCtxSetLimit(2, heap0 + (1ull << 30));
    long long g1 = free_now();
    printf("cuCtxSetLimit(heap %.0f -> %.0f MiB) -> %d: free %+.1f MiB (the fake and the shim: -%.0f MiB)\n", MiB(heap0),
           MiB(heap0 + (1ull << 30)), r, MiB(g1 - g0), MiB(1ull << 30));
    r = cuCtxSetLimit(0, stack0 + 1024);
    long long g2 = free_now();
    printf("cuCtxSetLimit(stack %zu -> %zu B) -> %d: free %+.1f MiB (the fake and the shim: 1024 B x %d SMs x %d threads = -%.1f MiB)\n",
           stack0, stack0 + 1024, r, MiB(g2 - g1), sms, tps, MiB(1024.0 * sms * tps));
    CK(cuCtxSetLimit(2, heap0));
    CK(cuCtxSetLimit(0, stack0));
    printf("limits restored: free %+.1f MiB vs. before\n", MiB(free_now() - g0));
    return 0;
}
