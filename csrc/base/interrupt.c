/* The SIGINT counter in front of Python's handler (interrupt.h). */
#define _GNU_SOURCE
#include "base/interrupt.h"

#include <signal.h>
#include <stddef.h>

uint64_t mg_interrupt_count;
static struct sigaction chained; /* the handler the counting one calls next */

static void count_interrupt(int signal, siginfo_t *info, void *context)
{
    __atomic_add_fetch(&mg_interrupt_count, 1, __ATOMIC_RELAXED);
    if (chained.sa_flags & SA_SIGINFO)
        chained.sa_sigaction(signal, info, context);
    else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN)
        chained.sa_handler(signal);
}

uint64_t mg_interrupt_watch(void)
{
    struct sigaction now;
    if (sigaction(SIGINT, NULL, &now) == 0 && !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == count_interrupt) &&
        ((now.sa_flags & SA_SIGINFO) || (now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN))) {
        /* Ours is not installed while `chained` changes: no handler reads it half-written. */
        chained = now;
        struct sigaction ours = now;
        ours.sa_flags |= SA_SIGINFO;
        ours.sa_sigaction = count_interrupt;
        sigaction(SIGINT, &ours, NULL);
    }
    return __atomic_load_n(&mg_interrupt_count, __ATOMIC_RELAXED);
}
