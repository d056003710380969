// The buffer protocol for a Python class on Python 3.11.
//
// Python 3.12 (PEP 688) lets a class export its memory by defining
// __buffer__(flags) -> memoryview: the interpreter fills the type's C buffer
// slot with a function that calls it. Python 3.11 reads only the C slot, so a
// class written in Python cannot be given to memoryview() at all. backport()
// fills that slot by hand with the same behaviour as 3.12's: call
// __buffer__(flags), then export the memoryview it returned. The exported
// view's owner is that memoryview, so releasing the buffer releases it (and
// through it the NumPy array that owns the memory); no release slot is needed.
#include "buffer.h"

namespace lazyx::buffer {
namespace {

int get_buffer(PyObject* self, Py_buffer* view, int flags) {
  PyObject* mv = PyObject_CallMethod(self, "__buffer__", "i", flags);
  if (mv == nullptr) return -1;
  if (!PyMemoryView_Check(mv)) {
    PyErr_Format(PyExc_TypeError, "__buffer__ returned %.200s, not a memoryview",
                 Py_TYPE(mv)->tp_name);
    Py_DECREF(mv);
    return -1;
  }
  const int rc = PyObject_GetBuffer(mv, view, flags);  // view->obj now owns mv
  Py_DECREF(mv);
  return rc;
}

}  // namespace

int backport(PyObject* cls) {
  if (!PyType_Check(cls) || !PyType_HasFeature(reinterpret_cast<PyTypeObject*>(cls), Py_TPFLAGS_HEAPTYPE)) {
    PyErr_SetString(PyExc_TypeError, "[backport_buffer_protocol] cls must be a class defined in Python.");
    return -1;
  }
  // A heap type carries its own slot table; subclasses made later copy the slot
  // from here (inherit_slots), so only subclasses that already exist need a call.
  auto* heap = reinterpret_cast<PyHeapTypeObject*>(cls);
  heap->as_buffer.bf_getbuffer = get_buffer;
  heap->ht_type.tp_as_buffer = &heap->as_buffer;
  PyType_Modified(&heap->ht_type);
  return 0;
}

}  // namespace lazyx::buffer
