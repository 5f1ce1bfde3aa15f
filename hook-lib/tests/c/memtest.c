// Device memory the shim must count although no cuMemAlloc/cuMemFree pair shows it:
// stream-ordered pools after each kind of synchronisation, contexts, cuCtxSetLimit, and
// the lookup functions (dlvsym) that would reach the unwrapped driver.
//
// Routes (HT_LOADER): dlsym | proc1 (cuGetProcAddress, CUDA 11.8) | proc
// (cuGetProcAddress_v2, CUDA 12.9) | direct (the binary built with -DDIRECT); HT_FLAGS
// is the cuGetProcAddress flag (0 default, 1 legacy stream, 2 per-thread default
// stream: the _ptsz variants); HT_PTSZ=1 makes the dlsym route resolve the _ptsz names.
// The quota is HT_QUOTA bytes on device 0; FGPU_STATE_DIR names the claim's account.
// Usage: memtest poolsync ctx|ctx2|stream|event|trim|threshold | otherdev | poolthreads | contexts | setlimit | dlvsym
// Exit 0 = pass, 1 = a check failed (message on stderr), 2 = usage.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr, CUmemPool, CUevent;
typedef void *CUcontext, *CUstream;

#define OOM 2
#define ATTR_RELEASE_THRESHOLD 4
#define ATTR_RESERVED_MEM_CURRENT 5
#define LIMIT_STACK 0
#define LIMIT_HEAP 2
// The fake's device: 132 SMs x 2048 resident threads.
#define RESIDENT_THREADS (132ull * 2048)

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, int);
    CUresult (*DevicePrimaryCtxRelease)(int);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*CtxSynchronize_v2)(CUcontext);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*DeviceGetMemPool)(CUmemPool *, int);
    CUresult (*DeviceGetDefaultMemPool)(CUmemPool *, int);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemPool, CUstream);
    CUresult (*MemPoolTrimTo)(CUmemPool, size_t);
    CUresult (*MemPoolSetAttribute)(CUmemPool, int, void *);
    CUresult (*MemPoolGetAttribute)(CUmemPool, int, void *);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    void *CtxCreate; // _v2, _v3 or _v4, by ctx_version
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxSetLimit)(int, size_t);
    CUresult (*CtxGetLimit)(size_t *, int);
    CUresult (*GetProcAddress_v2)(const char *, void **, int, unsigned long long, int *);
    CUresult (*GetProcAddress)(const char *, void **, int, unsigned long long);
} cu;

static unsigned long long (*fakeUsed)(int);
static const char *loader = "proc";
static void *libcuda;
static int ctx_version = 2, proc_version = 12090;
static unsigned long long proc_flags;

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL [%s flags %llu] ", loader, proc_flags);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}
#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)
#define OK(call) do { CUresult r_ = (call); if (r_ != 0) fail("%s:%d %s -> %d", __FILE__, __LINE__, #call, r_); } while (0)

#ifdef DIRECT
extern CUresult cuInit(unsigned), cuDevicePrimaryCtxRetain(CUcontext *, int), cuDevicePrimaryCtxRelease_v2(int),
    cuCtxSetCurrent(CUcontext), cuCtxSynchronize(void), cuCtxSynchronize_v2(CUcontext), cuStreamCreate(CUstream *, unsigned), cuStreamSynchronize(CUstream),
    cuEventCreate(CUevent *, unsigned), cuEventRecord(CUevent, CUstream), cuEventSynchronize(CUevent), cuEventDestroy_v2(CUevent),
    cuMemAlloc_v2(CUdeviceptr *, size_t), cuMemFree_v2(CUdeviceptr), cuMemAllocAsync(CUdeviceptr *, size_t, CUstream),
    cuMemFreeAsync(CUdeviceptr, CUstream), cuDeviceGetMemPool(CUmemPool *, int), cuDeviceGetDefaultMemPool(CUmemPool *, int),
    cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemPool, CUstream), cuMemPoolTrimTo(CUmemPool, size_t),
    cuMemPoolSetAttribute(CUmemPool, int, void *), cuMemPoolGetAttribute(CUmemPool, int, void *), cuMemGetInfo_v2(size_t *, size_t *),
    cuCtxCreate_v2(CUcontext *, unsigned, int), cuCtxDestroy_v2(CUcontext), cuCtxSetLimit(int, size_t), cuCtxGetLimit(size_t *, int);
extern unsigned long long fakeCudaUsedBytes(int);
#endif

static void *sym_dlsym(const char *name) {
    if (getenv("HT_PTSZ") && (!strcmp(name, "cuMemAllocAsync") || !strcmp(name, "cuMemFreeAsync") ||
                              !strcmp(name, "cuStreamSynchronize") || !strcmp(name, "cuEventRecord"))) {
        char n[128];
        snprintf(n, sizeof n, "%s_ptsz", name);
        return dlsym(libcuda, n);
    }
    return dlsym(libcuda, name);
}

static void *sym_proc(const char *base) {
    void *p = NULL;
    int status = -1;
    CUresult r = cu.GetProcAddress_v2 ? cu.GetProcAddress_v2(base, &p, proc_version, proc_flags, &status)
                                      : cu.GetProcAddress(base, &p, proc_version, proc_flags);
    return r == 0 ? p : NULL;
}

static void load(void) {
    const char *l = getenv("HT_LOADER");
    if (l) loader = l;
    if (getenv("HT_FLAGS")) proc_flags = strtoull(getenv("HT_FLAGS"), NULL, 0);
#ifdef DIRECT
    loader = "direct";
    cu.Init = cuInit; cu.DevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain; cu.DevicePrimaryCtxRelease = cuDevicePrimaryCtxRelease_v2;
    cu.CtxSetCurrent = cuCtxSetCurrent; cu.CtxSynchronize = cuCtxSynchronize; cu.CtxSynchronize_v2 = cuCtxSynchronize_v2;
    cu.StreamCreate = cuStreamCreate;
    cu.StreamSynchronize = cuStreamSynchronize; cu.EventCreate = cuEventCreate; cu.EventRecord = cuEventRecord;
    cu.EventSynchronize = cuEventSynchronize; cu.EventDestroy = cuEventDestroy_v2; cu.MemAlloc = cuMemAlloc_v2;
    cu.MemFree = cuMemFree_v2; cu.MemAllocAsync = cuMemAllocAsync; cu.MemFreeAsync = cuMemFreeAsync;
    cu.DeviceGetMemPool = cuDeviceGetMemPool; cu.DeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool;
    cu.MemAllocFromPoolAsync = cuMemAllocFromPoolAsync; cu.MemPoolTrimTo = cuMemPoolTrimTo; cu.MemPoolSetAttribute = cuMemPoolSetAttribute;
    cu.MemPoolGetAttribute = cuMemPoolGetAttribute; cu.MemGetInfo = cuMemGetInfo_v2; cu.CtxCreate = (void *)cuCtxCreate_v2;
    cu.CtxDestroy = cuCtxDestroy_v2; cu.CtxSetLimit = cuCtxSetLimit; cu.CtxGetLimit = cuCtxGetLimit;
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
    if (!strcmp(loader, "proc") || !strcmp(loader, "proc1")) {
        if (!strcmp(loader, "proc")) {
            cu.GetProcAddress_v2 = dlsym(libcuda, "cuGetProcAddress_v2");
            ctx_version = 4;
        } else {
            cu.GetProcAddress = dlsym(libcuda, "cuGetProcAddress");
            proc_version = 11080;
            ctx_version = 3;
        }
        CHECK(cu.GetProcAddress_v2 || cu.GetProcAddress, "no cuGetProcAddress");
        sym = sym_proc;
        v2 = "";
    } else if (strcmp(loader, "dlsym")) {
        fprintf(stderr, "unknown HT_LOADER %s\n", loader);
        exit(2);
    }
    char n[128];
#define L(field, name, ver) do { snprintf(n, sizeof n, "%s%s", name, ver); *(void **)&cu.field = sym(n); CHECK(cu.field, "cannot resolve %s", n); } while (0)
    L(Init, "cuInit", ""); L(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", ""); L(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", v2);
    L(CtxSetCurrent, "cuCtxSetCurrent", ""); L(CtxSynchronize, "cuCtxSynchronize", "");
    *(void **)&cu.CtxSynchronize_v2 = sym("cuCtxSynchronize_v2"); // CUDA 12.9+ only
    L(StreamCreate, "cuStreamCreate", "");
    L(StreamSynchronize, "cuStreamSynchronize", ""); L(EventCreate, "cuEventCreate", ""); L(EventRecord, "cuEventRecord", "");
    L(EventSynchronize, "cuEventSynchronize", ""); L(EventDestroy, "cuEventDestroy", v2); L(MemAlloc, "cuMemAlloc", v2);
    L(MemFree, "cuMemFree", v2); L(MemAllocAsync, "cuMemAllocAsync", ""); L(MemFreeAsync, "cuMemFreeAsync", "");
    L(DeviceGetMemPool, "cuDeviceGetMemPool", ""); L(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", "");
    L(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", ""); L(MemPoolTrimTo, "cuMemPoolTrimTo", ""); L(MemPoolSetAttribute, "cuMemPoolSetAttribute", "");
    L(MemPoolGetAttribute, "cuMemPoolGetAttribute", ""); L(MemGetInfo, "cuMemGetInfo", v2); L(CtxCreate, "cuCtxCreate", v2);
    L(CtxDestroy, "cuCtxDestroy", v2); L(CtxSetLimit, "cuCtxSetLimit", ""); L(CtxGetLimit, "cuCtxGetLimit", "");
}

static CUresult ctx_create(CUcontext *c, int dev) {
    switch (ctx_version) {
    case 4: return ((CUresult (*)(CUcontext *, void *, unsigned, int))cu.CtxCreate)(c, NULL, 0, dev);
    case 3: return ((CUresult (*)(CUcontext *, void *, int, unsigned, int))cu.CtxCreate)(c, NULL, 0, 0, dev);
    default: return ((CUresult (*)(CUcontext *, unsigned, int))cu.CtxCreate)(c, 0, dev);
    }
}

static CUcontext primary;
static size_t Q;

static void start(void) {
    load();
    Q = getenv("HT_QUOTA") ? strtoull(getenv("HT_QUOTA"), NULL, 0) : 64 << 20;
    OK(cu.Init(0));
    OK(cu.DevicePrimaryCtxRetain(&primary, 0));
    OK(cu.CtxSetCurrent(primary));
}

// The claim's usage of device entry 0, read from the account file itself (the layout of
// hook-lib/src/state.rs): what every other process of the claim is judged against.
static unsigned long long account_used(void) {
    static void *m;
    if (!m) {
        const char *dir = getenv("FGPU_STATE_DIR");
        CHECK(dir, "FGPU_STATE_DIR unset");
        char p[4096];
        snprintf(p, sizeof p, "%s/fgpu-memory.state", dir);
        int fd = open(p, O_RDONLY);
        CHECK(fd >= 0, "open %s: %s", p, strerror(errno));
        m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        CHECK(m != MAP_FAILED, "mmap account");
    }
    return *(volatile unsigned long long *)((char *)m + 64 + 32);
}

static size_t shim_free(void) {
    size_t f, t;
    OK(cu.MemGetInfo(&f, &t));
    return f;
}

// Another process of the claim allocates `n` bytes: 0 if the shim let it.
static int other_process_allocates(size_t n) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr p;
        CUresult r = cu.MemAlloc(&p, n);
        if (r != 0) {
            fprintf(stderr, "FAIL [%s flags %llu] another process of the claim: cuMemAlloc(%zu) -> %d\n", loader, proc_flags, n, r);
            _exit(1);
        }
        cu.MemFree(p);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

// Q bytes from the default pool, freed, then one kind of synchronisation: afterwards the
// driver, the account and cuMemGetInfo agree, and another process gets what is free.
static int s_poolsync(const char *kind) {
    start();
    CUmemPool pool;
    OK(cu.DeviceGetMemPool(&pool, 0));
    unsigned long long keep = 0;
    if (!strcmp(kind, "threshold")) {
        keep = Q / 2; // the pool keeps up to Q/2 of idle memory at synchronisation
        OK(cu.MemPoolSetAttribute(pool, ATTR_RELEASE_THRESHOLD, &keep));
    }
    CUstream s = NULL;
    if (!strcmp(kind, "stream") || !strcmp(kind, "event")) OK(cu.StreamCreate(&s, 0));
    CUdeviceptr a, b;
    OK(cu.MemAllocAsync(&a, Q, s));
    CHECK(account_used() == Q && fakeUsed(0) == Q, "after cuMemAllocAsync: account %llu, driver %llu", account_used(), fakeUsed(0));
    CHECK(cu.MemAllocAsync(&b, 4096, s) == OOM, "cuMemAllocAsync past the quota was not refused");
    OK(cu.MemFreeAsync(a, s));
    // Freed into the pool: still the driver's memory, still charged.
    CHECK(account_used() == Q && fakeUsed(0) == Q, "after cuMemFreeAsync: account %llu, driver %llu", account_used(), fakeUsed(0));
    if (!strcmp(kind, "ctx") || !strcmp(kind, "threshold")) {
        OK(cu.CtxSynchronize());
    } else if (!strcmp(kind, "ctx2")) {
        CHECK(cu.CtxSynchronize_v2, "cannot resolve cuCtxSynchronize_v2");
        OK(cu.CtxSynchronize_v2(primary));
    } else if (!strcmp(kind, "stream")) {
        OK(cu.StreamSynchronize(s));
    } else if (!strcmp(kind, "event")) {
        CUevent e;
        OK(cu.EventCreate(&e, 0));
        OK(cu.EventRecord(e, s));
        OK(cu.EventSynchronize(e));
        OK(cu.EventDestroy(e));
    } else if (!strcmp(kind, "trim")) {
        OK(cu.MemPoolTrimTo(pool, 0));
    } else {
        fprintf(stderr, "unknown synchronisation %s\n", kind);
        exit(2);
    }
    unsigned long long reserved = 0;
    OK(cu.MemPoolGetAttribute(pool, ATTR_RESERVED_MEM_CURRENT, &reserved));
    CHECK(reserved == keep && fakeUsed(0) == keep, "the driver keeps %llu (pool %llu), want %llu", fakeUsed(0), reserved, keep);
    // The shim agrees with the driver: first the account (before anything could refresh it)...
    // (-DSKIP_ACCOUNT_CHECK builds a program that shows what the process and another one see.)
#ifndef SKIP_ACCOUNT_CHECK
    CHECK(account_used() == keep, "after %s synchronisation the driver holds %llu but the claim is charged %llu", kind, fakeUsed(0),
          account_used());
    // ... then what the process is told, and what another process of the claim may take.
    CHECK(shim_free() == Q - keep, "cuMemGetInfo free %zu, the driver has %llu of the quota free", shim_free(), Q - keep);
#else
    fprintf(stderr, "[%s flags %llu] after %s: driver keeps %llu, account %llu, cuMemGetInfo free %zu (want %llu)\n", loader,
            proc_flags, kind, fakeUsed(0), account_used(), shim_free(), Q - keep);
#endif
    CHECK(other_process_allocates(Q - keep) == 0, "an allocation that fits was refused");
    printf("poolsync %s ok: the driver keeps %llu, the claim is charged %llu\n", kind, keep, account_used());
    return 0;
}

// 8 threads allocate from the default pool, free and synchronise (context, stream,
// event) at random, while the driver's holdings and the account are sampled: neither
// ever passes the quota, and after a last synchronisation both are back to zero.
static void *pool_worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg;
    OK(cu.CtxSetCurrent(primary));
    CUstream s;
    OK(cu.StreamCreate(&s, 0));
    CUdeviceptr live[4] = {0};
    for (int i = 0; i < 3000; i++) {
        int k = rand_r(&seed) % 4;
        if (live[k]) {
            OK(cu.MemFreeAsync(live[k], s));
            live[k] = 0;
        } else {
            CUresult r = cu.MemAllocAsync(&live[k], (1 + rand_r(&seed) % 16) * (Q / 64), s);
            if (r == OOM) live[k] = 0;
            else if (r) fail("cuMemAllocAsync -> %d", r);
        }
        switch (rand_r(&seed) % 16) {
        case 0: OK(cu.CtxSynchronize()); break;
        case 1: OK(cu.StreamSynchronize(s)); break;
        case 2: {
            CUevent e;
            OK(cu.EventCreate(&e, 0));
            OK(cu.EventRecord(e, s));
            OK(cu.EventSynchronize(e));
            OK(cu.EventDestroy(e));
            break;
        }
        default: break;
        }
    }
    for (int k = 0; k < 4; k++)
        if (live[k]) OK(cu.MemFreeAsync(live[k], s));
    return NULL;
}

static int s_poolthreads(void) {
    start();
    CUdeviceptr one;
    OK(cu.MemAlloc(&one, 4096)); // the account exists from here on
    OK(cu.MemFree(one));
    account_used();
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, pool_worker, (void *)(size_t)(i + 1));
    unsigned long long peak = 0;
    long samples = 0;
    int joined[8] = {0};
    for (;;) {
        unsigned long long d = fakeUsed(0), a = account_used();
        CHECK(d <= Q && a <= Q, "the driver holds %llu, the account says %llu: past the quota %zu", d, a, Q);
        if (d > peak) peak = d;
        samples++;
        int alive = 0;
        for (int i = 0; i < 8; i++) {
            if (!joined[i]) joined[i] = pthread_tryjoin_np(th[i], NULL) == 0;
            alive += !joined[i];
        }
        if (!alive) break;
    }
    OK(cu.CtxSynchronize());
    CHECK(fakeUsed(0) == 0 && account_used() == 0, "after the last synchronisation: driver %llu, account %llu", fakeUsed(0),
          account_used());
    CHECK(peak > Q / 2, "the threads never got near the quota (peak %llu)", peak);
    printf("poolthreads ok: %ld samples, driver peak %llu of %zu, both back to 0\n", samples, peak, Q);
    return 0;
}

// Device 1's default pool used from a context on device 0: charged to device 1's quota
// (HT_QUOTA1), not to the current device's.
static int s_otherdev(void) {
    start();
    size_t Q1 = getenv("HT_QUOTA1") ? strtoull(getenv("HT_QUOTA1"), NULL, 0) : 0;
    CHECK(Q1 > 0 && Q1 < Q, "HT_QUOTA1 (device 1's quota, below device 0's) not set");
    CUmemPool p1;
    CUdeviceptr a, b;
    OK(cu.DeviceGetDefaultMemPool(&p1, 1));
    OK(cu.MemAllocFromPoolAsync(&a, Q1, p1, NULL));
    CHECK(fakeUsed(1) == Q1 && fakeUsed(0) == 0, "driver: device 1 %llu, device 0 %llu", fakeUsed(1), fakeUsed(0));
    CUresult r = cu.MemAllocFromPoolAsync(&b, 4096, p1, NULL);
    CHECK(r == OOM, "device 1's pool past device 1's quota: %d, want CUDA_ERROR_OUT_OF_MEMORY (charged to device 0?)", r);
    OK(cu.MemAlloc(&b, Q)); // device 0's quota is untouched
    OK(cu.MemFree(b));
    OK(cu.MemFreeAsync(a, NULL));
    OK(cu.CtxSynchronize());
    CHECK(fakeUsed(1) == 0, "device 1 keeps %llu", fakeUsed(1));
    OK(cu.MemAllocFromPoolAsync(&a, Q1, p1, NULL)); // given back at synchronisation
    OK(cu.MemFreeAsync(a, NULL));
    printf("otherdev ok: device 1's pool charged to device 1\n");
    return 0;
}

// One context per FGPU_CONTEXT_OVERHEAD (= FAKE_CUDA_CONTEXT_MEMORY) of the quota.
static int s_contexts(void) {
    start();
    size_t X = strtoull(getenv("HT_CONTEXT") ? getenv("HT_CONTEXT") : "0", NULL, 0);
    CHECK(X > 0 && X <= Q, "HT_CONTEXT (bytes per context) not set");
    CHECK(fakeUsed(0) == X, "the primary context takes %llu, want %zu", fakeUsed(0), X);
    CUcontext c[256];
    int n = 0;
    CUresult r = 0;
    while (n < 256 && (r = ctx_create(&c[n], 0)) == 0) {
        n++;
        CHECK(fakeUsed(0) <= Q, "%d contexts take %llu of the device, past the quota %zu", n + 1, fakeUsed(0), Q);
    }
    CHECK(r == OOM, "context %d: cuCtxCreate -> %d, want CUDA_ERROR_OUT_OF_MEMORY", n + 1, r);
    CHECK((size_t)(n + 1) == Q / X, "%d contexts fit, want %zu", n + 1, Q / X);
    CHECK(account_used() == (n + 1) * X && fakeUsed(0) == (n + 1) * X, "account %llu, driver %llu", account_used(), fakeUsed(0));
    OK(cu.CtxSetCurrent(primary));
    CHECK(shim_free() == Q - (n + 1) * X, "cuMemGetInfo free %zu", shim_free());
    for (int i = 0; i < n; i++) OK(cu.CtxDestroy(c[i]));
    CHECK(account_used() == X, "after cuCtxDestroy: account %llu, want %zu", account_used(), X);
    OK(cu.DevicePrimaryCtxRelease(0));
    CHECK(account_used() == 0 && fakeUsed(0) == 0, "after the primary's release: account %llu, driver %llu", account_used(), fakeUsed(0));
    OK(cu.DevicePrimaryCtxRetain(&primary, 0));
    OK(cu.DevicePrimaryCtxRetain(&primary, 0)); // a second retain makes nothing new
    CHECK(account_used() == X, "retained again: account %llu, want %zu", account_used(), X);
    printf("contexts ok: %d of %zu bytes each fit in %zu\n", n + 1, X, Q);
    return 0;
}

// cuCtxSetLimit: heap and stack take device memory, charged and given back.
static int s_setlimit(void) {
    start();
    size_t heap0, v;
    OK(cu.CtxGetLimit(&heap0, LIMIT_HEAP));
    CHECK(account_used() == 0, "the context is charged %llu: run without FGPU_CONTEXT_OVERHEAD", account_used());
    unsigned long long base = fakeUsed(0);
    CUresult r = cu.CtxSetLimit(LIMIT_HEAP, heap0 + 2 * Q);
    CHECK(r == OOM, "a malloc heap of twice the quota: cuCtxSetLimit -> %d, want CUDA_ERROR_OUT_OF_MEMORY", r);
    OK(cu.CtxGetLimit(&v, LIMIT_HEAP));
    CHECK(v == heap0 && fakeUsed(0) == base, "refused, yet the heap is %zu and the driver holds %llu", v, fakeUsed(0));
    OK(cu.CtxSetLimit(LIMIT_HEAP, heap0 + Q / 2));
    CHECK(fakeUsed(0) == base + Q / 2 && account_used() == Q / 2, "heap + Q/2: driver %llu, account %llu", fakeUsed(0), account_used());
    CUdeviceptr a;
    CHECK(cu.MemAlloc(&a, Q / 2 + 4096) == OOM, "the heap's memory was not counted against cuMemAlloc");
    OK(cu.MemAlloc(&a, Q / 2 - (4 << 20)));
    OK(cu.MemFree(a));
    size_t stack0;
    OK(cu.CtxGetLimit(&stack0, LIMIT_STACK));
    r = cu.CtxSetLimit(LIMIT_STACK, stack0 + 1024); // 1 KiB more for 270336 threads: 264 MiB
    CHECK(r == OOM, "a stack past the quota: cuCtxSetLimit -> %d", r);
    size_t grow = 32; // 32 B x 270336 threads = 8.25 MiB
    OK(cu.CtxSetLimit(LIMIT_STACK, stack0 + grow));
    unsigned long long stack_bytes = grow * RESIDENT_THREADS;
    CHECK(fakeUsed(0) == base + Q / 2 + stack_bytes && account_used() == Q / 2 + stack_bytes,
          "stack + %zu: driver %llu, account %llu", grow, fakeUsed(0), account_used());
    OK(cu.CtxSetLimit(LIMIT_HEAP, heap0));
    CHECK(account_used() == stack_bytes && fakeUsed(0) == base + stack_bytes, "heap lowered: account %llu", account_used());
    OK(cu.CtxSetLimit(LIMIT_STACK, stack0 / 2)); // below the default: nothing more to give back
    CHECK(account_used() == 0 && fakeUsed(0) == base, "stack lowered: account %llu, driver %llu", account_used(), fakeUsed(0));
    // Limits charged to a context go back with it.
    OK(cu.CtxSetLimit(LIMIT_HEAP, heap0 + Q / 4));
    OK(cu.DevicePrimaryCtxRelease(0));
    CHECK(account_used() == 0 && fakeUsed(0) == 0, "context released: account %llu, driver %llu", account_used(), fakeUsed(0));
    printf("setlimit ok: heap and stack charged, refused past the quota, given back\n");
    return 0;
}

// The lookup functions cannot reach the unwrapped driver.
static int s_dlvsym(void) {
    start();
    CUdeviceptr p;
    Dl_info di;
    void *(*real_dlsym)(void *, const char *) = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    CHECK(real_dlsym, "dlvsym(RTLD_DEFAULT, \"dlsym\") found nothing");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))real_dlsym(libcuda, "cuMemAlloc_v2");
    CHECK(alloc, "dlsym from dlvsym found no cuMemAlloc_v2");
    CUresult r = alloc(&p, Q + 4096);
    CHECK(r == OOM, "dlvsym(\"dlsym\") -> cuMemAlloc_v2(quota + 4 KiB) -> %d: the quota was bypassed", r);
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    CHECK(libc, "libc.so.6 not loaded");
    real_dlsym = dlsym(libc, "dlsym");
    CHECK(real_dlsym && dladdr((void *)real_dlsym, &di) && strstr(di.dli_fname, "libfgpu"), "dlsym(libc, \"dlsym\") is %s",
          real_dlsym ? di.dli_fname : "null");
    alloc = (CUresult (*)(CUdeviceptr *, size_t))real_dlsym(libcuda, "cuMemAlloc_v2");
    CHECK(alloc && alloc(&p, Q + 4096) == OOM, "dlsym(libc, \"dlsym\") -> cuMemAlloc_v2 bypassed the quota");
    void *dv = dlsym(libc, "dlvsym");
    CHECK(dv && dladdr(dv, &di) && strstr(di.dli_fname, "libfgpu"), "dlsym(libc, \"dlvsym\") is %s", dv ? di.dli_fname : "null");
    alloc = (CUresult (*)(CUdeviceptr *, size_t))dlvsym(libcuda, "cuMemAlloc_v2", "GLIBC_2.2.5");
    CHECK(!alloc || alloc(&p, Q + 4096) == OOM, "dlvsym(libcuda, \"cuMemAlloc_v2\") bypassed the quota");
    // Everything else is still glibc's answer, RTLD_NEXT relative to this program.
    CHECK(dlvsym(RTLD_NEXT, "printf", "GLIBC_2.2.5") == dlsym(RTLD_DEFAULT, "printf"), "dlvsym(RTLD_NEXT, printf)");
    CHECK(dlvsym(libc, "memcpy", "GLIBC_2.14") != NULL, "dlvsym(libc, memcpy@GLIBC_2.14)");
    OK(cu.MemAlloc(&p, Q - account_used()));
    OK(cu.MemFree(p));
    printf("dlvsym ok: no lookup reaches the unwrapped cuMemAlloc_v2\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: memtest poolsync ctx|ctx2|stream|event|trim|threshold | otherdev | poolthreads | contexts | setlimit | dlvsym\n");
        return 2;
    }
    if (!strcmp(argv[1], "poolsync") && argc > 2) return s_poolsync(argv[2]);
    if (!strcmp(argv[1], "contexts")) return s_contexts();
    if (!strcmp(argv[1], "otherdev")) return s_otherdev();
    if (!strcmp(argv[1], "poolthreads")) return s_poolthreads();
    if (!strcmp(argv[1], "setlimit")) return s_setlimit();
    if (!strcmp(argv[1], "dlvsym")) return s_dlvsym();
    fprintf(stderr, "unknown scenario %s\n", argv[1]);
    return 2;
}
