#include <stdio.h>

int next_probe(void);

int main(void) {
    printf("%c\n", next_probe());
    return 0;
}
