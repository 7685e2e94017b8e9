#include "module.h"
int mg_array_init(PyObject *module) { return 0; }
