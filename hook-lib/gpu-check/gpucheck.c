// Real-GPU check of libfgpu.so: a small CUDA driver-API program, reaching the driver the
// way libcudart does (dlopen("libcuda.so.1") + cuGetProcAddress_v2). No CUDA headers
// needed: the few declarations are ours. Build: cc -O2 -o gpucheck gpucheck.c -ldl
//
// Usage: gpucheck [expected-quota-bytes]
// Prints plain-text results; with an expected quota, also PASS/FAIL lines and exit 1 on
// a failure.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { int type, htypes; struct { int type, id; } loc; void *win32; unsigned char flags[8]; } AllocProp;
typedef struct { unsigned long long total, free, used; } NvmlMem;

static CUresult (*gpa)(const char *, void **, int, unsigned long long, int *);
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDriverGetVersion)(int *);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDeviceGetName)(char *, int, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuMemGetInfo)(size_t *, size_t *);
static CUresult (*cuDeviceTotalMem)(size_t *, int);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemCreate)(unsigned long long *, size_t, const AllocProp *, unsigned long long);
static CUresult (*cuMemRelease)(unsigned long long);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
static CUresult (*cuModuleLoadData)(void **, const void *);
static CUresult (*cuModuleGetFunction)(void **, void *, const char *);
static CUresult (*cuLaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);

static int failures;
static void result(int ok, const char *what) {
    printf("%s  %s\n", ok ? "PASS" : "FAIL", what);
    if (!ok) failures++;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

#define GET(var, name)                                                      \
    do {                                                                    \
        int st_ = -1;                                                       \
        void *p_ = NULL;                                                    \
        if (gpa(name, &p_, 12000, 0, &st_) != 0 || !p_) {                   \
            printf("cannot resolve %s (status %d)\n", name, st_);          \
            exit(2);                                                        \
        }                                                                   \
        *(void **)&var = p_;                                                \
    } while (0)

#define CK(call)                                                            \
    do {                                                                    \
        CUresult r_ = (call);                                               \
        if (r_) { printf("%s -> %d\n", #call, r_); exit(2); }               \
    } while (0)

static const char *PTX =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry noop()\n{\n ret;\n}\n";

// Allocates chunks until refused (or `cap` bytes); frees them; returns bytes obtained.
static size_t fill(size_t chunk, size_t cap, CUresult *last) {
    static CUdeviceptr ptrs[4096];
    size_t n = 0, got = 0;
    *last = 0;
    while (got + chunk <= cap && n < 4096) {
        *last = cuMemAlloc(&ptrs[n], chunk);
        if (*last) break;
        n++;
        got += chunk;
    }
    for (size_t i = 0; i < n; i++) cuMemFree(ptrs[i]);
    return got;
}

int main(int argc, char **argv) {
    size_t quota = argc > 1 ? strtoull(argv[1], NULL, 0) : 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    gpa = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { printf("no cuGetProcAddress_v2\n"); return 2; }
    Dl_info di;
    if (dladdr((void *)gpa, &di)) printf("cuGetProcAddress_v2 from %s\n", di.dli_fname);
    GET(cuInit, "cuInit"); GET(cuDriverGetVersion, "cuDriverGetVersion"); GET(cuDeviceGet, "cuDeviceGet");
    GET(cuDeviceGetName, "cuDeviceGetName"); GET(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    GET(cuCtxSetCurrent, "cuCtxSetCurrent"); GET(cuCtxSynchronize, "cuCtxSynchronize");
    GET(cuMemGetInfo, "cuMemGetInfo"); GET(cuDeviceTotalMem, "cuDeviceTotalMem"); GET(cuMemAlloc, "cuMemAlloc");
    GET(cuMemFree, "cuMemFree"); GET(cuMemCreate, "cuMemCreate"); GET(cuMemRelease, "cuMemRelease");
    GET(cuMemAllocAsync, "cuMemAllocAsync"); GET(cuMemFreeAsync, "cuMemFreeAsync");
    GET(cuModuleLoadData, "cuModuleLoadData"); GET(cuModuleGetFunction, "cuModuleGetFunction");
    GET(cuLaunchKernel, "cuLaunchKernel");
    if (dladdr(*(void **)&cuMemAlloc, &di)) printf("cuMemAlloc from %s\n", di.dli_fname);

    CK(cuInit(0));
    int ver, dev;
    char name[256];
    void *ctx;
    CK(cuDriverGetVersion(&ver));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetName(name, sizeof name, dev));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    size_t f, t, tm;
    CK(cuMemGetInfo(&f, &t));
    CK(cuDeviceTotalMem(&tm, dev));
    printf("driver %d, device 0: %s\n", ver, name);
    printf("cuMemGetInfo: free %zu MiB, total %zu MiB; cuDeviceTotalMem %zu MiB\n", f >> 20, t >> 20, tm >> 20);

    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nv) {
        int (*init)(void) = dlsym(nv, "nvmlInit_v2");
        int (*byidx)(unsigned, void **) = dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
        int (*mi)(void *, NvmlMem *) = dlsym(nv, "nvmlDeviceGetMemoryInfo");
        void *nd;
        NvmlMem m;
        if (init && byidx && mi && !init() && !byidx(0, &nd) && !mi(nd, &m))
            printf("nvmlDeviceGetMemoryInfo(0): total %llu MiB, used %llu MiB, free %llu MiB\n", m.total >> 20, m.used >> 20, m.free >> 20);
    }

    // Refusal past the quota: 256 MiB chunks (capped at quota + 1 GiB, or 8 GiB bare).
    size_t chunk = 256 << 20, cap = quota ? quota + (1ull << 30) : (8ull << 30);
    CUresult last;
    size_t got = fill(chunk, cap, &last);
    printf("cuMemAlloc 256 MiB chunks: got %zu MiB, then %s (%d)\n", got >> 20, last == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : last ? "error" : "cap reached", last);

    // VMM: 2 MiB granules.
    AllocProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1; prop.loc.type = 1; prop.loc.id = 0;
    static unsigned long long hs[8192];
    size_t nh = 0, vgot = 0;
    CUresult vlast = 0;
    size_t gran = 64 << 20;
    while (vgot + gran <= cap && nh < 8192) {
        vlast = cuMemCreate(&hs[nh], gran, &prop, 0);
        if (vlast) break;
        nh++; vgot += gran;
    }
    for (size_t i = 0; i < nh; i++) cuMemRelease(hs[i]);
    printf("cuMemCreate 64 MiB: got %zu MiB, then %d\n", vgot >> 20, vlast);

    // Stream-ordered.
    static CUdeviceptr as[4096];
    size_t na = 0, agot = 0;
    CUresult alast = 0;
    while (agot + chunk <= cap && na < 4096) {
        alast = cuMemAllocAsync(&as[na], chunk, NULL);
        if (alast) break;
        na++; agot += chunk;
    }
    for (size_t i = 0; i < na; i++) cuMemFreeAsync(as[i], NULL);
    CK(cuCtxSynchronize());
    printf("cuMemAllocAsync 256 MiB: got %zu MiB, then %d\n", agot >> 20, alast);

    if (quota) {
        result(t == quota, "cuMemGetInfo total == quota");
        result(tm == quota, "cuDeviceTotalMem == quota");
        result(last == 2 && got <= quota && got + chunk > quota, "cuMemAlloc refused past the quota, not before");
        result(vlast == 2 && vgot <= quota && vgot + gran > quota, "cuMemCreate refused past the quota, not before");
        result(alast == 2 && agot <= quota, "cuMemAllocAsync refused past the quota");
    }

    // Pass-through cost.
    void *mod, *fn;
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&fn, mod, "noop"));
    int N = 20000;
    for (int i = 0; i < 1000; i++) cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    CK(cuCtxSynchronize());
    double t0 = now();
    for (int i = 0; i < N; i++) cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    double t1 = now();
    CK(cuCtxSynchronize());
    int M = 5000;
    CUdeviceptr p;
    double t2 = now();
    for (int i = 0; i < M; i++) { CK(cuMemAlloc(&p, 1 << 20)); CK(cuMemFree(p)); }
    double t3 = now();
    printf("timing: cuLaunchKernel %.0f ns/launch (enqueue), cuMemAlloc+cuMemFree(1 MiB) %.0f ns/pair\n",
           (t1 - t0) * 1e9 / N, (t3 - t2) * 1e9 / M);
    return failures ? 1 : 0;
}
