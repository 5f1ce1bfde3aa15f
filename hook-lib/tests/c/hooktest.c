// Test program for libfgpu.so against the fake CUDA driver (tests/fake-cuda).
//
// It reaches the driver the ways real programs do, chosen by HT_LOADER:
//   proc   dlopen("libcuda.so.1") + cuGetProcAddress_v2 (CUDA 12.8), as libcudart does
//   proc1  dlopen + cuGetProcAddress (v1, CUDA 11.8)
//   dlsym  dlopen + dlsym for every entry point
//   direct linked against libcuda.so.1 (only in the binary built with -DDIRECT)
// Usage: hooktest <scenario> [args]; exit 0 = pass, 1 = a check failed (message on
// stderr), 2 = usage.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUfunction;
typedef void *CUmodule;
typedef unsigned long long CUarray;
typedef unsigned long long CUmemPool;
typedef unsigned long long CUmemHandle;

typedef struct { size_t w, h; unsigned fmt, ch; } ArrDesc;
typedef struct { size_t w, h, d; unsigned fmt, ch, flags; } Arr3Desc;
typedef struct { int type, id; } MemLoc;
typedef struct { int type, htypes; MemLoc loc; void *win32; unsigned char flags[8]; } AllocProp;
typedef struct { int atype, htypes; MemLoc loc; void *win32; size_t max; unsigned short usage; unsigned char rsv[54]; } PoolProps;
typedef struct { unsigned long long total, free, used; } NvmlMem;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } NvmlMem2;

#define OOM 2
#define FMT_FLOAT 0x20

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*ArrayCreate)(CUarray *, const ArrDesc *);
    CUresult (*Array3DCreate)(CUarray *, const Arr3Desc *);
    CUresult (*ArrayDestroy)(CUarray);
    CUresult (*MipmappedArrayCreate)(CUarray *, const Arr3Desc *, unsigned);
    CUresult (*MipmappedArrayDestroy)(CUarray);
    CUresult (*MemCreate)(CUmemHandle *, size_t, const AllocProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemHandle);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemPool, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemPoolCreate)(CUmemPool *, const PoolProps *);
    CUresult (*MemPoolDestroy)(CUmemPool);
    CUresult (*MemPoolTrimTo)(CUmemPool, size_t);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*GetProcAddress_v2)(const char *, void **, int, unsigned long long, int *);
    CUresult (*GetProcAddress)(const char *, void **, int, unsigned long long);
    CUresult (*LaunchKernelEx)(const void *, CUfunction, void **, void **);
    CUresult (*LaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
    CUresult (*GraphLaunch)(void *, CUstream);
} cu;

static unsigned long long (*fakeUsed)(int);
static const char *loader = "proc";

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL [%s] ", loader);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}
#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)
#define OK(call) do { CUresult r_ = (call); if (r_ != 0) fail("%s:%d %s -> %d", __FILE__, __LINE__, #call, r_); } while (0)

static void *libcuda;

static void *sym_dlsym(const char *name) { return dlsym(libcuda, name); }

static int proc_version = 12080;
static void *sym_proc(const char *base) {
    void *p = NULL;
    int status = -1;
    CUresult r = cu.GetProcAddress_v2 ? cu.GetProcAddress_v2(base, &p, proc_version, 0, &status)
                                      : cu.GetProcAddress(base, &p, proc_version, 0);
    return r == 0 ? p : NULL;
}

#ifdef DIRECT
extern CUresult cuInit(unsigned), cuDeviceGetCount(int *), cuDevicePrimaryCtxRetain(CUcontext *, CUdevice),
    cuCtxSetCurrent(CUcontext), cuCtxSynchronize(void), cuMemAlloc_v2(CUdeviceptr *, size_t), cuMemFree_v2(CUdeviceptr),
    cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned), cuMemAllocManaged(CUdeviceptr *, size_t, unsigned),
    cuArrayCreate_v2(CUarray *, const ArrDesc *), cuArray3DCreate_v2(CUarray *, const Arr3Desc *), cuArrayDestroy(CUarray),
    cuMipmappedArrayCreate(CUarray *, const Arr3Desc *, unsigned), cuMipmappedArrayDestroy(CUarray),
    cuMemCreate(CUmemHandle *, size_t, const AllocProp *, unsigned long long), cuMemRelease(CUmemHandle),
    cuMemAllocAsync(CUdeviceptr *, size_t, CUstream), cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemPool, CUstream),
    cuMemFreeAsync(CUdeviceptr, CUstream), cuMemPoolCreate(CUmemPool *, const PoolProps *), cuMemPoolDestroy(CUmemPool),
    cuMemPoolTrimTo(CUmemPool, size_t), cuMemGetInfo_v2(size_t *, size_t *), cuDeviceTotalMem_v2(size_t *, CUdevice),
    cuModuleLoadData(CUmodule *, const void *), cuModuleGetFunction(CUfunction *, CUmodule, const char *),
    cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **),
    cuGetErrorString(CUresult, const char **), cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *),
    cuLaunchKernelEx(const void *, CUfunction, void **, void **),
    cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **),
    cuGraphLaunch(void *, CUstream);
extern unsigned long long fakeCudaUsedBytes(int);
#endif

static void load(void) {
    const char *l = getenv("HT_LOADER");
    if (l) loader = l;
#ifdef DIRECT
    loader = "direct";
    cu.Init = cuInit; cu.DeviceGetCount = cuDeviceGetCount; cu.DevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain;
    cu.CtxSetCurrent = cuCtxSetCurrent; cu.CtxSynchronize = cuCtxSynchronize; cu.MemAlloc = cuMemAlloc_v2; cu.MemFree = cuMemFree_v2;
    cu.MemAllocPitch = cuMemAllocPitch_v2; cu.MemAllocManaged = cuMemAllocManaged; cu.ArrayCreate = cuArrayCreate_v2;
    cu.Array3DCreate = cuArray3DCreate_v2; cu.ArrayDestroy = cuArrayDestroy; cu.MipmappedArrayCreate = cuMipmappedArrayCreate;
    cu.MipmappedArrayDestroy = cuMipmappedArrayDestroy; cu.MemCreate = cuMemCreate; cu.MemRelease = cuMemRelease;
    cu.MemAllocAsync = cuMemAllocAsync; cu.MemAllocFromPoolAsync = cuMemAllocFromPoolAsync; cu.MemFreeAsync = cuMemFreeAsync;
    cu.MemPoolCreate = cuMemPoolCreate; cu.MemPoolDestroy = cuMemPoolDestroy; cu.MemPoolTrimTo = cuMemPoolTrimTo;
    cu.MemGetInfo = cuMemGetInfo_v2; cu.DeviceTotalMem = cuDeviceTotalMem_v2; cu.ModuleLoadData = cuModuleLoadData;
    cu.ModuleGetFunction = cuModuleGetFunction; cu.LaunchKernel = cuLaunchKernel; cu.GetErrorString = cuGetErrorString;
    cu.GetProcAddress_v2 = cuGetProcAddress_v2;
    cu.LaunchKernelEx = cuLaunchKernelEx; cu.LaunchCooperativeKernel = cuLaunchCooperativeKernel; cu.GraphLaunch = cuGraphLaunch;
    fakeUsed = fakeCudaUsedBytes;
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return;
#endif
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(libcuda, "dlopen libcuda.so.1: %s", dlerror());
    fakeUsed = (unsigned long long (*)(int))dlsym(libcuda, "fakeCudaUsedBytes");
    CHECK(fakeUsed, "not the fake driver");
    void *(*sym)(const char *) = sym_dlsym;
    const char *v2 = "_v2";
    if (!strcmp(loader, "proc")) {
        cu.GetProcAddress_v2 = dlsym(libcuda, "cuGetProcAddress_v2");
        CHECK(cu.GetProcAddress_v2, "no cuGetProcAddress_v2");
        sym = sym_proc;
        v2 = "";
    } else if (!strcmp(loader, "proc1")) {
        cu.GetProcAddress = dlsym(libcuda, "cuGetProcAddress");
        CHECK(cu.GetProcAddress, "no cuGetProcAddress");
        proc_version = 11080;
        sym = sym_proc;
        v2 = "";
    } else if (strcmp(loader, "dlsym")) {
        fprintf(stderr, "unknown HT_LOADER %s\n", loader);
        exit(2);
    }
    char n[128];
#define L(field, name, ver) do { snprintf(n, sizeof n, "%s%s", name, ver); *(void **)&cu.field = sym(n); CHECK(cu.field, "cannot resolve %s", n); } while (0)
    L(Init, "cuInit", ""); L(DeviceGetCount, "cuDeviceGetCount", ""); L(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "");
    L(CtxSetCurrent, "cuCtxSetCurrent", ""); L(CtxSynchronize, "cuCtxSynchronize", ""); L(MemAlloc, "cuMemAlloc", v2); L(MemFree, "cuMemFree", v2);
    L(MemAllocPitch, "cuMemAllocPitch", v2); L(MemAllocManaged, "cuMemAllocManaged", ""); L(ArrayCreate, "cuArrayCreate", v2);
    L(Array3DCreate, "cuArray3DCreate", v2); L(ArrayDestroy, "cuArrayDestroy", ""); L(MipmappedArrayCreate, "cuMipmappedArrayCreate", "");
    L(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", ""); L(MemCreate, "cuMemCreate", ""); L(MemRelease, "cuMemRelease", "");
    L(MemAllocAsync, "cuMemAllocAsync", ""); L(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", ""); L(MemFreeAsync, "cuMemFreeAsync", "");
    L(MemPoolCreate, "cuMemPoolCreate", ""); L(MemPoolDestroy, "cuMemPoolDestroy", ""); L(MemPoolTrimTo, "cuMemPoolTrimTo", "");
    L(MemGetInfo, "cuMemGetInfo", v2); L(DeviceTotalMem, "cuDeviceTotalMem", v2); L(ModuleLoadData, "cuModuleLoadData", "");
    L(ModuleGetFunction, "cuModuleGetFunction", ""); L(LaunchKernel, "cuLaunchKernel", ""); L(GetErrorString, "cuGetErrorString", "");
    L(LaunchKernelEx, "cuLaunchKernelEx", ""); L(LaunchCooperativeKernel, "cuLaunchCooperativeKernel", ""); L(GraphLaunch, "cuGraphLaunch", "");
}

static void ctx(int dev) {
    CUcontext c;
    OK(cu.DevicePrimaryCtxRetain(&c, dev));
    OK(cu.CtxSetCurrent(c));
}

static void start(void) {
    load();
    OK(cu.Init(0));
    ctx(0);
}

static size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 0) : dflt;
}

static size_t used_by_shim(void) {
    size_t f, t;
    OK(cu.MemGetInfo(&f, &t));
    return t - f;
}

// The refusal leaves nothing allocated in the driver.
static void expect_oom(CUresult r, unsigned long long before, int dev, const char *what) {
    CHECK(r == OOM, "%s past the quota: got %d, want CUDA_ERROR_OUT_OF_MEMORY", what, r);
    CHECK(fakeUsed(dev) == before, "%s refused but the driver holds %llu bytes (had %llu)", what, fakeUsed(dev), before);
}

// ---------------------------------------------------------------- scenarios

// Every allocation path against quota Q (HT_QUOTA bytes, 64 MiB by default).
static int s_paths(void) {
    start();
    size_t Q = env_size("HT_QUOTA", 64 << 20);
    CUdeviceptr a, b, c;
    size_t pitch;

    // cuMemAlloc
    OK(cu.MemAlloc(&a, Q / 2));
    expect_oom(cu.MemAlloc(&b, Q / 2 + 1), Q / 2, 0, "cuMemAlloc");
    OK(cu.MemAlloc(&b, Q / 2));
    expect_oom(cu.MemAlloc(&c, 1), Q, 0, "cuMemAlloc");
    CHECK(used_by_shim() == Q, "cuMemGetInfo used %zu, want %zu", used_by_shim(), Q);
    OK(cu.MemFree(a)); OK(cu.MemFree(b));
    CHECK(fakeUsed(0) == 0 && used_by_shim() == 0, "cuMemFree left %llu / %zu", fakeUsed(0), used_by_shim());

    // cuMemAllocPitch (pitch 1024 for width 1000)
    OK(cu.MemAllocPitch(&a, &pitch, 1000, Q / 1024, 4));
    CHECK(pitch == 1024, "pitch %zu", pitch);
    expect_oom(cu.MemAllocPitch(&b, &pitch, 1000, 1, 4), Q, 0, "cuMemAllocPitch");
    OK(cu.MemFree(a));
    CHECK(used_by_shim() == 0, "pitch free left %zu", used_by_shim());

    // cuMemAllocManaged
    // (managed memory is host-resident in the fake: the driver's device count stays 0)
    OK(cu.MemAllocManaged(&a, Q, 1));
    expect_oom(cu.MemAllocManaged(&b, 4096, 1), 0, 0, "cuMemAllocManaged");
    OK(cu.MemFree(a));

    // Arrays: 2048 x 2048 float4 = 64 MiB
    CUarray arr, arr2;
    ArrDesc d2 = {2048, (Q >> 20) * 32, FMT_FLOAT, 4};
    OK(cu.ArrayCreate(&arr, &d2));
    ArrDesc one = {1, 1, FMT_FLOAT, 1};
    expect_oom(cu.ArrayCreate(&arr2, &one), Q, 0, "cuArrayCreate");
    OK(cu.ArrayDestroy(arr));
    Arr3Desc d3 = {256, 256, (Q >> 20), FMT_FLOAT, 4, 0};
    OK(cu.Array3DCreate(&arr, &d3));
    Arr3Desc d3b = {16, 16, 16, FMT_FLOAT, 1, 0};
    expect_oom(cu.Array3DCreate(&arr2, &d3b), Q, 0, "cuArray3DCreate");
    OK(cu.ArrayDestroy(arr));
    Arr3Desc mip = {2048, (Q >> 20) * 32, 0, FMT_FLOAT, 4, 0};
    expect_oom(cu.MipmappedArrayCreate(&arr, &mip, 2), 0, 0, "cuMipmappedArrayCreate");
    OK(cu.MipmappedArrayCreate(&arr, &mip, 1));
    OK(cu.MipmappedArrayDestroy(arr));
    CHECK(used_by_shim() == 0 && fakeUsed(0) == 0, "arrays left %zu", used_by_shim());

    // Virtual memory management
    CUmemHandle h1, h2, h3, hh;
    AllocProp prop = {1, 0, {1, 0}, NULL, {0}};
    OK(cu.MemCreate(&h1, Q / 2, &prop, 0));
    OK(cu.MemCreate(&h2, Q / 2, &prop, 0));
    expect_oom(cu.MemCreate(&h3, 2 << 20, &prop, 0), Q, 0, "cuMemCreate");
    AllocProp host = {1, 0, {2, 0}, NULL, {0}};
    OK(cu.MemCreate(&hh, 2 << 20, &host, 0)); // host memory: not counted
    OK(cu.MemRelease(hh));
    OK(cu.MemRelease(h1)); OK(cu.MemRelease(h2));
    CHECK(used_by_shim() == 0 && fakeUsed(0) == 0, "VMM left %zu", used_by_shim());

    // Stream-ordered allocation from the device's pool: freed memory stays in the pool
    OK(cu.MemAllocAsync(&a, Q, NULL));
    expect_oom(cu.MemAllocAsync(&b, 512, NULL), Q, 0, "cuMemAllocAsync");
    OK(cu.MemFreeAsync(a, NULL));
    expect_oom(cu.MemAlloc(&b, 1 << 20), Q, 0, "cuMemAlloc while the pool keeps memory");
    OK(cu.MemAllocAsync(&a, Q, NULL)); // reuses the pool's memory
    OK(cu.MemFreeAsync(a, NULL));
    CUmemPool defpool = 0;
    {
        // trim the default pool through the fake's own entry point lookup
        CUresult (*getpool)(CUmemPool *, CUdevice) = (void *)dlsym(libcuda ? libcuda : RTLD_DEFAULT, "cuDeviceGetMemPool");
        CHECK(getpool && getpool(&defpool, 0) == 0, "cuDeviceGetMemPool");
    }
    OK(cu.MemPoolTrimTo(defpool, 0));
    CHECK(used_by_shim() == 0 && fakeUsed(0) == 0, "trim left %zu / %llu", used_by_shim(), fakeUsed(0));
    // The driver gives idle pool memory back at synchronisation (release threshold 0):
    // the next allocation finds the quota free again.
    OK(cu.MemAllocAsync(&a, Q, NULL));
    OK(cu.MemFreeAsync(a, NULL));
    OK(cu.CtxSynchronize());
    CHECK(fakeUsed(0) == 0, "sync left %llu in the pool", fakeUsed(0));
    OK(cu.MemAlloc(&b, Q));
    OK(cu.MemFree(b));

    // Explicit pools
    CUmemPool pool;
    PoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.atype = 1; pp.loc.type = 1; pp.loc.id = 0;
    OK(cu.MemPoolCreate(&pool, &pp));
    OK(cu.MemAllocFromPoolAsync(&a, Q / 2, pool, NULL));
    OK(cu.MemAllocFromPoolAsync(&b, Q / 2, pool, NULL));
    expect_oom(cu.MemAllocFromPoolAsync(&c, 1, pool, NULL), Q, 0, "cuMemAllocFromPoolAsync");
    OK(cu.MemFreeAsync(a, NULL)); OK(cu.MemFreeAsync(b, NULL));
    expect_oom(cu.MemAlloc(&c, 4096), Q, 0, "cuMemAlloc while a pool keeps memory");
    OK(cu.MemPoolTrimTo(pool, Q / 2));
    CHECK(used_by_shim() == Q / 2, "after trim %zu", used_by_shim());
    OK(cu.MemAlloc(&c, Q / 2));
    OK(cu.MemFree(c));
    OK(cu.MemPoolDestroy(pool));
    CHECK(used_by_shim() == 0 && fakeUsed(0) == 0, "pool destroy left %zu / %llu", used_by_shim(), fakeUsed(0));

    // The per-thread-default-stream variant is counted once (not again by the driver's
    // own internal calls).
    if (cu.GetProcAddress_v2) {
        CUresult (*alloc_ptsz)(CUdeviceptr *, size_t, CUstream) = NULL;
        CUresult (*free_ptsz)(CUdeviceptr, CUstream) = NULL;
        int st;
        OK(cu.GetProcAddress_v2("cuMemAllocAsync", (void **)&alloc_ptsz, 12080, 2, &st));
        OK(cu.GetProcAddress_v2("cuMemFreeAsync", (void **)&free_ptsz, 12080, 2, &st));
        OK(alloc_ptsz(&a, 1 << 20, NULL));
        CHECK(used_by_shim() == (1 << 20) && fakeUsed(0) == (1 << 20), "_ptsz: shim %zu, driver %llu", used_by_shim(), fakeUsed(0));
        OK(free_ptsz(a, NULL));
        OK(cu.MemPoolTrimTo(defpool, 0));
        CHECK(used_by_shim() == 0 && fakeUsed(0) == 0, "_ptsz trim left %zu", used_by_shim());
    }

    // Device 1 has its own quota (HT_QUOTA1)
    size_t Q1 = env_size("HT_QUOTA1", 0);
    if (Q1) {
        ctx(1);
        OK(cu.MemAlloc(&a, Q1));
        expect_oom(cu.MemAlloc(&b, 1), Q1, 1, "cuMemAlloc on device 1");
        size_t t;
        OK(cu.DeviceTotalMem(&t, 1));
        CHECK(t == Q1, "cuDeviceTotalMem(1) = %zu, want %zu", t, Q1);
        OK(cu.MemFree(a));
        ctx(0);
    }
    printf("paths ok (%s)\n", loader);
    return 0;
}

// cuMemGetInfo, cuDeviceTotalMem and NVML report the quota.
static int s_meminfo(void) {
    start();
    size_t Q = env_size("HT_QUOTA", 64 << 20), f, t;
    OK(cu.MemGetInfo(&f, &t));
    CHECK(t == Q && f == Q, "fresh: free %zu total %zu, want %zu/%zu", f, t, Q, Q);
    CUdeviceptr a;
    OK(cu.MemAlloc(&a, 10 << 20));
    OK(cu.MemGetInfo(&f, &t));
    CHECK(t == Q && f == Q - (10 << 20), "after 10 MiB: free %zu total %zu", f, t);
    OK(cu.MemGetInfo(NULL, &t)); // a null pointer must not crash (HAMi-core #333)
    OK(cu.DeviceTotalMem(&t, 0));
    CHECK(t == Q, "cuDeviceTotalMem %zu", t);

    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(nv, "dlopen NVML: %s", dlerror());
    int (*init)(void) = dlsym(nv, "nvmlInit_v2");
    int (*byidx)(unsigned, void **) = dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
    int (*mi)(void *, NvmlMem *) = dlsym(nv, "nvmlDeviceGetMemoryInfo");
    int (*mi2)(void *, NvmlMem2 *) = dlsym(nv, "nvmlDeviceGetMemoryInfo_v2");
    CHECK(init && byidx && mi && mi2, "NVML symbols");
    OK(init());
    void *dev;
    OK(byidx(0, &dev));
    NvmlMem m;
    OK(mi(dev, &m));
    CHECK(m.total == Q && m.used == (10 << 20) && m.free == Q - (10 << 20),
          "nvmlDeviceGetMemoryInfo total %llu used %llu free %llu", m.total, m.used, m.free);
    NvmlMem2 m2 = {40 | (2 << 24), 0, 0, 0, 0};
    OK(mi2(dev, &m2));
    CHECK(m2.total == Q && m2.used == (10 << 20) && m2.free == Q - (10 << 20),
          "nvmlDeviceGetMemoryInfo_v2 total %llu used %llu free %llu", m2.total, m2.used, m2.free);
    size_t Q1 = env_size("HT_QUOTA1", 0);
    if (Q1) {
        OK(byidx(1, &dev));
        OK(mi(dev, &m));
        CHECK(m.total == Q1 && m.used == 0, "NVML device 1 total %llu used %llu", m.total, m.used);
    }
    OK(cu.MemFree(a));
    printf("meminfo ok (%s)\n", loader);
    return 0;
}

// Prints what the process is told and checks refusal at that size: quota-is <bytes>
static int s_quota_is(const char *want_s) {
    start();
    size_t want = strtoull(want_s, NULL, 0), f, t;
    OK(cu.MemGetInfo(&f, &t));
    CHECK(t == want, "cuMemGetInfo total %zu, want %zu", t, want);
    CUdeviceptr a, b;
    if (want < (80ull << 30)) {
        OK(cu.MemAlloc(&a, want));
        expect_oom(cu.MemAlloc(&b, 1), want, 0, "cuMemAlloc");
        OK(cu.MemFree(a));
    }
    printf("quota %zu ok\n", t);
    return 0;
}

// 16 threads x 10 000 random alloc/free; usage back to 0, never above the quota.
static size_t Q_threads;
static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    CUdeviceptr live[8] = {0};
    size_t ok = 0;
    for (int i = 0; i < 10000; i++) {
        int k = rand_r(&seed) % 8;
        if (live[k]) {
            OK(cu.MemFree(live[k]));
            live[k] = 0;
        } else {
            size_t sz = 1 + rand_r(&seed) % (1 << 20);
            CUresult r = cu.MemAlloc(&live[k], sz);
            if (r == 0) ok++;
            else if (r != OOM) fail("cuMemAlloc -> %d", r);
            else live[k] = 0;
            unsigned long long u = fakeUsed(0);
            CHECK(u <= Q_threads, "driver holds %llu > quota %zu", u, Q_threads);
        }
    }
    for (int k = 0; k < 8; k++)
        if (live[k]) OK(cu.MemFree(live[k]));
    return (void *)ok;
}

static CUcontext primary;
static void *thread_main(void *arg) {
    OK(cu.CtxSetCurrent(primary));
    return worker(arg);
}

static int s_threads(void) {
    start();
    Q_threads = env_size("HT_QUOTA", 64 << 20);
    OK(cu.DevicePrimaryCtxRetain(&primary, 0));
    pthread_t th[16];
    for (int i = 0; i < 16; i++) pthread_create(&th[i], NULL, thread_main, (void *)(uintptr_t)(i + 1));
    size_t total = 0;
    for (int i = 0; i < 16; i++) {
        void *r;
        pthread_join(th[i], &r);
        total += (size_t)r;
    }
    CHECK(fakeUsed(0) == 0, "driver still holds %llu", fakeUsed(0));
    CHECK(used_by_shim() == 0, "shim still counts %zu", used_by_shim());
    printf("threads ok: %zu allocations\n", total);
    return 0;
}

// ---------------------------------------------------------------- shared accounting

#define ST_DEV_USED(base, i) (*(volatile unsigned long long *)((char *)(base) + 64 + (i) * 64 + 32))
#define ST_SLOT(base, i) ((char *)(base) + 1088 + (i) * 160)
#define ST_SLOT_STATE(base, i) (*(volatile unsigned *)(ST_SLOT(base, i)))
#define ST_SLOT_PID(base, i) (*(volatile unsigned *)(ST_SLOT(base, i) + 4))
#define ST_SLOT_USED(base, i, d) (*(volatile unsigned long long *)(ST_SLOT(base, i) + 32 + (d) * 8))

static void *map_state(void) {
    const char *dir = getenv("FGPU_STATE_DIR");
    CHECK(dir, "FGPU_STATE_DIR unset");
    char p[4096];
    snprintf(p, sizeof p, "%s/fgpu-memory.state", dir);
    int fd = open(p, O_RDONLY);
    CHECK(fd >= 0, "open %s: %s", p, strerror(errno));
    void *m = mmap(NULL, 1088 + 1024 * 160, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED, "mmap state");
    CHECK(!memcmp(m, "FGPUACC1", 8), "bad magic");
    return m;
}

static unsigned long long slot_sum(void *st, int dev) {
    unsigned long long s = 0;
    for (int i = 0; i < 1024; i++)
        if (ST_SLOT_STATE(st, i) == 1) s += ST_SLOT_USED(st, i, dev);
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// N forked processes share quota Q; one is SIGKILLed holding memory.
// published[i]: what child i holds; total: what all hold, raised after an allocation
// and lowered before a free, so it never exceeds what the drivers really hold.
typedef struct { volatile unsigned long long published[64]; unsigned long long total; volatile int stop; volatile int holding; } Shared;

static void share_child(Shared *sh, int id, size_t Q) {
    OK(cu.CtxSetCurrent(primary));
    unsigned seed = id * 7919;
    CUdeviceptr live[4] = {0};
    size_t sizes[4] = {0};
    size_t held = 0;
    unsigned long long base = fakeUsed(0); // the parent's memory, copied by fork
    while (!sh->stop) {
        int k = rand_r(&seed) % 4;
        if (live[k]) {
            sh->published[id] = held - sizes[k]; // publish decreases before the free
            __atomic_fetch_sub(&sh->total, sizes[k], __ATOMIC_SEQ_CST);
            OK(cu.MemFree(live[k]));
            held -= sizes[k];
            live[k] = 0;
        } else {
            size_t sz = (1 + rand_r(&seed) % 16) * (Q / 64);
            CUresult r = cu.MemAlloc(&live[k], sz);
            if (r == 0) {
                held += sz;
                sizes[k] = sz;
                sh->published[id] = held; // and increases after the allocation
                __atomic_fetch_add(&sh->total, sz, __ATOMIC_SEQ_CST);
                CHECK(fakeUsed(0) - base == held, "child %d: driver %llu, own count %zu", id, fakeUsed(0) - base, held);
                if (id == 0 && held > 0) sh->holding = 1;
            } else if (r != OOM) fail("child cuMemAlloc -> %d", r);
            else live[k] = 0;
        }
        usleep(rand_r(&seed) % 300);
    }
    for (int k = 0; k < 4; k++)
        if (live[k]) {
            __atomic_fetch_sub(&sh->total, sizes[k], __ATOMIC_SEQ_CST);
            OK(cu.MemFree(live[k]));
        }
    sh->published[id] = 0;
    exit(0);
}

static int s_share(int n) {
    start();
    size_t Q = env_size("HT_QUOTA", 64 << 20);
    OK(cu.DevicePrimaryCtxRetain(&primary, 0));
    // The parent holds memory before forking: children inherit none of it.
    CUdeviceptr mine;
    size_t M = Q / 8;
    OK(cu.MemAlloc(&mine, M));
    Shared *sh = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sh, 0, sizeof *sh);
    pid_t pids[64];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) share_child(sh, i, Q);
    }
    void *st = map_state();
    double t0 = now_s();
    unsigned long long peak = 0;
    long samples = 0;
    // Sample for 2 s: the drivers' real holdings and the account never pass the quota.
    while (now_s() - t0 < 2.0) {
        unsigned long long sum = M + __atomic_load_n(&sh->total, __ATOMIC_SEQ_CST);
        unsigned long long acc = ST_DEV_USED(st, 0);
        CHECK(sum <= Q, "processes hold %llu > quota %zu", sum, Q);
        CHECK(acc <= Q, "account says %llu > quota %zu", acc, Q);
        if (sum > peak) peak = sum;
        samples++;
    }
    CHECK(peak > Q / 2, "the workers never got near the quota (peak %llu)", peak);
    // Kill child 0 while it holds memory.
    double th = now_s();
    while (!(sh->holding && sh->published[0] > 0)) {
        CHECK(now_s() - th < 10, "child 0 never held memory");
        usleep(100);
    }
    unsigned long long victim_held = sh->published[0];
    kill(pids[0], SIGKILL);
    waitpid(pids[0], NULL, 0);
    double tk = now_s();
    int victim_slot = -1;
    for (int i = 0; i < 1024; i++)
        if (ST_SLOT_STATE(st, i) == 1 && ST_SLOT_PID(st, i) == (unsigned)pids[0]) victim_slot = i;
    // Reclaimed by the next allocation of another process, within a second.
    while (victim_slot >= 0 && ST_SLOT_STATE(st, victim_slot) == 1 && ST_SLOT_PID(st, victim_slot) == (unsigned)pids[0]) {
        CHECK(now_s() - tk < 2.5, "slot of SIGKILLed pid %d (%llu bytes) not reclaimed after %.1fs", pids[0], victim_held, now_s() - tk);
        usleep(1000);
    }
    double took = now_s() - tk;
    sh->stop = 1;
    for (int i = 1; i < n; i++) {
        int stt;
        waitpid(pids[i], &stt, 0);
        CHECK(WIFEXITED(stt) && WEXITSTATUS(stt) == 0, "child %d failed", i);
    }
    CHECK(ST_DEV_USED(st, 0) == M, "after all children: account %llu, want %zu (parent's)", ST_DEV_USED(st, 0), M);
    CHECK(slot_sum(st, 0) == M, "slots sum %llu", slot_sum(st, 0));
    OK(cu.MemFree(mine));
    CUdeviceptr all;
    OK(cu.MemAlloc(&all, Q)); // the whole quota is back
    OK(cu.MemFree(all));
    printf("share ok: %d processes, %ld samples, peak %llu of %zu, killed pid held %llu, reclaimed in %.2fs\n", n, samples, peak, Q, victim_held, took);
    return 0;
}

// NVML device <index> reports total <bytes> (no CUDA call in this process, as nvidia-smi).
static int s_nvml_total(const char *idx, const char *want_s) {
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(nv, "dlopen NVML: %s", dlerror());
    int (*init)(void) = dlsym(nv, "nvmlInit_v2");
    int (*byidx)(unsigned, void **) = dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
    int (*mi)(void *, NvmlMem *) = dlsym(nv, "nvmlDeviceGetMemoryInfo");
    CHECK(init && byidx && mi, "NVML symbols");
    OK(init());
    void *dev;
    OK(byidx(atoi(idx), &dev));
    NvmlMem m;
    OK(mi(dev, &m));
    unsigned long long want = strtoull(want_s, NULL, 0);
    CHECK(m.total == want, "NVML device %s: total %llu, want %llu", idx, m.total, want);
    printf("nvml %s total %llu ok\n", idx, m.total);
    return 0;
}

// Prints the claim's usage of device entry 0 from the account file (no CUDA).
static int s_account_used(void) {
    void *st = map_state();
    printf("%llu\n", ST_DEV_USED(st, 0));
    return 0;
}

// Allocates <bytes>: exit 0 if the driver gave them, 1 if refused.
static int s_alloc(const char *bytes) {
    start();
    CUdeviceptr a;
    size_t n = strtoull(bytes, NULL, 0), f, t;
    OK(cu.MemGetInfo(&f, &t));
    CUresult r = cu.MemAlloc(&a, n);
    CHECK(r == 0, "cuMemAlloc(%zu) -> %d (free %zu of %zu)", n, r, f, t);
    OK(cu.MemFree(a));
    printf("alloc %zu ok\n", n);
    return 0;
}

// Holds <bytes> and sleeps (for kill tests from the shell).
static int s_hold(const char *bytes) {
    start();
    CUdeviceptr a;
    OK(cu.MemAlloc(&a, strtoull(bytes, NULL, 0)));
    printf("holding\n");
    fflush(stdout);
    pause();
    return 0;
}

// Launches, proc-address semantics and the dlsym route.
static int s_launch(void) {
    start();
    CUmodule m;
    CUfunction f;
    OK(cu.ModuleLoadData(&m, "fake-image"));
    OK(cu.ModuleGetFunction(&f, m, "kernel"));
    unsigned long long (*count)(void) = (void *)dlsym(libcuda ? libcuda : RTLD_DEFAULT, "fakeCudaLaunchCount");
    unsigned long long before = count();
    for (int i = 0; i < 1000; i++) OK(cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CHECK(count() - before == 1000, "launches seen %llu", count() - before);
    const char *s;
    OK(cu.GetErrorString(OOM, &s));
    CHECK(!strcmp(s, "out of memory"), "error string %s", s);
    if (getenv("HT_EXPECT_SHIM")) {
        // Whatever route, the entry points are the shim's.
        Dl_info di;
        CHECK(dladdr((void *)cu.MemAlloc, &di) && strstr(di.dli_fname, "libfgpu"), "cuMemAlloc not from libfgpu.so: %s", di.dli_fname);
        CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) =
            cu.GetProcAddress_v2 ? cu.GetProcAddress_v2 : (void *)dlsym(libcuda, "cuGetProcAddress_v2");
        void *p = NULL;
        int status = -1;
        OK(gpa("cuLaunchKernel", &p, 12080, 2, &status));
        CHECK(dladdr(p, &di) && di.dli_sname && !strcmp(di.dli_sname, "cuLaunchKernel_ptsz") && strstr(di.dli_fname, "libfgpu"),
              "per-thread cuLaunchKernel is %s in %s", di.dli_sname, di.dli_fname);
        CHECK(status == 0, "symbolStatus %d", status);
        CHECK(gpa("cuMemAlloc", &p, 2000, 0, &status) == 500 && status == 2 && p == NULL, "version 2.0 must be refused");
        CHECK(gpa("cuNoSuchThing", &p, 12080, 0, &status) == 500 && status == 1, "unknown symbol");
        OK(gpa("cuGetProcAddress", &p, 12080, 0, &status));
        CHECK(dladdr(p, &di) && di.dli_sname && !strcmp(di.dli_sname, "cuGetProcAddress_v2") && strstr(di.dli_fname, "libfgpu"),
              "nested cuGetProcAddress is %s", di.dli_sname);
        // dlsym(RTLD_NEXT) is answered relative to the real caller (this program).
        void *next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
        if (!strcmp(loader, "direct"))
            CHECK(next && dladdr(next, &di) && strstr(di.dli_fname, "libfgpu"), "RTLD_NEXT from the program: %s", next ? di.dli_fname : "null");
        CHECK(dlsym(RTLD_NEXT, "printf") != NULL, "RTLD_NEXT printf");
    }
    printf("launch ok (%s)\n", loader);
    return 0;
}

// ---------------------------------------------------------------- core quota

typedef struct { unsigned grid[3], block[3], shared; CUstream stream; void *attrs; unsigned nattrs; } LaunchCfg;

static unsigned long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static CUfunction core_setup(int *dev, unsigned long long (**busy)(int, int)) {
    start();
    *dev = (int)env_size("HT_DEV", 0);
    CUmodule m;
    CUfunction f;
    if (env_size("HT_TOUCH0", 0)) {
        // One launch on device 0 first (its context is current after start()).
        OK(cu.ModuleLoadData(&m, "fake-image"));
        OK(cu.ModuleGetFunction(&f, m, "kernel"));
        OK(cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        OK(cu.CtxSynchronize());
    }
    ctx(*dev);
    OK(cu.ModuleLoadData(&m, "fake-image"));
    OK(cu.ModuleGetFunction(&f, m, "kernel"));
    *busy = (unsigned long long (*)(int, int))dlsym(libcuda ? libcuda : RTLD_DEFAULT, "fakeCudaBusyNs");
    CHECK(*busy, "no fakeCudaBusyNs");
    return f;
}

// One launch of every kind, in a fixed mix: kernels, cuLaunchKernelEx, cooperative
// kernels and graphs (2 in 8).
static void launch_mix(CUfunction f, long n, unsigned blocks) {
    LaunchCfg cfg = {{blocks, 1, 1}, {32, 1, 1}, 0, NULL, NULL, 0};
    switch (n % 8) {
    case 3: case 7: OK(cu.GraphLaunch((void *)0x9, NULL)); break;
    case 5: OK(cu.LaunchCooperativeKernel(f, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL)); break;
    case 6: OK(cu.LaunchKernelEx(&cfg, f, NULL, NULL)); break;
    default: OK(cu.LaunchKernel(f, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    }
}

// Launches as fast as allowed for SECS; prints this process's share of the GPU's time
// (from the fake's timeline) over [WARM, SECS).
static int s_work(double secs, double warm) {
    int dev;
    unsigned long long (*busy)(int, int);
    CUfunction f = core_setup(&dev, &busy);
    unsigned blocks = (unsigned)env_size("HT_BLOCKS", 40);
    int pid = getpid();
    double t0 = now_s(), tw = 0;
    unsigned long long b0 = 0;
    long n = 0;
    for (;; n++) {
        double t = now_s();
        if (tw == 0 && t - t0 >= warm) { tw = t; b0 = busy(dev, pid); }
        if (t - t0 >= secs) break;
        launch_mix(f, n, blocks);
    }
    double t1 = now_s();
    unsigned long long b1 = busy(dev, pid);
    printf("share=%.2f launches=%ld\n", (double)(b1 - b0) / 1e9 / (t1 - tw) * 100, n);
    return 0;
}

// Watches device DEV without launching: after DELAY s, prints every process's share of
// the device's time over the next DUR s (one window for all, unlike each worker's own).
static int s_devshare(int dev, double delay, double dur) {
    start();
    unsigned long long (*busy)(int, int) =
        (unsigned long long (*)(int, int))dlsym(libcuda ? libcuda : RTLD_DEFAULT, "fakeCudaBusyNs");
    CHECK(busy, "no fakeCudaBusyNs");
    usleep((useconds_t)(delay * 1e6));
    double t0 = now_s();
    unsigned long long b0 = busy(dev, 0);
    usleep((useconds_t)(dur * 1e6));
    double t1 = now_s();
    unsigned long long b1 = busy(dev, 0);
    printf("share=%.2f\n", (double)(b1 - b0) / 1e9 / (t1 - t0) * 100);
    return 0;
}

// High priority: after DELAY s, launches (synchronously) for DUR s, then writes
// "<first launch ns> <last launch ns>" to FILE.
static int s_prio_high(double delay, double dur, const char *file) {
    int dev;
    unsigned long long (*busy)(int, int);
    CUfunction f = core_setup(&dev, &busy);
    usleep((useconds_t)(delay * 1e6));
    unsigned long long h = mono_ns(), e = h;
    while ((e = mono_ns()) - h < (unsigned long long)(dur * 1e9)) {
        OK(cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        OK(cu.CtxSynchronize());
    }
    FILE *o = fopen(file, "w");
    CHECK(o, "cannot write %s", file);
    fprintf(o, "%llu %llu\n", h, mono_ns());
    fclose(o);
    return 0;
}

// Low priority: launches (synchronously) for SECS, then reads the high-priority
// process's FILE and reports how long after its first launch this process's launches
// stopped, and how long after its last one they resumed.
static int s_prio_low(double secs, const char *file) {
    int dev;
    unsigned long long (*busy)(int, int);
    CUfunction f = core_setup(&dev, &busy);
    size_t cap = 1 << 20, n = 0;
    unsigned long long *ts = malloc(cap * sizeof *ts), t0 = mono_ns();
    CHECK(ts, "malloc");
    while (mono_ns() - t0 < (unsigned long long)(secs * 1e9) && n < cap) {
        OK(cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        ts[n++] = mono_ns();
        OK(cu.CtxSynchronize());
    }
    FILE *in = fopen(file, "r");
    unsigned long long h = 0, e = 0;
    CHECK(in && fscanf(in, "%llu %llu", &h, &e) == 2, "no times from the high-priority process");
    fclose(in);
    unsigned long long last_in = h, first_after = 0, before = 0;
    for (size_t i = 0; i < n; i++) {
        if (ts[i] < h) before++;
        else if (ts[i] <= e) last_in = ts[i];
        else if (!first_after) first_after = ts[i];
    }
    CHECK(before > 0, "the low-priority process never ran before the high one");
    CHECK(first_after, "the low-priority process never resumed");
    double stall = (last_in - h) / 1e6, resume = (first_after - e) / 1e6;
    printf("stalled %.1f ms after high-priority work began, resumed %.1f ms after it ended\n", stall, resume);
    CHECK(stall <= 100 && resume <= 100, "stall %.1f ms / resume %.1f ms (limit 100)", stall, resume);
    return 0;
}

// ---------------------------------------------------------------- benchmark

static double bench_ns(int what, long n) {
    CUdeviceptr p;
    CUfunction f = (CUfunction)0x1234;
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        if (what == 0) {
            cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        } else if (what == 2) {
            cu.CtxSynchronize();
        } else {
            if (cu.MemAlloc(&p, 4096) != 0) fail("bench alloc");
            cu.MemFree(p);
        }
    }
    return (now_s() - t0) * 1e9 / n;
}

static int s_bench(void) {
    start();
    long n = env_size("HT_BENCH_N", 1000000);
    double best_l = 1e18, best_a = 1e18, best_s = 1e18;
    for (int r = 0; r < 5; r++) {
        double l = bench_ns(0, n), a = bench_ns(1, n / 4), s = bench_ns(2, n / 4);
        if (l < best_l) best_l = l;
        if (a < best_a) best_a = a;
        if (s < best_s) best_s = s;
    }
    printf("launch_ns=%.1f alloc_free_ns=%.1f sync_ns=%.1f\n", best_l, best_a, best_s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: hooktest paths|meminfo|quota-is N|threads|share N|alloc N|hold N|launch|bench\n");
        return 2;
    }
    const char *s = argv[1];
    if (!strcmp(s, "paths")) return s_paths();
    if (!strcmp(s, "meminfo")) return s_meminfo();
    if (!strcmp(s, "quota-is") && argc > 2) return s_quota_is(argv[2]);
    if (!strcmp(s, "threads")) return s_threads();
    if (!strcmp(s, "share") && argc > 2) return s_share(atoi(argv[2]));
    if (!strcmp(s, "nvml-total") && argc > 3) return s_nvml_total(argv[2], argv[3]);
    if (!strcmp(s, "account-used")) return s_account_used();
    if (!strcmp(s, "alloc") && argc > 2) return s_alloc(argv[2]);
    if (!strcmp(s, "hold") && argc > 2) return s_hold(argv[2]);
    if (!strcmp(s, "launch")) return s_launch();
    if (!strcmp(s, "bench")) return s_bench();
    if (!strcmp(s, "work") && argc > 3) return s_work(atof(argv[2]), atof(argv[3]));
    if (!strcmp(s, "devshare") && argc > 4) return s_devshare(atoi(argv[2]), atof(argv[3]), atof(argv[4]));
    if (!strcmp(s, "prio-high") && argc > 4) return s_prio_high(atof(argv[2]), atof(argv[3]), argv[4]);
    if (!strcmp(s, "prio-low") && argc > 3) return s_prio_low(atof(argv[2]), argv[3]);
    fprintf(stderr, "unknown scenario %s\n", s);
    return 2;
}
