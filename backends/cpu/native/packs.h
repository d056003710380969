// The op packs' native kernels: each pack's C++ file binds its functions into
// the one module (lazyx.backends.cpu._native) through its bind_<pack> function,
// called by module.cpp. The Python side of each pack is
// backends/cpu/native_packs/<pack>.py.
#pragma once

#include <nanobind/nanobind.h>

namespace lazyx {
void bind_conv(nanobind::module_& m);
void bind_fast(nanobind::module_& m);
void bind_quantized(nanobind::module_& m);
void bind_matmuls(nanobind::module_& m);
}  // namespace lazyx
