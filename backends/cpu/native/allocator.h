// lazyx's NumPy allocation handler: counts the bytes of the buffers it hands
// out (active, peak), as MLX counts them, and keeps freed blocks in a size-keyed cache.
#pragma once

#include <Python.h>

#include <cstddef>

namespace lazyx::memory {

struct Stats {
  size_t active;  // bytes of live blocks this handler allocated
  size_t peak;    // most active bytes since start or reset_peak() (which sets 0)
  size_t cache;   // bytes of freed blocks kept for reuse
};

Stats stats();
void reset_peak();
void clear_cache();
size_t memory_limit();
size_t cache_limit();
size_t set_memory_limit(size_t limit);  // returns the previous limit
size_t set_cache_limit(size_t limit);   // returns the previous limit

// A "mem_handler" capsule for PyDataMem_SetHandler (new reference), or NULL
// with a Python error set.
PyObject* new_handler_capsule();

}  // namespace lazyx::memory
