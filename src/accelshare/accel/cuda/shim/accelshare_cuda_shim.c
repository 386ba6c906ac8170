/*
 * accelshare's CUDA memory interposer (LD_PRELOAD) for kernels holding shares of a GPU.
 *
 * Under MPS, cudaMemGetInfo / cuMemGetInfo reports at most the client's pinned memory
 * limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) as *free*, but the physical GPU's memory as
 * *total*.  This library makes the driver's cuMemGetInfo report
 *
 *     total = min(total, limit)      free = min(free, limit)
 *
 * for the device of the current context, the limit read from the same variable MPS
 * reads ("<GPU uuid>=<N>M,..." or "<ordinal>=<N>G,...", or a bare "<N>M" for every
 * device; units K, M, G, T with an optional B; case does not matter).  A device without
 * a limit, a malformed variable or any failed lookup: the driver's answer, unchanged.
 *
 * How calls reach it:
 *   - programs linked with -lcuda call cuMemGetInfo_v2 / cuMemGetInfo / cuGetProcAddress
 *     by symbol: this library exports them (it is preloaded, so it comes first);
 *   - the CUDA runtime (11.3+, 12.x) dlopen()s libcuda.so.1, dlsym()s cuGetProcAddress
 *     (_v2) from that handle and gets every entry point through it.  dlsym(handle, ...)
 *     is not interposed by the dynamic linker, so this library defines dlsym itself:
 *     lookups of cuGetProcAddress(_v2) and cuMemGetInfo(_v2) in a library's handle
 *     return the wrappers below (the real pointers are remembered), every other lookup is
 *     the real dlsym's, reached by a sibling call so that it sees its caller's return
 *     address (RTLD_NEXT keeps its meaning);
 *   - the cuGetProcAddress wrappers hand out the cuMemGetInfo wrapper (and themselves,
 *     for "cuGetProcAddress") instead of the driver's functions.
 *
 * No allocation, lock or system call on the path of a cuMemGetInfo call once the
 * driver's functions are known; the limits are parsed once, at the first call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

/* Bind the few libc/libdl symbols whose default version is newer than the oldest glibc a
 * container may hold (dlopen/dlvsym moved into libc in 2.34) to their first version, so
 * that the library loads in images with an older glibc than the host's. */
#if defined(__x86_64__)
#define SHIM_GLIBC_BASE "GLIBC_2.2.5"
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
#elif defined(__aarch64__)
#define SHIM_GLIBC_BASE "GLIBC_2.17"
__asm__(".symver dlvsym,dlvsym@GLIBC_2.17");
__asm__(".symver dlopen,dlopen@GLIBC_2.17");
#else
#define SHIM_GLIBC_BASE NULL
#endif

#if defined(__has_attribute)
#if __has_attribute(musttail)
#define SHIM_TAIL __attribute__((musttail))
#endif
#endif
#ifndef SHIM_TAIL
#define SHIM_TAIL /* -O2 makes it a sibling call (checked by the tests) */
#endif

typedef int CUresult;
typedef int CUdevice;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NOT_FOUND = 500 };

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*mem_info_v2_fn)(size_t *, size_t *);
typedef CUresult (*mem_info_v1_fn)(unsigned int *, unsigned int *);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, uint64_t);
typedef CUresult (*proc_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*ctx_device_fn)(CUdevice *);
typedef CUresult (*device_uuid_fn)(CUuuid *, CUdevice);

/* The real functions (atomically published; any thread may fill one, with the same value). */
static dlsym_fn real_dlsym;
static mem_info_v2_fn real_mem_info_v2;
static mem_info_v1_fn real_mem_info_v1;
static proc_v1_fn real_proc_v1;
static proc_v2_fn real_proc_v2;
static ctx_device_fn real_ctx_device;
static device_uuid_fn real_uuid_v2;
static device_uuid_fn real_uuid_v1;
static int helpers_done;

#define LOAD(p) __atomic_load_n(&(p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELEASE)

static dlsym_fn get_real_dlsym(void) {
    dlsym_fn fn = LOAD(real_dlsym);
    if (fn != NULL)
        return fn;
    fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (fn == NULL && SHIM_GLIBC_BASE != NULL)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", SHIM_GLIBC_BASE);
    if (fn != NULL)
        STORE(real_dlsym, fn);
    return fn;
}

/* A driver function by name: in libcuda.so.1 when it is loaded (its handle also keeps it
 * loaded while the pointers are held), else the next definition after this library. */
static void *driver_symbol(const char *name) {
    dlsym_fn fn = get_real_dlsym();
    if (fn == NULL)
        return NULL;
    void *handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void *found = handle != NULL ? fn(handle, name) : NULL;
    return found != NULL ? found : fn(RTLD_NEXT, name);
}

static void resolve_helpers(void) {
    if (LOAD(helpers_done))
        return;
    if (LOAD(real_ctx_device) == NULL)
        STORE(real_ctx_device, (ctx_device_fn)driver_symbol("cuCtxGetDevice"));
    if (LOAD(real_uuid_v2) == NULL)
        STORE(real_uuid_v2, (device_uuid_fn)driver_symbol("cuDeviceGetUuid_v2"));
    if (LOAD(real_uuid_v1) == NULL)
        STORE(real_uuid_v1, (device_uuid_fn)driver_symbol("cuDeviceGetUuid"));
    STORE(helpers_done, 1); /* libcuda is loaded (its cuMemGetInfo answered): once */
}

/* -- the limits ------------------------------------------------------------------------ */

#define MAX_LIMITS 64

struct limit {
    int by_uuid; /* 1: uuid, 0: device ordinal */
    unsigned char uuid[16];
    int ordinal;
    unsigned long long bytes;
};

struct limits {
    int valid; /* 0: no variable or a malformed one (nothing changes) */
    int count;
    int has_default;
    int needs_uuid;
    unsigned long long default_bytes;
    struct limit entries[MAX_LIMITS];
};

static struct limits parsed_limits;
static int limits_state; /* 0 unparsed, 1 being parsed, 2 parsed */

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (the prefix optional, as nvidia-smi and NVML
 * write it), in [s, end): 1 and the 16 bytes, or 0. */
static int parse_uuid(const char *s, const char *end, unsigned char out[16]) {
    if (end - s >= 4 && (s[0] == 'G' || s[0] == 'g') && (s[1] == 'P' || s[1] == 'p') &&
        (s[2] == 'U' || s[2] == 'u') && s[3] == '-')
        s += 4;
    static const int dashes[] = {8, 12, 16, 20};
    int digits = 0, dash = 0;
    for (; s < end; s++) {
        if (*s == '-') {
            if (dash >= 4 || digits != dashes[dash])
                return 0;
            dash++;
            continue;
        }
        int v = hex_value(*s);
        if (v < 0 || digits >= 32)
            return 0;
        if (digits % 2 == 0)
            out[digits / 2] = (unsigned char)(v << 4);
        else
            out[digits / 2] |= (unsigned char)v;
        digits++;
    }
    return digits == 32 && dash == 4;
}

/* "<N>" with a unit K/M/G/T (optional B) in [s, end): 1 and the bytes, or 0. */
static int parse_size(const char *s, const char *end, unsigned long long *out) {
    unsigned long long n = 0;
    int digits = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (n > (~0ULL - 9) / 10)
            return 0;
        n = n * 10 + (unsigned long long)(*s - '0');
        s++;
        digits++;
    }
    if (digits == 0 || s == end)
        return 0;
    int shift;
    switch (*s) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    default: return 0;
    }
    s++;
    if (s < end && (*s == 'B' || *s == 'b'))
        s++;
    if (s != end || n > (~0ULL >> shift))
        return 0;
    *out = n << shift;
    return 1;
}

static int parse_ordinal(const char *s, const char *end, int *out) {
    int n = 0;
    if (s == end || end - s > 6)
        return 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        n = n * 10 + (*s - '0');
    }
    *out = n;
    return 1;
}

static void parse_limits(struct limits *out) {
    memset(out, 0, sizeof *out);
    const char *text = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    if (text == NULL)
        return;
    const char *s = text;
    while (*s != '\0') {
        const char *end = s;
        while (*end != '\0' && *end != ',')
            end++;
        while (s < end && *s == ' ')
            s++;
        const char *stop = end;
        while (stop > s && stop[-1] == ' ')
            stop--;
        if (s == stop)
            return; /* an empty entry: malformed */
        const char *eq = s;
        while (eq < stop && *eq != '=')
            eq++;
        unsigned long long bytes;
        if (eq == stop) {
            if (out->has_default || !parse_size(s, stop, &bytes))
                return;
            out->has_default = 1;
            out->default_bytes = bytes;
        } else {
            if (out->count >= MAX_LIMITS || !parse_size(eq + 1, stop, &bytes))
                return;
            struct limit *entry = &out->entries[out->count];
            if (parse_ordinal(s, eq, &entry->ordinal)) {
                entry->by_uuid = 0;
            } else if (parse_uuid(s, eq, entry->uuid)) {
                entry->by_uuid = 1;
                out->needs_uuid = 1;
            } else {
                return;
            }
            entry->bytes = bytes;
            out->count++;
        }
        s = *end == ',' ? end + 1 : end;
        if (*end == ',' && *s == '\0')
            return; /* a trailing comma: malformed */
    }
    out->valid = out->count > 0 || out->has_default;
}

/* The parsed limits: the shared copy once parsed; while another thread parses it, this
 * thread's own copy in `local`. */
static const struct limits *get_limits(struct limits *local) {
    int state = LOAD(limits_state);
    if (state == 2)
        return &parsed_limits;
    int expected = 0;
    if (state == 0 && __atomic_compare_exchange_n(&limits_state, &expected, 1, 0,
                                                  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        parse_limits(&parsed_limits);
        STORE(limits_state, 2);
        return &parsed_limits;
    }
    parse_limits(local);
    return local;
}

/* The limit of the current context's device: 1 and the bytes, or 0 (no limit, or it
 * cannot be told). */
static int current_limit(unsigned long long *bytes) {
    struct limits local;
    const struct limits *limits = get_limits(&local);
    if (!limits->valid)
        return 0;
    if (limits->count > 0) {
        resolve_helpers();
        ctx_device_fn ctx_device = LOAD(real_ctx_device);
        CUdevice device = 0;
        if (ctx_device == NULL || ctx_device(&device) != CUDA_SUCCESS)
            return 0;
        CUuuid uuid;
        int have_uuid = 0;
        if (limits->needs_uuid) {
            device_uuid_fn get_uuid = LOAD(real_uuid_v2);
            if (get_uuid == NULL)
                get_uuid = LOAD(real_uuid_v1);
            have_uuid = get_uuid != NULL && get_uuid(&uuid, device) == CUDA_SUCCESS;
        }
        for (int i = 0; i < limits->count; i++) {
            const struct limit *entry = &limits->entries[i];
            if (entry->by_uuid ? have_uuid && memcmp(entry->uuid, uuid.bytes, 16) == 0
                               : entry->ordinal == device) {
                *bytes = entry->bytes;
                return 1;
            }
        }
        if (limits->needs_uuid && !have_uuid)
            return 0; /* it may have been one of the named ones: leave it */
    }
    if (limits->has_default) {
        *bytes = limits->default_bytes;
        return 1;
    }
    return 0;
}

/* -- the wrappers ---------------------------------------------------------------------- */

static CUresult shim_mem_info_v2(size_t *free_bytes, size_t *total_bytes) {
    mem_info_v2_fn real = LOAD(real_mem_info_v2);
    if (real == NULL) {
        real = (mem_info_v2_fn)driver_symbol("cuMemGetInfo_v2");
        if (real == NULL)
            return CUDA_ERROR_NOT_INITIALIZED;
        STORE(real_mem_info_v2, real);
    }
    CUresult rc = real(free_bytes, total_bytes);
    unsigned long long limit;
    if (rc != CUDA_SUCCESS || free_bytes == NULL || total_bytes == NULL ||
        !current_limit(&limit))
        return rc;
    if (*total_bytes > limit)
        *total_bytes = (size_t)limit;
    if (*free_bytes > limit)
        *free_bytes = (size_t)limit;
    return rc;
}

/* The CUDA 2.0 signature, still exported by the driver as "cuMemGetInfo". */
static CUresult shim_mem_info_v1(unsigned int *free_bytes, unsigned int *total_bytes) {
    mem_info_v1_fn real = LOAD(real_mem_info_v1);
    if (real == NULL) {
        real = (mem_info_v1_fn)driver_symbol("cuMemGetInfo");
        if (real == NULL)
            return CUDA_ERROR_NOT_INITIALIZED;
        STORE(real_mem_info_v1, real);
    }
    CUresult rc = real(free_bytes, total_bytes);
    unsigned long long limit;
    if (rc != CUDA_SUCCESS || free_bytes == NULL || total_bytes == NULL ||
        !current_limit(&limit))
        return rc;
    if (*total_bytes > limit)
        *total_bytes = (unsigned int)limit;
    if (*free_bytes > limit)
        *free_bytes = (unsigned int)limit;
    return rc;
}

static CUresult shim_proc_v1(const char *symbol, void **pfn, int version, uint64_t flags);
static CUresult shim_proc_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                             int *status);

SHIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
SHIM_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes);
SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      uint64_t flags);
SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         uint64_t flags, int *status);

/* One of this library's functions (a driver that calls its own exported functions by
 * symbol reaches ours: they must never be taken for the driver's). */
static int is_ours(const void *fn) {
    return fn == (void *)shim_mem_info_v2 || fn == (void *)shim_mem_info_v1 ||
           fn == (void *)shim_proc_v1 || fn == (void *)shim_proc_v2 ||
           fn == (void *)cuMemGetInfo_v2 || fn == (void *)cuMemGetInfo ||
           fn == (void *)cuGetProcAddress || fn == (void *)cuGetProcAddress_v2;
}

/* What to hand out for `name` found at `found` (the driver's function): a wrapper, with
 * the driver's function remembered, or `found` itself.  `version` is the CUDA version
 * asked for (cuGetProcAddress; 0 for dlsym, which names the variant itself). */
static void *substitute(const char *name, void *found, int version, int by_dlsym) {
    if (found == NULL || name == NULL)
        return found;
    if (is_ours(found))
        return found;
    if (strncmp(name, "cu", 2) != 0)
        return found;
    if (strcmp(name, "cuMemGetInfo_v2") == 0 ||
        (!by_dlsym && strcmp(name, "cuMemGetInfo") == 0 && version >= 3020)) {
        STORE(real_mem_info_v2, (mem_info_v2_fn)found);
        return (void *)shim_mem_info_v2;
    }
    if (strcmp(name, "cuMemGetInfo") == 0) {
        STORE(real_mem_info_v1, (mem_info_v1_fn)found);
        return (void *)shim_mem_info_v1;
    }
    if (strcmp(name, "cuGetProcAddress_v2") == 0 ||
        (!by_dlsym && strcmp(name, "cuGetProcAddress") == 0 && version >= 12000)) {
        STORE(real_proc_v2, (proc_v2_fn)found);
        return (void *)shim_proc_v2;
    }
    if (strcmp(name, "cuGetProcAddress") == 0) {
        STORE(real_proc_v1, (proc_v1_fn)found);
        return (void *)shim_proc_v1;
    }
    return found;
}

static CUresult shim_proc_v1(const char *symbol, void **pfn, int version, uint64_t flags) {
    proc_v1_fn real = LOAD(real_proc_v1);
    if (real == NULL) {
        real = (proc_v1_fn)driver_symbol("cuGetProcAddress");
        if (real == NULL)
            return CUDA_ERROR_NOT_INITIALIZED;
        STORE(real_proc_v1, real);
    }
    CUresult rc = real(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && pfn != NULL)
        *pfn = substitute(symbol, *pfn, version, 0);
    return rc;
}

static CUresult shim_proc_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                             int *status) {
    proc_v2_fn real = LOAD(real_proc_v2);
    if (real == NULL) {
        real = (proc_v2_fn)driver_symbol("cuGetProcAddress_v2");
        if (real == NULL)
            return CUDA_ERROR_NOT_INITIALIZED;
        STORE(real_proc_v2, real);
    }
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && pfn != NULL)
        *pfn = substitute(symbol, *pfn, version, 0);
    return rc;
}

/* -- the exported symbols --------------------------------------------------------------- */

SHIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    return shim_mem_info_v2(free_bytes, total_bytes);
}

SHIM_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    return shim_mem_info_v1(free_bytes, total_bytes);
}

SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      uint64_t flags) {
    return shim_proc_v1(symbol, pfn, version, flags);
}

SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         uint64_t flags, int *status) {
    return shim_proc_v2(symbol, pfn, version, flags, status);
}

static int watched(const char *name) {
    return name != NULL && name[0] == 'c' && name[1] == 'u' &&
           (strcmp(name, "cuGetProcAddress") == 0 || strcmp(name, "cuGetProcAddress_v2") == 0 ||
            strcmp(name, "cuMemGetInfo") == 0 || strcmp(name, "cuMemGetInfo_v2") == 0);
}

SHIM_EXPORT void *dlsym(void *handle, const char *name) {
    dlsym_fn real = get_real_dlsym();
    if (real == NULL)
        return NULL;
    if (handle != RTLD_NEXT && handle != RTLD_DEFAULT && watched(name))
        return substitute(name, real(handle, name), 0, 1);
    /* RTLD_NEXT / RTLD_DEFAULT depend on the caller: a sibling call keeps ours. */
    SHIM_TAIL return real(handle, name);
}
