// The allocation handler behind lazyx's memory figures.
//
// NumPy calls a handler's free for a buffer with the handler that allocated
// it (the array keeps a reference to it), so blocks allocated during an
// evaluation come back here even after the handler was swapped out again.
// Each block carries a small header (capacity, base pointer, a tag), so the
// accounting never depends on the size NumPy passes to free.
//
// The figures are MLX's: a block counts the bytes it was asked for (no
// rounding, no header), a freed block goes to an LRU cache keyed by size while
// the cache stays under the cache limit (MLX's rule: a block that would pass it
// is freed instead), and a request takes the smallest cached block that fits
// and is less than twice its size (or two pages larger), the one freed last among
// blocks of that size (likely still in cache), counted at that block's size. Reuse avoids the page faults a fresh mmap costs on every large
// allocation. Blocks of kMinAligned bytes or more are aligned to 64 bytes. The
// cache is released when active + cache + a new request would pass the memory
// limit. reset_peak() sets the peak to 0, as MLX does.
#include "allocator.h"

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/ndarraytypes.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>

namespace lazyx::memory {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMinAligned = 16 * 1024;
constexpr size_t kAlign = 64;
constexpr uint64_t kTag = 0x6c617a7978626c6bULL;  // "lazyxblk"

struct Header {
  uint64_t tag;
  size_t capacity;  // usable bytes after the header: the bytes counted
  void* base;       // what the system allocator returned
  size_t pad;
};
static_assert(sizeof(Header) == 32, "the header keeps data 16-byte aligned");

inline Header* header_of(void* data) { return reinterpret_cast<Header*>(data) - 1; }

size_t default_memory_limit() {
  // As MLX's CPU build: a fraction of physical memory.
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || size <= 0) return size_t(1) << 34;
  return static_cast<size_t>(0.8 * double(pages) * double(size));
}

using Lru = std::list<std::pair<size_t, void*>>;  // (capacity, data), newest first

struct State {
  std::mutex mu;
  size_t active = 0, peak = 0, cache = 0;
  size_t memory_limit = default_memory_limit();
  size_t cache_limit = memory_limit;  // MLX: the cache limit defaults to the memory limit
  Lru lru;
  std::multimap<size_t, Lru::iterator> by_size;
};

// Never destroyed: NumPy may free buffers during interpreter shutdown.
State& state() {
  static State* s = new State();
  return *s;
}

void release_block(void* data) { std::free(header_of(data)->base); }

// Drop cached blocks, oldest first, until the cache holds at most `keep` bytes.
void trim_cache_locked(State& s, size_t keep) {
  while (s.cache > keep && !s.lru.empty()) {
    auto [cap, data] = s.lru.back();
    auto range = s.by_size.equal_range(cap);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second->second == data) {
        s.by_size.erase(it);
        break;
      }
    }
    s.lru.pop_back();
    s.cache -= cap;
    release_block(data);
  }
}

void* take_cached_locked(State& s, size_t need) {
  auto it = s.by_size.lower_bound(need);
  // Accept a block a little larger than needed, never one twice the size.
  if (it == s.by_size.end() || it->first >= std::min(2 * need, need + 2 * kPage)) return nullptr;
  void* data = it->second->second;
  s.cache -= it->first;
  s.lru.erase(it->second);
  s.by_size.erase(it);
  return data;
}

void count_locked(State& s, size_t cap) {
  s.active += cap;
  if (s.active > s.peak) s.peak = s.active;
}

// A new block from the system: `cap` usable bytes, zeroed if asked.
void* system_block(size_t cap, bool zero) {
  const bool large = cap >= kMinAligned;
  const size_t extra = sizeof(Header) + (large ? kAlign : 0);
  if (cap > SIZE_MAX - extra) return nullptr;
  void* base = zero ? std::calloc(1, cap + extra) : std::malloc(cap + extra);
  if (base == nullptr) return nullptr;
  uintptr_t data = reinterpret_cast<uintptr_t>(base) + sizeof(Header);
  if (large) data = (data + kAlign - 1) & ~uintptr_t(kAlign - 1);
  Header* h = reinterpret_cast<Header*>(data) - 1;
  h->tag = kTag;
  h->capacity = cap;
  h->base = base;
  h->pad = 0;
  return reinterpret_cast<void*>(data);
}

void* allocate(size_t size, bool zero) {
  State& s = state();
  const size_t cap = size;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.cache > 0) {
      if (void* data = take_cached_locked(s, cap)) {
        count_locked(s, header_of(data)->capacity);
        if (zero) std::memset(data, 0, size);
        return data;
      }
    }
    if (s.cache > 0 && s.active + s.cache + cap > s.memory_limit) {
      const size_t room = s.memory_limit > s.active + cap ? s.memory_limit - s.active - cap : 0;
      trim_cache_locked(s, room);
    }
  }
  void* data = system_block(cap, zero);
  std::lock_guard<std::mutex> lock(s.mu);
  if (data == nullptr && s.cache > 0) {
    trim_cache_locked(s, 0);  // out of memory: give the cache back and try once more
    data = system_block(cap, zero);
  }
  if (data != nullptr) count_locked(s, cap);
  return data;
}

void deallocate(void* data) {
  if (data == nullptr) return;
  Header* h = header_of(data);
  if (h->tag != kTag) return;  // not ours: leaking beats crashing
  State& s = state();
  const size_t cap = h->capacity;
  std::lock_guard<std::mutex> lock(s.mu);
  s.active -= std::min(s.active, cap);
  if (cap > 0 && s.cache + cap <= s.cache_limit) {  // an empty block is never reused
    s.lru.emplace_front(cap, data);
    // First among the blocks of its size, so that a request takes the block freed last:
    // the one most likely still in cache (a plan frees an intermediate just before it
    // allocates the next of that size).
    s.by_size.emplace_hint(s.by_size.lower_bound(cap), cap, s.lru.begin());
    s.cache += cap;
  } else {
    h->tag = 0;
    release_block(data);
  }
}

void* h_malloc(void*, size_t size) { return allocate(size, false); }

void* h_calloc(void*, size_t nelem, size_t elsize) {
  if (elsize != 0 && nelem > SIZE_MAX / elsize) return nullptr;
  return allocate(nelem * elsize, true);
}

void* h_realloc(void*, void* ptr, size_t new_size) {
  if (ptr == nullptr) return allocate(new_size, false);
  Header* h = header_of(ptr);
  if (h->tag != kTag) return nullptr;
  const size_t old_cap = h->capacity;
  if (new_size <= old_cap && new_size >= old_cap / 2) return ptr;  // fits; keep it
  void* data = allocate(new_size, false);
  if (data == nullptr) return nullptr;  // the old block stays valid, as realloc promises
  std::memcpy(data, ptr, std::min(old_cap, new_size));
  deallocate(ptr);
  return data;
}

void h_free(void*, void* ptr, size_t) { deallocate(ptr); }

PyDataMem_Handler g_handler = {
    "lazyx_allocator", 1, {nullptr, h_malloc, h_calloc, h_realloc, h_free}};

}  // namespace

Stats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return {s.active, s.peak, s.cache};
}

void reset_peak() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.peak = 0;
}

void clear_cache() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  trim_cache_locked(s, 0);
}

size_t memory_limit() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.memory_limit;
}

size_t cache_limit() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.cache_limit;
}

size_t set_memory_limit(size_t limit) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t previous = s.memory_limit;
  s.memory_limit = limit;
  if (s.active + s.cache > limit) trim_cache_locked(s, limit > s.active ? limit - s.active : 0);
  return previous;
}

size_t set_cache_limit(size_t limit) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t previous = s.cache_limit;
  s.cache_limit = limit;
  trim_cache_locked(s, limit);
  return previous;
}

PyObject* new_handler_capsule() { return PyCapsule_New(&g_handler, "mem_handler", nullptr); }

}  // namespace lazyx::memory
