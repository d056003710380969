// The op packs' native kernels: each pack's C++ file binds its functions into
// the one module (lazyx.backends.cpu._native) through its bind_<pack> function,
// called by module.cpp. The Python side of each pack is
// backends/cpu/native_packs/<pack>.py.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace lazyx {
// The arrays a kernel binding takes: C-contiguous host buffers, read-only or written.
template <class T>
using In = nanobind::ndarray<const T, nanobind::c_contig, nanobind::device::cpu>;
template <class T>
using Out = nanobind::ndarray<T, nanobind::c_contig, nanobind::device::cpu>;

void bind_conv(nanobind::module_& m);
void bind_fast(nanobind::module_& m);
void bind_quantized(nanobind::module_& m);
void bind_matmuls(nanobind::module_& m);
void bind_small(nanobind::module_& m);
}  // namespace lazyx
