/* A fake libcuda.so.1 for the interposer's tests: fixed physical figures (80 GiB total,
 * 79 GiB free on every device), device ordinal from FAKE_CUDA_DEVICE (default 0), no
 * current context when FAKE_CUDA_NO_CONTEXT is set.  Device n's uuid is
 * GPU-0000000n-1111-2222-3333-444444444444.  Built with -DNO_UUID_V2 it lacks
 * cuDeviceGetUuid_v2 (older drivers). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct { unsigned char bytes[16]; } CUuuid;

#define GIB (1ULL << 30)

CUresult cuInit(unsigned int flags) { (void)flags; return 0; }

CUresult cuDeviceGet(CUdevice *device, int ordinal) { *device = ordinal; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice device) {
    static int fake_context;
    (void)device;
    *ctx = &fake_context;
    return 0;
}
CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }

CUresult cuCtxGetDevice(CUdevice *device) {
    if (getenv("FAKE_CUDA_NO_CONTEXT") != NULL)
        return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    const char *n = getenv("FAKE_CUDA_DEVICE");
    *device = n != NULL ? atoi(n) : 0;
    return 0;
}

static CUresult uuid_of(CUuuid *uuid, CUdevice device) {
    static const unsigned char tail[12] = {0x11, 0x11, 0x22, 0x22, 0x33, 0x33,
                                           0x44, 0x44, 0x44, 0x44, 0x44, 0x44};
    memset(uuid->bytes, 0, 4);
    uuid->bytes[3] = (unsigned char)device;
    memcpy(uuid->bytes + 4, tail, 12);
    return 0;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) { return uuid_of(uuid, device); }
#ifndef NO_UUID_V2
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) { return uuid_of(uuid, device); }
#endif

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = 79 * GIB;
    *total_bytes = 80 * GIB;
    return 0;
}

/* CUDA 2.0's signature: 32-bit figures (3 GiB total, 2 GiB free). */
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    *free_bytes = 2u << 30;
    *total_bytes = 3u << 30;
    return 0;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                             int *status);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    (void)flags;
    *pfn = NULL;
    if (strcmp(symbol, "cuInit") == 0)
        *pfn = (void *)cuInit;
    else if (strcmp(symbol, "cuDeviceGet") == 0)
        *pfn = (void *)cuDeviceGet;
    else if (strcmp(symbol, "cuDevicePrimaryCtxRetain") == 0)
        *pfn = (void *)cuDevicePrimaryCtxRetain;
    else if (strcmp(symbol, "cuCtxSetCurrent") == 0)
        *pfn = (void *)cuCtxSetCurrent;
    else if (strcmp(symbol, "cuCtxGetDevice") == 0)
        *pfn = (void *)cuCtxGetDevice;
    else if (strcmp(symbol, "cuMemGetInfo") == 0)
        *pfn = version >= 3020 ? (void *)cuMemGetInfo_v2 : (void *)cuMemGetInfo;
    else if (strcmp(symbol, "cuDeviceGetUuid") == 0)
#ifndef NO_UUID_V2
        *pfn = version >= 11040 ? (void *)cuDeviceGetUuid_v2 : (void *)cuDeviceGetUuid;
#else
        *pfn = (void *)cuDeviceGetUuid;
#endif
    else if (strcmp(symbol, "cuGetProcAddress") == 0)
        *pfn = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    return *pfn != NULL ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                             int *status) {
    CUresult rc = cuGetProcAddress(symbol, pfn, version, flags);
    if (status != NULL)
        *status = rc == 0 ? 0 : 1;
    return rc;
}
