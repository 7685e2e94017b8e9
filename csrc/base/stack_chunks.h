/* CPython keeps each thread's Python frames in chunks of 16 KiB, mapped
 * (through the interpreter's arena allocator) for a call that does not fit
 * in the chunk in use and unmapped as soon as that call returns. A loop
 * whose calls cross a chunk's end therefore maps and unmaps a chunk on each
 * call: tracing a large kernel makes millions of such calls, and at some
 * depths of the caller's stack (under pytest, in a notebook) spent most of
 * its time in mmap, munmap and zeroing the new pages. */
#ifndef MG_BASE_STACK_CHUNKS_H
#define MG_BASE_STACK_CHUNKS_H

/* Once per process, with the GIL: wraps the arena allocator so that a few
 * freed frame chunks are kept for the next ones instead of being unmapped.
 * Every other block goes to the allocator that was there. */
void mg_stack_chunks_keep(void);

#endif
