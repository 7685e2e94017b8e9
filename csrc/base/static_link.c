/* What Debian's MLIR and LLVM archives expect from elsewhere, for the static
 * build only (setup.py leaves this file out of the shared one). Nothing here
 * is exported: the module's only dynamic symbol is PyInit__mlirgpu. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MG_HIDDEN __attribute__((visibility("hidden")))

/* LLVM's Support library calls arc4random, which glibc has only since 2.36;
 * the wheels promise 2.35. getrandom is 2.25. LLVM takes these numbers for
 * seeds and unique temporary file names, never for keys. */
MG_HIDDEN uint32_t arc4random(void)
{
    uint32_t value;
    ssize_t n;
    do
        n = getrandom(&value, sizeof value, 0);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof value)
        return value;
    /* No getrandom (an old kernel or a sandbox that forbids it): the clock
     * and the process id still differ between calls and processes. */
    static uint32_t counter;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint32_t)now.tv_nsec ^ ((uint32_t)now.tv_sec << 20) ^ ((uint32_t)getpid() << 8) ^ ++counter;
}

/* setup.py points the initialisers of every LLVM backend left out of the
 * build here (--defsym): code that initialises all targets then finds NVPTX
 * and X86 registered, and no other. */
MG_HIDDEN void mg_static_backend_absent(void)
{
}
