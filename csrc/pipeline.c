#include "module.h"
int mg_pipeline_init(PyObject *module) { return 0; }
