/* cuMemGetInfo from the REAL driver, reached as the CUDA runtime reaches it (dlopen
 * libcuda.so.1, cuGetProcAddress from its handle): for tests/component/accel/
 * test_cuda_real_mps.py on a GPU machine.  Creates the primary context of device 0 and
 * prints "total=<bytes> free=<bytes>", or "error <step> <rc>". */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int (*proc_v1)(const char *, void **, int, uint64_t);
typedef int (*proc_v2)(const char *, void **, int, uint64_t, int *);

static proc_v1 get_v1;
static proc_v2 get_v2;

static void *entry(const char *name) {
    void *fn = NULL;
    int status = 0;
    if (get_v2 != NULL)
        return get_v2(name, &fn, 12000, 0, &status) == 0 ? fn : NULL;
    return get_v1(name, &fn, 11030, 0) == 0 ? fn : NULL;
}

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("error dlopen %s\n", dlerror());
        return 1;
    }
    get_v2 = (proc_v2)dlsym(lib, "cuGetProcAddress_v2");
    if (get_v2 == NULL)
        get_v1 = (proc_v1)dlsym(lib, "cuGetProcAddress");
    if (get_v2 == NULL && get_v1 == NULL) {
        printf("error cuGetProcAddress -1\n");
        return 1;
    }
    int (*init)(unsigned int) = (int (*)(unsigned int))entry("cuInit");
    int (*device_get)(int *, int) = (int (*)(int *, int))entry("cuDeviceGet");
    int (*retain)(void **, int) = (int (*)(void **, int))entry("cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = (int (*)(void *))entry("cuCtxSetCurrent");
    int (*mem_info)(size_t *, size_t *) = (int (*)(size_t *, size_t *))entry("cuMemGetInfo");
    if (!init || !device_get || !retain || !set_current || !mem_info) {
        printf("error entry -1\n");
        return 1;
    }
    int device = 0, rc;
    void *ctx = NULL;
    size_t free_bytes = 0, total_bytes = 0;
    if ((rc = init(0)) != 0) {
        printf("error cuInit %d\n", rc);
        return 1;
    }
    if ((rc = device_get(&device, 0)) != 0 || (rc = retain(&ctx, device)) != 0 ||
        (rc = set_current(ctx)) != 0) {
        printf("error context %d\n", rc);
        return 1;
    }
    if ((rc = mem_info(&free_bytes, &total_bytes)) != 0) {
        printf("error cuMemGetInfo %d\n", rc);
        return 1;
    }
    printf("total=%zu free=%zu\n", total_bytes, free_bytes);
    return 0;
}
