#include "module.h"
int mg_cu_init(PyObject *module) { return 0; }
