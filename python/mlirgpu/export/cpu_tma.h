/* Hopper's TMA copies and mbarriers on the CPU, in plain C: the tensor map a
 * CPU build's copies read, an mbarrier's phases, and a box copied with the
 * hardware's swizzle. mlirgpu's CPU backend (csrc/cpu) and the libraries
 * that mlirgpu.export writes (runtime.c) both run CPU builds with it, each
 * with its own shared memory and faults (mg_hopper_hooks). */
#ifndef MG_CPU_TMA_H
#define MG_CPU_TMA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A tensor map for the CPU: what cuTensorMapEncodeTiled would encode, in the
 * 128 bytes a kernel takes. Sizes innermost first, as the driver takes them. */
#define MG_CPU_TENSOR_MAP_MAGIC 0x70616d7570636d67ull /* "mgcpumap" */
typedef struct {
    uint64_t magic;
    uint64_t address;
    uint64_t dims[5];
    uint64_t strides[5];          /* bytes; strides[0] is the element size */
    uint16_t box[5];
    uint8_t element_strides[5];
    uint8_t rank, element_size, swizzle_bytes, oob_nan, data_type;
    uint8_t readonly;             /* the array may not be written: TMA stores are refused */
} mg_cpu_tensor_map;

/* The element size of a CUtensorMapDataType, 0 for another. */
static inline int mg_cpu_tensor_map_element_size(int data_type)
{
    static const int sizes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2};
    return data_type >= 0 && data_type < (int)(sizeof sizes / sizeof *sizes) ? sizes[data_type] : 0;
}

/* The map of cuTensorMapEncodeTiled's arguments (`strides`: bytes, of dimensions 1 on, as the
 * driver takes them; `swizzle`: a CUtensorMapSwizzle), which the caller has checked. */
static inline mg_cpu_tensor_map mg_cpu_tensor_map_make(int data_type, int rank, uint64_t address,
                                                       const uint64_t *dims, const uint64_t *strides,
                                                       const uint32_t *box, const uint32_t *element_strides,
                                                       int swizzle, int oob_fill, int readonly)
{
    int element_size = mg_cpu_tensor_map_element_size(data_type);
    mg_cpu_tensor_map m = {.magic = MG_CPU_TENSOR_MAP_MAGIC, .address = address, .rank = (uint8_t)rank,
                           .element_size = (uint8_t)element_size,
                           .swizzle_bytes = (uint8_t)(swizzle ? 16 << swizzle : 0), .oob_nan = oob_fill != 0,
                           .data_type = (uint8_t)data_type, .readonly = readonly != 0};
    for (int i = 0; i < rank; i++) {
        m.dims[i] = dims[i];
        m.strides[i] = i == 0 ? (uint64_t)element_size : strides[i - 1];
        m.box[i] = (uint16_t)box[i];
        m.element_strides[i] = (uint8_t)element_strides[i];
    }
    return m;
}

/* What a runtime gives the copies: its faults (which do not return), byte `offset` of the
 * running block's shared memory (`bytes` of it, else a fault of `what`), and, where it checks
 * reads of shared memory never written, the bytes a copy wrote (NULL: it does not). */
typedef struct {
    void (*fault)(int32_t line, const char *format, ...) __attribute__((format(printf, 2, 3)));
    char *(*shared_at)(size_t offset, size_t bytes, const char *what, int32_t line);
    void (*written)(char *at, size_t bytes, int32_t line);
} mg_hopper_hooks;

/* The hardware's swizzle of a shared-memory offset (the block's shared memory is 1024-byte
 * aligned, so its bits are the address's): the 16-byte unit (bits 4-6) XOR the 128-byte row's
 * index (bits 7-9), over as many bits as the mode has (128B: 3, 64B: 2, 32B: 1; 0: none). */
static inline size_t mg_hopper_swizzled(size_t offset, int swizzle_bytes)
{
    size_t mask = swizzle_bytes ? (size_t)(swizzle_bytes / 16 - 1) << 4 : 0;
    return offset ^ (offset >> 3 & mask);
}

/* An mbarrier's 64 bits, as the PTX ISA's mbarrier object holds its state: the arrivals a phase
 * expects (bits 0-20), those still pending (21-41), the transaction count (42-62, two's
 * complement) and the current phase's parity (63). */
#define MG_HOPPER_MBARRIER_FIELD 0x1fffffull

static inline uint64_t *mg_hopper_mbarrier_at(const mg_hopper_hooks *h, size_t offset, const char *what, int32_t line)
{
    if (offset % 8)
        h->fault(line, "%s: an mbarrier is 8-byte aligned, not at byte %zu of shared memory", what, offset);
    return (uint64_t *)h->shared_at(offset, 8, what, line);
}

static inline void mg_hopper_mbarrier_init(const mg_hopper_hooks *h, uint64_t *m, int32_t count, int32_t line)
{
    if (count < 1 || (uint64_t)count >= (1 << 20))
        h->fault(line, "mbarrier.init: the arrival count is 1 to 2**20 - 1, not %d", (int)count);
    *m = (uint64_t)count | (uint64_t)count << 21;
}

/* `arrivals` (0 or 1) and `bytes` of transactions (negative: completed) on the barrier's phase,
 * which completes once nothing is pending, the next expecting as many arrivals. Returns whether
 * the phase completed. */
static inline int mg_hopper_mbarrier_update(const mg_hopper_hooks *h, uint64_t *at, int arrivals, int64_t bytes,
                                         int32_t line)
{
    uint64_t bits = *at, phase = bits >> 63;
    int64_t expected = (int64_t)(bits & MG_HOPPER_MBARRIER_FIELD);
    int64_t pending = (int64_t)(bits >> 21 & MG_HOPPER_MBARRIER_FIELD);
    int64_t tx = (int64_t)(bits >> 42 & MG_HOPPER_MBARRIER_FIELD);
    tx = (tx & 0x100000 ? tx - 0x200000 : tx) + bytes;
    if (arrivals && expected == 0)
        h->fault(line, "mbarrier.arrive on a barrier that was never initialised (init)");
    if (arrivals && pending == 0)
        h->fault(line, "mbarrier.arrive: more arrivals than the barrier's phase expects (%lld)", (long long)expected);
    pending -= arrivals;
    int completed = pending == 0 && tx == 0;
    if (completed) {
        phase ^= 1;
        pending = expected;
    }
    *at = (uint64_t)expected | (uint64_t)pending << 21 | ((uint64_t)tx & MG_HOPPER_MBARRIER_FIELD) << 42 | phase << 63;
    return completed;
}

/* `map` as a CPU tensor map of `rank` dimensions, else a fault of `what`. */
static inline const mg_cpu_tensor_map *mg_hopper_tensor_map_of(const mg_hopper_hooks *h, void *map, int32_t rank,
                                                            const char *what, int32_t line)
{
    const mg_cpu_tensor_map *m = map;
    if (m->magic != MG_CPU_TENSOR_MAP_MAGIC)
        h->fault(line, "%s: the tensor map was not made for the CPU backend", what);
    if (rank != m->rank)
        h->fault(line, "%s: %d coordinates for a %d-d tensor map", what, (int)rank, (int)m->rank);
    return m;
}

/* What mg_hopper_tma_copy does with a box: shared memory to global memory, global to shared,
 * or shared added to global (cp.reduce.async.bulk.tensor .add). */
enum { MG_HOPPER_TMA_STORE, MG_HOPPER_TMA_LOAD, MG_HOPPER_TMA_ADD };

/* *global += *local, float32. */
static inline void mg_hopper_add(char *global, const char *local)
{
    float x, y;
    memcpy(&x, global, 4);
    memcpy(&y, local, 4);
    x += y;
    memcpy(global, &x, 4);
}

/* Copies the box at `coords` (innermost first) of the map's array to (load) or from shared
 * memory at byte `offset` (store, or add to what the array holds), the box row-major there
 * with the map's swizzle; a load fills what lies outside the array (zeros, or NaN), a store
 * or an add skips it. Returns the box's bytes. */
static inline size_t mg_hopper_tma_copy(const mg_hopper_hooks *h, const mg_cpu_tensor_map *m, size_t offset,
                                     const int32_t *coords, int mode, const char *what, int32_t line)
{
    int rank = m->rank;
    size_t esize = m->element_size, count[5], total = 1;
    for (int i = 0; i < rank; i++) {
        count[i] = (m->box[i] + m->element_strides[i] - 1u) / m->element_strides[i];
        total *= count[i];
    }
    if (offset % 128)
        h->fault(line, "%s: the shared memory is at byte %zu, not 128-byte aligned", what, offset);
    /* The GPU stops with an illegal instruction where the box's rows start off a 16-byte boundary. */
    if ((int64_t)coords[0] * (int64_t)esize % 16)
        h->fault(line, "%s: the innermost coordinate %d is %lld bytes into a row: the box's rows must start at a "
                 "multiple of 16 bytes", what, (int)coords[0], (long long)coords[0] * (long long)esize);
    h->shared_at(offset, total * esize, what, line);
    /* What mg.tma.reduce_add takes (CU_TENSOR_MAP_DATA_TYPE_FLOAT32), and coordinates from 0: a Hopper
     * GPU stops an addition at a negative one with an illegal instruction. */
    if (mode == MG_HOPPER_TMA_ADD && m->data_type != 7)
        h->fault(line, "%s: the array's elements are float32, not of tensor map data type %d", what,
                 (int)m->data_type);
    for (int i = 0; mode == MG_HOPPER_TMA_ADD && i < rank; i++)
        if (coords[i] < 0)
            h->fault(line, "%s: coordinate %d is %d: an addition's box starts inside the array (the GPU stops "
                     "with an illegal instruction)", what, rank - 1 - i, (int)coords[i]);
    unsigned char fill[8] = {0};
    if (m->oob_nan) {
        /* The canonical NaN of the element type (f16, f32, f64, bf16). */
        static const uint64_t nan[] = {0, 0, 0, 0, 0, 0, 0x7fff, 0x7fffffff, 0x7fffffffffffffffull, 0x7fff};
        uint64_t bits = m->data_type < 10 ? nan[m->data_type] : 0;
        memcpy(fill, &bits, esize);
    }
    size_t index[5] = {0, 0, 0, 0, 0};
    for (size_t e = 0; e < total; e++) {
        char *local = h->shared_at(mg_hopper_swizzled(offset + e * esize, m->swizzle_bytes), esize, what, line);
        int inside = 1;
        size_t at = 0;
        for (int i = 0; i < rank; i++) {
            int64_t g = (int64_t)coords[i] + (int64_t)(index[i] * m->element_strides[i]);
            inside &= g >= 0 && (uint64_t)g < m->dims[i];
            at += (size_t)g * m->strides[i];
        }
        char *global = (char *)(uintptr_t)m->address + at;
        if (mode == MG_HOPPER_TMA_LOAD) {
            memcpy(local, inside ? global : (const char *)fill, esize);
            if (h->written != NULL)
                h->written(local, esize, line);
        } else if (inside && mode == MG_HOPPER_TMA_ADD) {
            mg_hopper_add(global, local);
        } else if (inside) {
            memcpy(global, local, esize);
        }
        for (int i = 0; i < rank && ++index[i] == count[i]; i++)
            index[i] = 0;
    }
    return total * esize;
}

#endif
