// PEP 688's __buffer__ for Python 3.11 (see buffer.cpp).
#pragma once

#include <Python.h>

namespace lazyx::buffer {

// Give heap type `cls` the C buffer slot that calls its __buffer__(flags)
// method; 0, or -1 with a Python error set.
int backport(PyObject* cls);

}  // namespace lazyx::buffer
