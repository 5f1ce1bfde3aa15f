/* fgpu-probe: what a CUDA program sees inside a container of the local cluster.
 * Loads libcuda.so.1 (and libnvidia-ml.so.1) with dlopen like the CUDA runtime does, prints
 * the device, the memory total/free that cuMemGetInfo and nvmlDeviceGetMemoryInfo report,
 * then allocates in steps until the driver refuses, and prints where and with what error.
 *
 *   fgpu-probe [--step-mib N] [--max-gib N] [--hold-s N] [--work-s S --warm-s W] [--device D]
 *
 * --work-s S: after the allocations, launch kernels (40 blocks, the fake's "fake-image"
 * module) as fast as the shim lets it for S seconds and print work_share=<percent>: this
 * process's GPU time on the fake's shared timeline (fakeCudaBusyNs) over [W, S), the way
 * hook-lib/tests measure core quotas. Only with the fake driver (work=unavailable
 * otherwise). --device D: use device D (default 0).
 *
 * With the fake driver it also prints fake_device_mib and fake_managed_mib: what the fake
 * counts as this process's device memory and its managed (host-resident) memory.
 *
 * Output is "key=value" lines so tests can grep them. Exit 0 when the probe ran (even if
 * an allocation failed: that is the point), 2 when libcuda could not be used at all.
 * Built dynamically (glibc) by hack/images.sh so /etc/ld.so.preload (libfgpu.so) applies. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

#define MIB (1024ULL * 1024ULL)
#define LOAD(h, var, name)                                        \
  do {                                                            \
    *(void **)(&var) = dlsym(h, name);                            \
    if (!var) { printf("error=missing symbol %s\n", name); }      \
  } while (0)

static const char *errname(void *cuda, CUresult r) {
  CUresult (*getname)(CUresult, const char **) = NULL;
  *(void **)(&getname) = dlsym(cuda, "cuGetErrorName");
  const char *s = NULL;
  if (getname && getname(r, &s) == 0 && s) return s;
  return r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_?";
}

int main(int argc, char **argv) {
  unsigned long long step_mib = 1024, max_gib = 256;
  int hold_s = 0, device = 0;
  double work_s = 0, warm_s = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--step-mib")) step_mib = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--max-gib")) max_gib = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--hold-s")) hold_s = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--work-s")) work_s = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--warm-s")) warm_s = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--device")) device = atoi(argv[i + 1]);
  }
  printf("uid=%d pid=%d\n", (int)getuid(), (int)getpid());
  const char *preload = getenv("LD_PRELOAD");
  FILE *pl = fopen("/etc/ld.so.preload", "r");
  char plbuf[256] = "";
  if (pl) { if (!fgets(plbuf, sizeof plbuf, pl)) plbuf[0] = 0; fclose(pl); plbuf[strcspn(plbuf, "\n")] = 0; }
  printf("ld_so_preload=%s\n", plbuf[0] ? plbuf : "(none)");
  printf("ld_preload_env=%s\n", preload ? preload : "(none)");

  void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (nvml) {
    int (*init)(void) = NULL, (*byidx)(unsigned, void **) = NULL, (*meminfo)(void *, nvmlMemory_t *) = NULL;
    LOAD(nvml, init, "nvmlInit_v2");
    LOAD(nvml, byidx, "nvmlDeviceGetHandleByIndex_v2");
    LOAD(nvml, meminfo, "nvmlDeviceGetMemoryInfo");
    void *dev = NULL;
    nvmlMemory_t m = {0, 0, 0};
    if (init && byidx && meminfo && init() == 0 && byidx(0, &dev) == 0 && meminfo(dev, &m) == 0)
      printf("nvml_total_mib=%llu\nnvml_used_mib=%llu\n", m.total / MIB, m.used / MIB);
    else
      printf("nvml=error\n");
  } else {
    printf("nvml=unavailable (%s)\n", dlerror());
  }

  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cuda) { printf("cuda=unavailable (%s)\n", dlerror()); return 2; }
  CUresult (*cuInit)(unsigned) = NULL, (*cuDeviceGet)(CUdevice *, int) = NULL,
      (*cuDeviceGetName)(char *, int, CUdevice) = NULL,
      (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = NULL,
      (*cuMemGetInfo)(size_t *, size_t *) = NULL, (*cuMemAlloc)(CUdeviceptr *, size_t) = NULL;
  LOAD(cuda, cuInit, "cuInit");
  LOAD(cuda, cuDeviceGet, "cuDeviceGet");
  LOAD(cuda, cuDeviceGetName, "cuDeviceGetName");
  LOAD(cuda, cuCtxCreate, "cuCtxCreate_v2");
  LOAD(cuda, cuMemGetInfo, "cuMemGetInfo_v2");
  LOAD(cuda, cuMemAlloc, "cuMemAlloc_v2");
  if (!cuInit || !cuDeviceGet || !cuCtxCreate || !cuMemGetInfo || !cuMemAlloc) return 2;
  CUresult r;
  CUdevice dev = 0;
  CUcontext ctx = NULL;
  if ((r = cuInit(0)) != 0) { printf("cuInit=%d %s\n", r, errname(cuda, r)); return 2; }
  if ((r = cuDeviceGet(&dev, device)) != 0) { printf("cuDeviceGet=%d %s\n", r, errname(cuda, r)); return 2; }
  char name[128] = "?";
  if (cuDeviceGetName) cuDeviceGetName(name, sizeof name, dev);
  printf("device=%s\n", name);
  if ((r = cuCtxCreate(&ctx, 0, dev)) != 0) { printf("cuCtxCreate=%d %s\n", r, errname(cuda, r)); return 2; }
  size_t fr = 0, tot = 0;
  if ((r = cuMemGetInfo(&fr, &tot)) != 0) { printf("cuMemGetInfo=%d %s\n", r, errname(cuda, r)); return 2; }
  printf("cuda_total_mib=%llu\ncuda_free_mib=%llu\n", (unsigned long long)tot / MIB, (unsigned long long)fr / MIB);
  unsigned long long done = 0;
  for (;;) {
    if (done + step_mib > max_gib * 1024) { printf("alloc_stopped_at_max_mib=%llu\n", done); break; }
    CUdeviceptr p = 0;
    r = cuMemAlloc(&p, (size_t)(step_mib * MIB));
    if (r != 0) {
      printf("allocated_mib=%llu\nnext_alloc_mib=%llu\nnext_alloc_result=%s (%d)\n", done, step_mib, errname(cuda, r), r);
      break;
    }
    done += step_mib;
  }
  {
    /* The fake driver's own account of this process (research tier: managed memory is
     * host-resident there, not device memory). */
    unsigned long long (*used)(int) = NULL, (*managed)(int) = NULL;
    *(void **)(&used) = dlsym(cuda, "fakeCudaUsedBytes");
    *(void **)(&managed) = dlsym(cuda, "fakeCudaManagedBytes");
    if (used && managed)
      printf("fake_device_mib=%llu\nfake_managed_mib=%llu\n", used(device) / MIB, managed(device) / MIB);
  }
  fflush(stdout);
  if (work_s > 0) {
    CUresult (*load)(void **, const void *) = NULL, (*getfn)(void **, void *, const char *) = NULL;
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void *, void **, void **) = NULL;
    unsigned long long (*busy)(int, int) = NULL;
    *(void **)(&load) = dlsym(cuda, "cuModuleLoadData");
    *(void **)(&getfn) = dlsym(cuda, "cuModuleGetFunction");
    *(void **)(&launch) = dlsym(cuda, "cuLaunchKernel");
    *(void **)(&busy) = dlsym(cuda, "fakeCudaBusyNs");
    void *mod = NULL, *fn = NULL;
    if (!load || !getfn || !launch || !busy || load(&mod, "fake-image") != 0 || getfn(&fn, mod, "kernel") != 0) {
      printf("work=unavailable (not the fake driver)\n");
    } else {
      double t0 = now_s(), tw = 0;
      unsigned long long b0 = 0;
      long n = 0;
      int pid = (int)getpid();
      for (;; n++) {
        double t = now_s();
        if (tw == 0 && t - t0 >= warm_s) { tw = t; b0 = busy(device, pid); }
        if (t - t0 >= work_s) break;
        if ((r = launch(fn, 40, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)) != 0) {
          printf("work_launch_result=%s (%d)\n", errname(cuda, r), r);
          break;
        }
      }
      double t1 = now_s();
      unsigned long long b1 = busy(device, pid);
      printf("work_launches=%ld\nwork_share=%.2f\n", n, tw > 0 ? (double)(b1 - b0) / 1e9 / (t1 - tw) * 100 : -1.0);
    }
    fflush(stdout);
  }
  if (hold_s > 0) sleep((unsigned)hold_s);
  return 0;
}
