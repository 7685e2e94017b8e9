/* What the files of the IR layer share with each other, hidden from the
 * world by -fvisibility=hidden. */
#ifndef MG_MLIR_IR_SHARED_H
#define MG_MLIR_IR_SHARED_H

#include "mlir/ir.h"
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <signal.h>

typedef struct {
    PyObject_HEAD
    union { MlirLocation loc; MlirType type; MlirAttribute attr; const void *ptr; } h;
    mg_ir_Context *context;
} mg_ir_Value_like; /* layout shared by Location, Type and Attribute */

#define wrap_location(ctx, l) mg_ir_uniqued_new(mg_ir_LocationType, (ctx), (l).ptr)

#define wrap_type(ctx, t) mg_ir_uniqued_new(mg_ir_TypeType, (ctx), (t).ptr)

#define wrap_attribute(ctx, a) mg_ir_uniqued_new(mg_ir_AttributeType, (ctx), (a).ptr)

/* Blocks, regions and values are views into an operation: each holds the
 * wrapper of the operation it belongs to, and is valid while that is. */
typedef struct {
    PyObject_HEAD
    MlirBlock block;
    mg_ir_Operation *anchor; /* the operation whose region holds the block */
} mg_ir_Block;

typedef struct {
    PyObject_HEAD
    MlirRegion region;
    mg_ir_Operation *anchor;
} mg_ir_Region;

typedef struct {
    PyObject_HEAD
    MlirValue value;
    mg_ir_Operation *anchor; /* defining operation, or the block argument's */
} mg_ir_ValueObject;

typedef struct { MlirOperation *ops; size_t n, cap; int failed; } op_list;

typedef struct {
    PyObject_HEAD
    mg_ir_Block *block;
    mg_ir_Operation *before; /* NULL: the end of the block */
} mg_ir_InsertionPoint;

#define OP_CHECKED(self) \
    if (mg_ir_op_check(self) < 0) \
        return NULL;

typedef PyObject *(*item_maker)(void *owner, intptr_t i);

extern PyTypeObject *mg_ir_ContextType, *mg_ir_LocationType, *mg_ir_TypeType, *mg_ir_AttributeType, *mg_ir_OperationType,
    *mg_ir_BlockType, *mg_ir_RegionType, *mg_ir_ValueType, *mg_ir_InsertionPointType;
extern PyTypeObject *mg_ir_ModuleType;
extern PyObject *mg_ir_str_context_stack, *mg_ir_str_location_stack, *mg_ir_str_ip_stack;
extern mg_ir_Context *mg_ir_default_context;
extern _Thread_local sigjmp_buf *mg_fatal_target;
extern _Thread_local char mg_fatal_reason[1024];
PyObject *mg_ir_str(MlirStringRef ref);
void mg_buf_callback(MlirStringRef chunk, void *userdata);
PyObject *mg_buf_finish(mg_buf *buf);
PyObject *mg_ir_list_of(intptr_t n, item_maker make, void *owner);
MlirStringRef mg_ir_string_ref(PyObject *str, const char *what);
MlirLogicalResult mg_ir_diag_handler(MlirDiagnostic diag, void *userdata);
void mg_ir_diag_clear(mg_ir_Context *ctx);
int mg_ir_diag_check(mg_ir_Context *ctx, int failed, const char *what);
PyObject *mg_ir_stack_top(PyObject *key) /* borrowed, NULL without error if empty */;
PyObject *mg_ir_stack_push(PyObject *key, PyObject *self);
PyObject *mg_ir_stack_pop(PyObject *key, PyObject *self);
void mg_ir_fatal_error_handler(const char *reason);
mg_ir_Context *mg_ir_context_current(void) /* borrowed */;
mg_ir_Context *mg_ir_context_arg(PyObject *arg) /* borrowed */;
int mg_ir_parse_args(PyObject *args, PyObject *kwds, const char *format, mg_ir_Context **ctx, MlirStringRef *ref);
int mg_ir_own_items(PyObject **seq, const char *message);
extern PyType_Spec mg_ir_Context_spec;
PyObject *mg_ir_uniqued_new(PyTypeObject *type, mg_ir_Context *ctx, const void *ptr);
void mg_ir_uniqued_dealloc(mg_ir_Value_like *self);
Py_hash_t mg_ir_uniqued_hash(mg_ir_Value_like *self);
PyObject *mg_ir_uniqued_richcompare(mg_ir_Value_like *self, PyObject *other, int op);
PyObject *mg_ir_uniqued_get_context(mg_ir_Value_like *self, void *c);
PyObject *mg_ir_uniqued_repr(PyObject *self);
mg_ir_Value_like *mg_ir_uniqued_arg(PyObject *obj, PyTypeObject *type, mg_ir_Context *ctx, const char *what);
int mg_ir_location_arg(PyObject *arg, mg_ir_Context *ctx, MlirLocation *out);
extern PyType_Spec mg_ir_Location_spec;
int mg_ir_uniqued_seq(PyObject *seq, PyTypeObject *type, mg_ir_Context *ctx, const char *what,
                       const void ***out, Py_ssize_t *n);
extern PyType_Spec mg_ir_Type_spec;
PyObject *mg_ir_Attribute_parse(PyObject *cls, PyObject *args, PyObject *kwds);
int mg_ir_named_attributes(PyObject *mapping, mg_ir_Context *ctx, MlirNamedAttribute **out, Py_ssize_t *n);
extern PyType_Spec mg_ir_Attribute_spec;
int mg_ir_op_check(mg_ir_Operation *op);
int mg_ir_anchor_check(mg_ir_Operation *anchor, const char *what);
mg_ir_Operation *mg_ir_op_new(mg_ir_Context *ctx, MlirOperation op, PyObject *parent, int owned);
PyObject *mg_ir_operation_wrap(mg_ir_Context *ctx, MlirOperation op);
int mg_ir_invalidate_under(mg_ir_Operation *root, int include_root);
void mg_ir_Operation_dealloc(mg_ir_Operation *self);
PyObject *mg_ir_block_wrap(mg_ir_Operation *anchor, MlirBlock block);
mg_ir_Operation *mg_ir_block_owner(mg_ir_Context *ctx, MlirBlock block);
PyObject *mg_ir_region_wrap(mg_ir_Operation *anchor, MlirRegion region);
PyObject *mg_ir_value_wrap(mg_ir_Operation *anchor, MlirValue value);
void mg_ir_view_dealloc(mg_ir_Block *self) /* Block, Region and Value share the layout's tail */;
Py_hash_t mg_ir_view_hash(mg_ir_Block *self);
PyObject *mg_ir_view_richcompare(mg_ir_Block *self, PyObject *other, int op);
MlirWalkResult mg_ir_collect_op(MlirOperation op, void *userdata);
MlirOperation mg_ir_ir_root(MlirOperation op);
MlirOperation mg_ir_value_owner_op(MlirValue v);
int mg_ir_result_of_enclosing(MlirValue value, MlirOperation user, MlirOperation under);
int mg_ir_insert_operation(mg_ir_Block *block, mg_ir_Operation *before, PyObject *opobj);
mg_ir_Block *mg_ir_block_arg(PyObject *obj);
extern PyType_Spec mg_ir_InsertionPoint_spec;
PyObject *mg_ir_Operation_verify(mg_ir_Operation *self, PyObject *unused);
PyObject *mg_ir_Operation_str(mg_ir_Operation *self);
PyObject *mg_ir_Operation_print(mg_ir_Operation *self, PyObject *args, PyObject *kwds);
PyObject *mg_ir_Operation_walk(mg_ir_Operation *self, PyObject *args, PyObject *kwds);
extern PyType_Spec mg_ir_Operation_spec;
extern PyType_Spec mg_ir_Block_spec;
extern PyType_Spec mg_ir_Region_spec;
extern PyType_Spec mg_ir_Value_spec;


#endif
