/* mlirgpu.TensorMap: a CUtensorMap made by cuTensorMapEncodeTiled, or the
 * CPU backend's host map in the same bytes. */
#include "launch/tensor_map.h"
#include "cpu/cpu.h"
#include "cuda/driver.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* ---------------------------------------------------------------------- */
/* TensorMap: a CUtensorMap made by cuTensorMapEncodeTiled                 */
/* ---------------------------------------------------------------------- */

_Static_assert(sizeof(mg_cpu_tensor_map) <= sizeof(CUtensorMap), "a host tensor map fits a CUtensorMap's bytes");

PyTypeObject *mg_cu_TensorMap_type;

/* A tuple of `n` ints into `out`, each in [lo, hi]. */
static int uint64_tuple(PyObject *value, const char *what, Py_ssize_t n, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != n) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of %zd ints, got %R", what, n, value);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(value, i));
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            v = hi + 1;
        }
        if (v < lo || v > hi) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] must be an int in [%llu, %llu], got %R", what, i,
                         (unsigned long long)lo, (unsigned long long)hi, PyTuple_GET_ITEM(value, i));
            return -1;
        }
        out[i] = v;
    }
    return 0;
}

/* A GPU map of encoding `e` at `address` into `map` (64-byte aligned): 0, or -1 with CudaError. */
static int encode(const mg_tensor_map_encoding *e, CUdeviceptr address, CUtensorMap *map)
{
    CUresult r = mg_cu.cuTensorMapEncodeTiled(map, (CUtensorMapDataType)e->data_type, (cuuint32_t)e->rank,
                                              (void *)(uintptr_t)address, e->dims, e->strides, e->box,
                                              e->element_strides, (CUtensorMapInterleave)e->interleave,
                                              (CUtensorMapSwizzle)e->swizzle,
                                              (CUtensorMapL2promotion)e->l2_promotion,
                                              (CUtensorMapFloatOOBfill)e->oob_fill);
    return mg_cu_check(r, "cuTensorMapEncodeTiled");
}

/* TensorMap(owner, info, data_type, address, dims, strides, box, element_strides,
 *           interleave, swizzle, l2_promotion, oob_fill, host=False, readonly=False): the
 * arguments of cuTensorMapEncodeTiled as mlirgpu.tma computes them (strides
 * in bytes, of dimensions 1.. only, as the driver takes them). host=True: a
 * map for the CPU backend, the same fields in an mg_cpu_tensor_map (no driver),
 * `readonly` where its array may not be written. */
static PyObject *tensor_map_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"owner", "info", "data_type", "address", "dims", "strides", "box",
                               "element_strides", "interleave", "swizzle", "l2_promotion", "oob_fill", "host", "readonly",
                               NULL};
    PyObject *owner, *info, *dims_obj, *strides_obj, *box_obj, *element_strides_obj;
    int data_type, interleave, swizzle, l2_promotion, oob_fill, host = 0, readonly = 0;
    unsigned long long address;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOiKO!O!O!O!iiii|pp:TensorMap", keywords, &owner, &info,
                                     &data_type, &address, &PyTuple_Type, &dims_obj, &PyTuple_Type, &strides_obj,
                                     &PyTuple_Type, &box_obj, &PyTuple_Type, &element_strides_obj,
                                     &interleave, &swizzle, &l2_promotion, &oob_fill, &host, &readonly))
        return NULL;
    Py_ssize_t rank = PyTuple_GET_SIZE(dims_obj);
    if (rank < 1 || rank > 5) {
        PyErr_Format(PyExc_ValueError, "a tensor map has 1 to 5 dimensions, got %zd", rank);
        return NULL;
    }
    mg_tensor_map_encoding e = {.data_type = data_type, .rank = (int)rank, .interleave = interleave,
                                .swizzle = swizzle, .l2_promotion = l2_promotion, .oob_fill = oob_fill};
    uint64_t box64[5], element64[5];
    if (uint64_tuple(dims_obj, "dims", rank, 1, (uint64_t)1 << 32, (uint64_t *)e.dims) < 0 ||
        uint64_tuple(strides_obj, "strides", rank - 1, 16, ((uint64_t)1 << 40) - 16, (uint64_t *)e.strides) < 0 ||
        uint64_tuple(box_obj, "box", rank, 1, 256, box64) < 0 ||
        uint64_tuple(element_strides_obj, "element_strides", rank, 1, 8, element64) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < rank; i++) {
        e.box[i] = (cuuint32_t)box64[i];
        e.element_strides[i] = (cuuint32_t)element64[i];
    }
    CUtensorMap map;   /* aligned as the driver wants it */
    memset(&map, 0, sizeof map);
    if (host) {
        if (mg_cpu_tensor_map_element_size(data_type) == 0 || swizzle < 0 || swizzle > 3 || interleave != 0) {
            PyErr_Format(PyExc_ValueError, "a host tensor map takes a data type of 0-9, a swizzle of 0-3 and no "
                         "interleave, got %d, %d and %d", data_type, swizzle, interleave);
            return NULL;
        }
        mg_cpu_tensor_map h = mg_cpu_tensor_map_make(data_type, (int)rank, address, (const uint64_t *)e.dims,
                                                     (const uint64_t *)e.strides, e.box, e.element_strides, swizzle,
                                                     oob_fill, readonly);
        memcpy(&map, &h, sizeof h);
    } else if (mg_cu_ensure_context() < 0 || encode(&e, (CUdeviceptr)address, &map) < 0) {
        return NULL;
    }
    mg_tensor_map *self = (mg_tensor_map *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    memcpy(self->map, &map, sizeof map);
    self->encoding = e;
    self->address = (CUdeviceptr)address;
    self->owner = Py_NewRef(owner);
    self->info = Py_NewRef(info);
    self->host = (char)host;
    return (PyObject *)self;
}

PyObject *mg_tensor_map_at(PyObject *template, CUdeviceptr address)
{
    const mg_tensor_map *from = (const mg_tensor_map *)template;
    CUtensorMap map;
    memset(&map, 0, sizeof map);
    if (encode(&from->encoding, address, &map) < 0)
        return NULL;
    mg_tensor_map *self = (mg_tensor_map *)mg_cu_TensorMap_type->tp_alloc(mg_cu_TensorMap_type, 0);
    if (self == NULL)
        return NULL;
    memcpy(self->map, &map, sizeof map);
    self->encoding = from->encoding;
    self->address = address;
    self->owner = Py_NewRef(Py_None);
    self->info = Py_NewRef(from->info);
    return (PyObject *)self;
}

static int tensor_map_traverse(mg_tensor_map *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    Py_VISIT(self->info);
    return 0;
}

static int tensor_map_clear(mg_tensor_map *self)
{
    Py_CLEAR(self->owner);
    Py_CLEAR(self->info);
    return 0;
}

static void tensor_map_dealloc(mg_tensor_map *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tensor_map_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *tensor_map_get_data(mg_tensor_map *self, void *closure)
{
    return PyBytes_FromStringAndSize((const char *)self->map, sizeof self->map);
}

/* with_owner(owner): the same map kept with another owner. Encoding depends on
 * the address, never on which object owns the memory there, so a map made
 * once serves every array of those encode parameters. */
static PyObject *tensor_map_with_owner(mg_tensor_map *self, PyObject *owner)
{
    PyTypeObject *type = Py_TYPE(self);
    mg_tensor_map *map = (mg_tensor_map *)type->tp_alloc(type, 0);
    if (map == NULL)
        return NULL;
    memcpy(map->map, self->map, sizeof map->map);
    map->encoding = self->encoding;
    map->address = self->address;
    map->owner = Py_NewRef(owner);
    map->info = Py_NewRef(self->info);
    map->host = self->host;
    return (PyObject *)map;
}

static PyMethodDef tensor_map_methods[] = {
    {"with_owner", (PyCFunction)tensor_map_with_owner, METH_O,
     "with_owner(owner): a TensorMap of the same 128 bytes and info that keeps `owner` alive instead."},
    {NULL},
};

static PyGetSetDef tensor_map_getset[] = {
    {"data", (getter)tensor_map_get_data, NULL, "The 128 bytes of the CUtensorMap.", NULL},
    {NULL},
};

static PyMemberDef tensor_map_members[] = {
    {"owner", T_OBJECT, offsetof(mg_tensor_map, owner), READONLY, "The array the map addresses."},
    {"info", T_OBJECT, offsetof(mg_tensor_map, info), READONLY, "What the map was computed from."},
    {"host", T_BOOL, offsetof(mg_tensor_map, host), READONLY, "Whether the map is for the CPU backend."},
    {NULL},
};

static PyType_Slot tensor_map_slots[] = {
    {Py_tp_new, tensor_map_new},
    {Py_tp_dealloc, tensor_map_dealloc},
    {Py_tp_traverse, tensor_map_traverse},
    {Py_tp_clear, tensor_map_clear},
    {Py_tp_getset, tensor_map_getset},
    {Py_tp_methods, tensor_map_methods},
    {Py_tp_members, tensor_map_members},
    {Py_tp_doc, "A CUDA tensor map (CUtensorMap) for TMA copies: make one with mlirgpu.tensor_map; "
                "a kernel takes it by value as a parameter annotated mlirgpu.TensorMap.\n\n"
                "For example::\n\n"
                "    a_map = mg.tensor_map(A, box=(128, 64), swizzle=\"128B\")\n\n"
                "    @mg.kernel\n"
                "    def copy_tile(m: mg.TensorMap, C: mg.memref[128, 64, mg.f16]): ...\n"},
    {0, NULL},
};

static PyType_Spec tensor_map_spec = {
    .name = "mlirgpu.TensorMap",
    .basicsize = sizeof(mg_tensor_map),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = tensor_map_slots,
};


int mg_tensor_map_init(PyObject *module)
{
    /* A strong ref kept in a static: the module exists once per process. */
    mg_cu_TensorMap_type = mg_add_type(module, &tensor_map_spec, NULL);
    return mg_cu_TensorMap_type == NULL ? -1 : 0;
}
