/* Reaches cuMemGetInfo the way the CUDA runtime (11.3+, 12.x) does: dlopen libcuda.so.1,
 * dlsym cuGetProcAddress(_v2) from its handle, everything else through it.  argv[1]:
 *   v2      cuGetProcAddress_v2, which hands out cuGetProcAddress again (as cudart 12 does)
 *   v1      cuGetProcAddress (CUDA 11.3+ drivers), cudaVersion 11030
 *   legacy  cuGetProcAddress_v2 asked for CUDA 2.0's cuMemGetInfo (32-bit figures)
 *   dlsym   dlsym(handle, "cuMemGetInfo_v2") (as ctypes does)
 * Prints "total=<bytes> free=<bytes>", or "error <rc>". */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int (*proc_v1)(const char *, void **, int, uint64_t);
typedef int (*proc_v2)(const char *, void **, int, uint64_t, int *);
typedef int (*init_fn)(unsigned int);
typedef int (*info_fn)(size_t *, size_t *);
typedef int (*info32_fn)(unsigned int *, unsigned int *);

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "v2";
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("dlopen failed: %s\n", dlerror());
        return 2;
    }
    void *info = NULL;
    int rc;
    if (strcmp(mode, "dlsym") == 0) {
        info = dlsym(lib, "cuMemGetInfo_v2");
    } else if (strcmp(mode, "v1") == 0) {
        proc_v1 get = (proc_v1)dlsym(lib, "cuGetProcAddress");
        void *init = NULL;
        if (get == NULL || get("cuInit", &init, 11030, 0) != 0)
            return 3;
        ((init_fn)init)(0);
        rc = get("cuMemGetInfo", &info, 11030, 0);
        if (rc != 0)
            return 4;
    } else {
        proc_v2 get = (proc_v2)dlsym(lib, "cuGetProcAddress_v2");
        int status = -1;
        void *again = NULL;
        if (get == NULL || get("cuGetProcAddress", &again, 12000, 0, &status) != 0)
            return 3;
        get = (proc_v2)again;
        void *init = NULL;
        if (get("cuInit", &init, 12000, 0, &status) != 0)
            return 4;
        ((init_fn)init)(0);
        int version = strcmp(mode, "legacy") == 0 ? 2000 : 12000;
        if (get("cuMemGetInfo", &info, version, 0, &status) != 0 || status != 0)
            return 5;
        if (strcmp(mode, "legacy") == 0) {
            unsigned int free32 = 0, total32 = 0;
            rc = ((info32_fn)info)(&free32, &total32);
            if (rc != 0) {
                printf("error %d\n", rc);
                return 1;
            }
            printf("total=%u free=%u\n", total32, free32);
            return 0;
        }
    }
    if (info == NULL)
        return 6;
    size_t free_bytes = 0, total_bytes = 0;
    rc = ((info_fn)info)(&free_bytes, &total_bytes);
    if (rc != 0) {
        printf("error %d\n", rc);
        return 1;
    }
    printf("total=%zu free=%zu\n", total_bytes, free_bytes);
    return 0;
}
