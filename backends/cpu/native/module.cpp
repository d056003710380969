// lazyx.backends.cpu._native: native CPU kernels (placeholder while the module grows).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

NB_MODULE(_native, m) {
  m.doc() = "Native CPU kernels of lazyx's cpu backend.";
  m.def("version", []() { return 1; });
}
