#include "module.h"
int mg_ir_init(PyObject *module) { return 0; }
