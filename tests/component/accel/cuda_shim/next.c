/* RTLD_NEXT seen from a library: built twice, as libnext_a.so (-DWHICH='a', with
 * next_probe) and libnext_b.so (-DWHICH='b'); the program, linked with both in that
 * order, prints what next_probe finds after liba: "b" unless a dlsym in between
 * (an interposer) took the lookup for its own. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

int probe(void) { return WHICH; }

#if WHICH == 'a'
int next_probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    return next != NULL ? next() : '?';
}
#endif
