/* Linked with -lcuda: calls cuMemGetInfo_v2 (what cuda.h's cuMemGetInfo names) and CUDA
 * 2.0's cuMemGetInfo by symbol.  Prints "total=<bytes> free=<bytes> total32=<> free32=<>". */
#include <stddef.h>
#include <stdio.h>

int cuInit(unsigned int);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuMemGetInfo(unsigned int *, unsigned int *);

int main(void) {
    size_t free_bytes = 0, total_bytes = 0;
    unsigned int free32 = 0, total32 = 0;
    if (cuInit(0) != 0 || cuMemGetInfo_v2(&free_bytes, &total_bytes) != 0 ||
        cuMemGetInfo(&free32, &total32) != 0)
        return 1;
    printf("total=%zu free=%zu total32=%u free32=%u\n", total_bytes, free_bytes, total32, free32);
    return 0;
}
