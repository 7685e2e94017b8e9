/* Ctrl-C while native code runs without the GIL (a CPU-backend launch, a
 * host program's function): Python's SIGINT handler only trips a flag that
 * the interpreter reads once it runs again, so a handler in front of it
 * also counts the signal, for that code to poll at its loops and barriers
 * and stop. Python's handler still runs: KeyboardInterrupt is raised as
 * usual once the GIL is back (PyErr_CheckSignals). */
#ifndef MG_BASE_INTERRUPT_H
#define MG_BASE_INTERRUPT_H

#include <stdint.h>

/* With the GIL: puts the counting handler in front of the one that handles
 * SIGINT now (Python's, or the user's through the signal module; nothing
 * for SIG_DFL or SIG_IGN) unless it is there already, and returns the count
 * of SIGINTs so far, for mg_interrupted. */
uint64_t mg_interrupt_watch(void);

/* Whether a SIGINT came since mg_interrupt_watch returned `since`; any thread, no GIL. */
static inline int mg_interrupted(uint64_t since)
{
    extern uint64_t mg_interrupt_count;
    return __atomic_load_n(&mg_interrupt_count, __ATOMIC_RELAXED) != since;
}

#endif
