// lazyx.backends.cuda._native: the cuda backend's eager launch path in C++ (issue 16, item 8).
//
// An eager element-wise op on the GPU is one launch of a generated kernel
// (backends/cuda/compiled.py). In Python a launch costs CuPy's allocation (~2 µs), CuPy's
// RawKernel call (~6 µs: it wraps every argument) and the planning around them; here the
// common case costs a hash lookup, a few attribute reads and the driver's cuLaunchKernel.
//
// `Launcher(fallback, planner, key_attr, stats, upload)` is a kernel (`launcher(prim,
// inputs[, donors])`) in front of the Python kernel `fallback`. Host inputs (NumPy: a
// Python scalar's 0-d array) become device arrays through `upload` (the backend's cache of
// device copies). A call is looked up by (primitive class, the primitive's `key_attr`
// object when given, each input's dtype, shape and strides). The first call of a key asks
// `planner(prim, inputs)`, which returns None (this key always runs `fallback`: a layout
// only the Python path's copies can run) or
//   (function pointer, grid, block, element count, scalar mask, full mask, output shape,
//    output dtypes, strided)
// with `strided` None for `lx_contiguous(inputs..., outputs..., long long n)` or (nd,
// layout array) for `lx_strided(..., long long n, int nd, const long long* layout)`. A call
// then takes each output from a donated input (one the scheduler says nothing else reads,
// C-contiguous of the output's shape and dtype, owning its memory: see
// framework/native/graph.cpp) or a new `cupy.ndarray`, and launches on CuPy's current
// stream (so a CUDA graph capture records it). Counters go to `stats` ("contiguous" or
// "strided", "native", "donated") as the Python path counts its launches.
//
// The driver is found at run time (dlopen of libcuda.so.1, which CuPy has loaded): the
// module builds and imports on machines without CUDA, where nothing constructs a Launcher.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <nanobind/nanobind.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace {

typedef int CUresult;
typedef void* CUfunction;
typedef void* CUstream;
using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void**, void**);
using ErrorStringFn = CUresult (*)(CUresult, const char**);

LaunchFn g_launch = nullptr;
ErrorStringFn g_error_string = nullptr;
PyObject* g_ndarray = nullptr;      // cupy.ndarray
PyObject* g_stream_ptr = nullptr;   // () -> the current stream (its handle, or with .ptr)
PyObject* g_error = nullptr;        // the exception class of a failed launch
PyObject* g_generic = nullptr;      // numpy.generic: a NumPy scalar argument, passed by value

PyObject* s_dtype = nullptr;  // interned attribute names
PyObject* s_shape = nullptr;
PyObject* s_data = nullptr;
PyObject* s_ptr = nullptr;
PyObject* s_base = nullptr;
PyObject* s_strides = nullptr;
PyObject* s_name = nullptr;
PyObject* s_kernel = nullptr;
PyObject* s_shared_mem = nullptr;
PyObject* s_k_contiguous = nullptr;  // the counters' keys
PyObject* s_k_native = nullptr;
PyObject* s_k_strided = nullptr;
PyObject* s_k_donated = nullptr;

constexpr Py_ssize_t MAX_ARGS = 32;  // inputs + outputs of one launch

// One key's plan. It holds references to its Python objects (released with it); the
// cache and each call running it share it, so a call whose Python (an allocation) lets
// another thread clear the cache still has the objects it reads.
struct Entry {
    bool runs = false;  // false: the key runs the fallback
    CUfunction fn = nullptr;
    unsigned grid = 1, block = 1;
    long long n = 0;
    uint64_t scalar = 0;            // bit k: input k has one element
    uint64_t full = 0;              // bit k: input k is C-contiguous of the outputs' shape
    int nd = -1;                    // the strided kernel's dimension count; -1: contiguous
    uint64_t layout = 0;            // the strided kernel's layout (device address)
    PyObject* layout_owner = nullptr;  // the device array holding it
    PyObject* shape = nullptr;      // the outputs' shape (a tuple)
    std::vector<PyObject*> dtypes;  // the outputs' dtypes
    std::vector<PyObject*> held;    // the key's objects, kept alive while the entry is

    Entry() = default;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry() {
        Py_XDECREF(shape);
        Py_XDECREF(layout_owner);
        for (PyObject* o : dtypes) Py_DECREF(o);
        for (PyObject* o : held) Py_DECREF(o);
    }
};

struct KeyHash {
    size_t operator()(const std::vector<intptr_t>& k) const noexcept {
        uint64_t h = 1469598103934665603ull;
        for (intptr_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
        return static_cast<size_t>(h);
    }
};

using Cache = std::unordered_map<std::vector<intptr_t>, std::shared_ptr<Entry>, KeyHash>;

struct Launcher {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject* fallback;
    PyObject* planner;
    PyObject* key_attr;  // nullptr: the class and the inputs are the key
    PyObject* stats;     // a dict, or nullptr
    PyObject* upload;    // upload(host array) -> its device copy, or nullptr
    PyObject* dict;
    Cache* cache;
};

void clear_cache(Cache* c) {
    Cache old;
    old.swap(*c);  // the entries' references go after the cache is empty again
}

void count(Launcher* self, PyObject* key, long long by) {
    if (self->stats == nullptr || by == 0) return;
    PyObject* v = PyDict_GetItemWithError(self->stats, key);
    long long now = v != nullptr ? PyLong_AsLongLong(v) : 0;
    if (PyErr_Occurred()) { PyErr_Clear(); return; }
    PyObject* nv = PyLong_FromLongLong(now + by);
    if (nv == nullptr || PyDict_SetItem(self->stats, key, nv) < 0) PyErr_Clear();
    Py_XDECREF(nv);
}

PyObject* run_fallback(Launcher* self, PyObject* prim, PyObject* inputs) {
    PyObject* call[2] = {prim, inputs};
    return PyObject_Vectorcall(self->fallback, call, 2, nullptr);
}

// The device address of CuPy array `x` (x.data.ptr); false with an error set if unreadable.
bool address(PyObject* x, uint64_t* out) {
    PyObject* mem = PyObject_GetAttr(x, s_data);
    if (mem == nullptr) return false;
    PyObject* p = PyObject_GetAttr(mem, s_ptr);
    Py_DECREF(mem);
    if (p == nullptr) return false;
    *out = static_cast<uint64_t>(PyLong_AsUnsignedLongLongMask(p));
    Py_DECREF(p);
    return !PyErr_Occurred();
}

// The current stream's handle: `current_stream()` gives it, or an object whose `ptr` is.
bool current_stream(void** out) {
    PyObject* s = PyObject_CallNoArgs(g_stream_ptr);
    if (s != nullptr && !PyLong_Check(s)) Py_SETREF(s, PyObject_GetAttr(s, s_ptr));
    *out = s != nullptr ? PyLong_AsVoidPtr(s) : nullptr;
    Py_XDECREF(s);
    return !PyErr_Occurred();
}

// Raise the launch error: `what` (a format with one object, %S or %R) and the driver's words.
void launch_failed(CUresult rc, const char* what, PyObject* obj) {
    const char* why = nullptr;
    if (g_error_string == nullptr || g_error_string(rc, &why) != 0 || why == nullptr)
        why = "unknown error";
    PyObject* head = PyUnicode_FromFormat(what, obj);
    if (head == nullptr) return;
    PyErr_Format(g_error, "%U (CUDA error %d: %s).", head, rc, why);
    Py_DECREF(head);
}

// The planner's answer for a key, stored in `e` (None: `e.runs` stays false, the key runs
// the fallback); false with an error set if the planner raised.
bool plan(Launcher* self, PyObject* prim, PyObject* inputs, Entry& e) {
    PyObject* call[2] = {prim, inputs};
    PyObject* r = PyObject_Vectorcall(self->planner, call, 2, nullptr);
    if (r == nullptr) return false;
    if (r == Py_None) { Py_DECREF(r); return true; }
    PyObject *fn, *grid, *block, *n, *scalar, *full, *shape, *dtypes, *strided;
    if (!PyArg_ParseTuple(r, "OOOOOOOOO", &fn, &grid, &block, &n, &scalar, &full, &shape,
                          &dtypes, &strided) ||
        !PyTuple_Check(shape) || !PyTuple_Check(dtypes) ||
        (strided != Py_None && (!PyTuple_Check(strided) || PyTuple_GET_SIZE(strided) != 2))) {
        Py_DECREF(r);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Launcher: the planner returned a malformed plan.");
        return false;
    }
    e.fn = reinterpret_cast<CUfunction>(PyLong_AsVoidPtr(fn));
    e.grid = static_cast<unsigned>(PyLong_AsUnsignedLong(grid));
    e.block = static_cast<unsigned>(PyLong_AsUnsignedLong(block));
    e.n = PyLong_AsLongLong(n);
    e.scalar = PyLong_AsUnsignedLongLong(scalar);
    e.full = PyLong_AsUnsignedLongLong(full);
    if (strided != Py_None) {  // (nd, the layout's device array)
        e.nd = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(strided, 0)));
        PyObject* owner = PyTuple_GET_ITEM(strided, 1);
        if (!PyErr_Occurred() && address(owner, &e.layout)) {
            Py_INCREF(owner);
            e.layout_owner = owner;
        }
    }
    if (PyErr_Occurred()) { Py_DECREF(r); return false; }
    Py_INCREF(shape);
    e.shape = shape;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(dtypes); ++j) {
        PyObject* d = PyTuple_GET_ITEM(dtypes, j);
        Py_INCREF(d);
        e.dtypes.push_back(d);
    }
    e.runs = e.n > 0 && !e.dtypes.empty();
    Py_DECREF(r);
    return true;
}

// The inputs of one call as device arrays: host arrays (a Python scalar's 0-d array, a
// weight made from NumPy) replaced by their device copies. Holds what it made.
struct Inputs {
    PyObject* items[16];
    PyObject* made[16];
    Py_ssize_t m = 0, nmade = 0;
    ~Inputs() { for (Py_ssize_t i = 0; i < nmade; ++i) Py_DECREF(made[i]); }
};

// 1: `in` holds device arrays; 0: the fallback should run (no error); -1: an error.
int device_inputs(Launcher* self, PyObject* inputs, Inputs& in) {
    if (!PyList_Check(inputs) && !PyTuple_Check(inputs)) return 0;
    in.m = PySequence_Fast_GET_SIZE(inputs);
    if (in.m > 16) return 0;
    PyObject** items = PySequence_Fast_ITEMS(inputs);
    for (Py_ssize_t i = 0; i < in.m; ++i) {
        PyObject* x = items[i];
        if (reinterpret_cast<PyObject*>(Py_TYPE(x)) != g_ndarray) {
            if (self->upload == nullptr) return 0;
            x = PyObject_CallOneArg(self->upload, x);
            if (x == nullptr) return -1;
            in.made[in.nmade++] = x;
            if (reinterpret_cast<PyObject*>(Py_TYPE(x)) != g_ndarray) return 0;
        }
        in.items[i] = x;
    }
    return 1;
}

PyObject* launcher_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    Launcher* self = reinterpret_cast<Launcher*>(obj);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != nullptr || nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "a kernel is called as kernel(prim, inputs[, donors]).");
        return nullptr;
    }
    PyObject* prim = args[0];
    PyObject* inputs = args[1];
    Inputs in;
    int got_inputs = device_inputs(self, inputs, in);
    if (got_inputs < 0) return nullptr;
    if (got_inputs == 0) return run_fallback(self, prim, inputs);
    Py_ssize_t m = in.m;
    PyObject** ins = in.items;
    // The key: class, key object, then per input its dtype and shape.
    std::vector<intptr_t> key;
    key.reserve(3 + 6 * m);
    key.push_back(reinterpret_cast<intptr_t>(Py_TYPE(prim)));
    PyObject* kobj = nullptr;
    if (self->key_attr != nullptr) {
        kobj = PyObject_GetAttr(prim, self->key_attr);
        if (kobj == nullptr) { PyErr_Clear(); return run_fallback(self, prim, inputs); }
        key.push_back(reinterpret_cast<intptr_t>(kobj));
        Py_DECREF(kobj);  // the primitive holds it; the entry holds it below
    }
    key.push_back(m);
    PyObject* dtypes[16];
    for (Py_ssize_t i = 0; i < m; ++i) {
        PyObject* x = ins[i];
        PyObject* d = PyObject_GetAttr(x, s_dtype);
        PyObject* shape = d ? PyObject_GetAttr(x, s_shape) : nullptr;
        PyObject* strides = shape ? PyObject_GetAttr(x, s_strides) : nullptr;
        if (strides == nullptr || !PyTuple_Check(shape) || !PyTuple_Check(strides) ||
            PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides)) {
            Py_XDECREF(d);
            Py_XDECREF(shape);
            Py_XDECREF(strides);
            PyErr_Clear();
            return run_fallback(self, prim, inputs);
        }
        dtypes[i] = d;
        Py_DECREF(d);  // the array holds its dtype
        key.push_back(reinterpret_cast<intptr_t>(d));
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        key.push_back(nd);
        for (Py_ssize_t k = 0; k < nd; ++k) {
            key.push_back(PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, k)));
            key.push_back(PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, k)));
        }
        Py_DECREF(shape);
        Py_DECREF(strides);
        if (PyErr_Occurred()) { PyErr_Clear(); return run_fallback(self, prim, inputs); }
    }
    auto it = self->cache->find(key);
    if (it == self->cache->end()) {
        if (self->cache->size() > 4096) clear_cache(self->cache);
        // The planner sees the device inputs (the host ones uploaded).
        PyObject* seen = PyList_New(m);
        if (seen == nullptr) return nullptr;
        for (Py_ssize_t i = 0; i < m; ++i) { Py_INCREF(ins[i]); PyList_SET_ITEM(seen, i, ins[i]); }
        auto made = std::make_shared<Entry>();
        bool planned = plan(self, prim, seen, *made);
        Py_DECREF(seen);
        if (!planned) return nullptr;
        PyObject* hold = reinterpret_cast<PyObject*>(Py_TYPE(prim));
        Py_INCREF(hold);
        made->held.push_back(hold);
        if (kobj != nullptr) { Py_INCREF(kobj); made->held.push_back(kobj); }
        for (Py_ssize_t i = 0; i < m; ++i) { Py_INCREF(dtypes[i]); made->held.push_back(dtypes[i]); }
        it = self->cache->emplace(std::move(key), std::move(made)).first;
    }
    const std::shared_ptr<Entry> held = it->second;  // see Entry
    const Entry& e = *held;
    Py_ssize_t nout = static_cast<Py_ssize_t>(e.dtypes.size());
    if (!e.runs || m + nout + 1 > MAX_ARGS) return run_fallback(self, prim, inputs);
    uint64_t ptrs[MAX_ARGS];
    for (Py_ssize_t i = 0; i < m; ++i)
        if (!address(ins[i], &ptrs[i])) return nullptr;
    // The outputs: a donated input of the output's shape and dtype that owns its memory
    // (not a host input's upload), else a new array.
    PyObject* outs[MAX_ARGS];
    uint64_t used = 0;
    long long donated = 0;
    PyObject* donors = nargs == 3 ? args[2] : nullptr;
    Py_ssize_t nd = donors != nullptr && PyTuple_Check(donors) && in.nmade == 0
                        ? PyTuple_GET_SIZE(donors) : 0;
    for (Py_ssize_t j = 0; j < nout; ++j) {
        PyObject* got = nullptr;
        for (Py_ssize_t t = 0; t < nd && got == nullptr; ++t) {
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(donors, t));
            if (k < 0 || k >= m || ((used >> k) & 1) || !((e.full >> k) & 1)) {
                PyErr_Clear();
                continue;
            }
            if (dtypes[k] != e.dtypes[j] &&
                PyObject_RichCompareBool(dtypes[k], e.dtypes[j], Py_EQ) != 1) {
                PyErr_Clear();
                continue;
            }
            PyObject* base = PyObject_GetAttr(ins[k], s_base);
            if (base == Py_None) {
                got = ins[k];
                used |= uint64_t(1) << k;
            }
            Py_XDECREF(base);
            PyErr_Clear();
        }
        if (got != nullptr) {
            Py_INCREF(got);
            ++donated;
        } else {
            PyObject* call[2] = {e.shape, e.dtypes[j]};
            got = PyObject_Vectorcall(g_ndarray, call, 2, nullptr);
            if (got == nullptr) {
                for (Py_ssize_t q = 0; q < j; ++q) Py_DECREF(outs[q]);
                return nullptr;
            }
        }
        outs[j] = got;
        if (!address(got, &ptrs[m + j])) {
            for (Py_ssize_t q = 0; q <= j; ++q) Py_DECREF(outs[q]);
            return nullptr;
        }
    }
    void* stream;
    if (!current_stream(&stream)) {
        for (Py_ssize_t q = 0; q < nout; ++q) Py_DECREF(outs[q]);
        return nullptr;
    }
    // (inputs..., outputs..., long long n[, int nd, const long long* layout])
    long long n = e.n;
    int dims = e.nd;
    uint64_t layout = e.layout;
    void* params[MAX_ARGS + 3];
    for (Py_ssize_t i = 0; i < m + nout; ++i) params[i] = &ptrs[i];
    params[m + nout] = &n;
    params[m + nout + 1] = &dims;
    params[m + nout + 2] = &layout;
    CUresult rc = g_launch(e.fn, e.grid, 1, 1, e.block, 1, 1, 0, stream, params, nullptr);
    if (rc != 0) {
        for (Py_ssize_t q = 0; q < nout; ++q) Py_DECREF(outs[q]);
        PyObject* name = PyObject_GetAttr(prim, s_name);
        PyErr_Clear();
        launch_failed(rc, "%S: the launch of its generated CUDA kernel failed",
                      name != nullptr ? name : Py_None);
        Py_XDECREF(name);
        return nullptr;
    }
    count(self, e.nd < 0 ? s_k_contiguous : s_k_strided, 1);
    count(self, s_k_native, 1);
    count(self, s_k_donated, donated);
    if (nout == 1) return outs[0];
    PyObject* t = PyTuple_New(nout);
    if (t == nullptr) {
        for (Py_ssize_t q = 0; q < nout; ++q) Py_DECREF(outs[q]);
        return nullptr;
    }
    for (Py_ssize_t q = 0; q < nout; ++q) PyTuple_SET_ITEM(t, q, outs[q]);
    return t;
}

int launcher_traverse(PyObject* obj, visitproc visit, void* arg) {
    Launcher* self = reinterpret_cast<Launcher*>(obj);
    Py_VISIT(self->fallback);
    Py_VISIT(self->planner);
    Py_VISIT(self->key_attr);
    Py_VISIT(self->stats);
    Py_VISIT(self->upload);
    Py_VISIT(self->dict);
    return 0;
}

int launcher_clear(PyObject* obj) {
    Launcher* self = reinterpret_cast<Launcher*>(obj);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->planner);
    Py_CLEAR(self->key_attr);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->upload);
    Py_CLEAR(self->dict);
    if (self->cache != nullptr) clear_cache(self->cache);
    return 0;
}

void launcher_dealloc(PyObject* obj) {
    Launcher* self = reinterpret_cast<Launcher*>(obj);
    PyObject_GC_UnTrack(obj);
    launcher_clear(obj);
    delete self->cache;
    self->cache = nullptr;
    Py_TYPE(obj)->tp_free(obj);
}

PyObject* launcher_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    static const char* names[] = {"fallback", "planner", "key_attr", "stats", "upload", nullptr};
    PyObject *fallback, *planner, *key_attr = Py_None, *stats = Py_None, *upload = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OOO:Launcher", const_cast<char**>(names),
                                     &fallback, &planner, &key_attr, &stats, &upload))
        return nullptr;
    if (g_launch == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "Launcher: setup() has not found the CUDA driver.");
        return nullptr;
    }
    if (!PyCallable_Check(fallback) || !PyCallable_Check(planner) ||
        (key_attr != Py_None && !PyUnicode_Check(key_attr)) ||
        (stats != Py_None && !PyDict_Check(stats)) || (upload != Py_None && !PyCallable_Check(upload))) {
        PyErr_SetString(PyExc_TypeError, "Launcher(fallback: callable, planner: callable, "
                        "key_attr: str | None, stats: dict | None, upload: callable | None)");
        return nullptr;
    }
    Launcher* self = reinterpret_cast<Launcher*>(type->tp_alloc(type, 0));
    if (self == nullptr) return nullptr;
    self->vectorcall = launcher_call;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(planner); self->planner = planner;
    if (key_attr != Py_None) { Py_INCREF(key_attr); self->key_attr = key_attr; }
    if (stats != Py_None) { Py_INCREF(stats); self->stats = stats; }
    if (upload != Py_None) { Py_INCREF(upload); self->upload = upload; }
    self->cache = new Cache();
    return reinterpret_cast<PyObject*>(self);
}

PyObject* launcher_forget(PyObject* obj, PyObject*) {
    clear_cache(reinterpret_cast<Launcher*>(obj)->cache);
    Py_RETURN_NONE;
}

PyObject* launcher_size(PyObject* obj, PyObject*) {
    return PyLong_FromSize_t(reinterpret_cast<Launcher*>(obj)->cache->size());
}

PyMethodDef launcher_methods[] = {
    {"forget", launcher_forget, METH_NOARGS, "Drop the cached plans (the planner is asked again)."},
    {"cached", launcher_size, METH_NOARGS, "The number of cached keys."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject LauncherType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -- RawFunction: a kernel of CUDA C++ source launched from C++ -------------------------
// `RawFunction(raw_kernel)` stands for a `cupy.RawKernel` (CudaKernel.function): called as
// `fn(grid, block, args, shared_mem=0)` like it, with CuPy arrays passed as pointers and
// NumPy scalars by value; any other argument (a Python int, a CuPy pointer object) goes to
// the RawKernel itself, as do attribute reads and writes (max_dynamic_shared_size_bytes).
struct RawFunction {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject* raw;
    CUfunction fn;
};

bool dims3(PyObject* t, unsigned out[3]) {
    out[0] = out[1] = out[2] = 1;
    if (PyLong_Check(t)) {
        out[0] = static_cast<unsigned>(PyLong_AsUnsignedLong(t));
        return !PyErr_Occurred();
    }
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1 || PyTuple_GET_SIZE(t) > 3) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) {
        out[i] = static_cast<unsigned>(PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, i)));
        if (PyErr_Occurred()) { PyErr_Clear(); return false; }
    }
    return true;
}

PyObject* raw_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    RawFunction* self = reinterpret_cast<RawFunction*>(obj);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    auto delegate = [&]() { return PyObject_Vectorcall(self->raw, args, nargsf, kwnames); };
    unsigned shared = 0;
    Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 3 || nargs > 4 || nkw > 1 || (nkw == 1 && nargs == 4)) return delegate();
    PyObject* shm = nargs == 4 ? args[3] : nullptr;
    if (nkw == 1) {
        if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_shared_mem) != 0) return delegate();
        shm = args[3];
    }
    if (shm != nullptr) {
        shared = static_cast<unsigned>(PyLong_AsUnsignedLong(shm));
        if (PyErr_Occurred()) { PyErr_Clear(); return delegate(); }
    }
    unsigned grid[3], block[3];
    PyObject* list = args[2];
    if (!dims3(args[0], grid) || !dims3(args[1], block) ||
        (!PyTuple_Check(list) && !PyList_Check(list)))
        return delegate();
    Py_ssize_t n = PySequence_Fast_GET_SIZE(list);
    if (n > MAX_ARGS * 2) return delegate();
    PyObject** items = PySequence_Fast_ITEMS(list);
    alignas(16) unsigned char store[MAX_ARGS * 2][16];
    void* params[MAX_ARGS * 2];
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* x = items[i];
        params[i] = store[i];
        if (reinterpret_cast<PyObject*>(Py_TYPE(x)) == g_ndarray) {
            uint64_t p;
            if (!address(x, &p)) return nullptr;
            std::memcpy(store[i], &p, 8);
        } else if (g_generic != nullptr && PyObject_TypeCheck(x, reinterpret_cast<PyTypeObject*>(g_generic))) {
            Py_buffer view;
            if (PyObject_GetBuffer(x, &view, PyBUF_SIMPLE) < 0) { PyErr_Clear(); return delegate(); }
            bool fits = view.len > 0 && view.len <= 16;
            if (fits) std::memcpy(store[i], view.buf, static_cast<size_t>(view.len));
            PyBuffer_Release(&view);
            if (!fits) return delegate();
        } else {
            return delegate();
        }
    }
    if (self->fn == nullptr) {  // the RawKernel's function, loaded (compiled) on first use
        PyObject* k = PyObject_GetAttr(self->raw, s_kernel);
        PyObject* p = k != nullptr ? PyObject_GetAttr(k, s_ptr) : nullptr;
        Py_XDECREF(k);
        if (p == nullptr) return nullptr;
        self->fn = PyLong_AsVoidPtr(p);
        Py_DECREF(p);
        if (PyErr_Occurred()) { self->fn = nullptr; return nullptr; }
    }
    void* stream;
    if (!current_stream(&stream)) return nullptr;
    CUresult rc = g_launch(self->fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                           shared, stream, params, nullptr);
    if (rc != 0) {
        launch_failed(rc, "the launch of the CUDA kernel %R failed", self->raw);
        return nullptr;
    }
    Py_RETURN_NONE;
}

PyObject* raw_getattro(PyObject* obj, PyObject* name) {
    return PyObject_GetAttr(reinterpret_cast<RawFunction*>(obj)->raw, name);
}

int raw_setattro(PyObject* obj, PyObject* name, PyObject* value) {
    return PyObject_SetAttr(reinterpret_cast<RawFunction*>(obj)->raw, name, value);
}

int raw_traverse(PyObject* obj, visitproc visit, void* arg) {
    Py_VISIT(reinterpret_cast<RawFunction*>(obj)->raw);
    return 0;
}

int raw_clear(PyObject* obj) {
    Py_CLEAR(reinterpret_cast<RawFunction*>(obj)->raw);
    return 0;
}

void raw_dealloc(PyObject* obj) {
    PyObject_GC_UnTrack(obj);
    raw_clear(obj);
    Py_TYPE(obj)->tp_free(obj);
}

PyObject* raw_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    PyObject* raw;
    if (!PyArg_ParseTuple(args, "O:RawFunction", &raw)) return nullptr;
    if (g_launch == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "RawFunction: setup() has not found the CUDA driver.");
        return nullptr;
    }
    RawFunction* self = reinterpret_cast<RawFunction*>(type->tp_alloc(type, 0));
    if (self == nullptr) return nullptr;
    self->vectorcall = raw_call;
    Py_INCREF(raw);
    self->raw = raw;
    self->fn = nullptr;
    return reinterpret_cast<PyObject*>(self);
}

PyObject* raw_repr(PyObject* obj) {
    return PyUnicode_FromFormat("<RawFunction %R>", reinterpret_cast<RawFunction*>(obj)->raw);
}

PyTypeObject RawFunctionType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// setup(ndarray_type, current_stream, error_class, generic_type): find the driver's
// cuLaunchKernel.
PyObject* setup(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 4 || !PyType_Check(args[0]) || !PyCallable_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "setup(ndarray_type, current_stream, error_class, "
                        "generic_type)");
        return nullptr;
    }
    if (g_launch == nullptr) {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            PyErr_Format(PyExc_OSError, "the CUDA driver (libcuda.so.1) could not be loaded: %s",
                         dlerror());
            return nullptr;
        }
        g_launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
        g_error_string = reinterpret_cast<ErrorStringFn>(dlsym(lib, "cuGetErrorString"));
        if (g_launch == nullptr) {
            PyErr_SetString(PyExc_OSError, "the CUDA driver has no cuLaunchKernel.");
            return nullptr;
        }
    }
    for (int k = 0; k < 4; ++k) Py_INCREF(args[k]);
    Py_XSETREF(g_ndarray, args[0]);
    Py_XSETREF(g_stream_ptr, args[1]);
    Py_XSETREF(g_error, args[2]);
    Py_XSETREF(g_generic, args[3]);
    Py_RETURN_NONE;
}


// -- gemm: cuBLAS's GemmEx from C++ ---------------------------------------------------------
// backends/cuda/gemm.py plans a product (operations, sizes, leading dimensions, strides,
// types) and calls gemm() with the device addresses: one C call instead of ctypes' argument
// conversion. The library is the libcublas CuPy loaded (its path given to setup_cublas).
using SetStreamFn = int (*)(void*, void*);
using GemmExFn = int (*)(void*, int, int, int, int, int, const void*, const void*, int, int,
                         const void*, int, int, const void*, void*, int, int, int, int);
using GemmBatchedFn = int (*)(void*, int, int, int, int, int, const void*, const void*, int, int,
                              long long, const void*, int, int, long long, const void*, void*,
                              int, int, long long, int, int, int);
SetStreamFn g_set_stream = nullptr;
GemmExFn g_gemm = nullptr;
GemmBatchedFn g_gemm_batched = nullptr;

// setup_cublas(path): load the functions from the library at `path`.
PyObject* setup_cublas(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 1 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup_cublas(path)");
        return nullptr;
    }
    void* lib = dlopen(PyUnicode_AsUTF8(args[0]), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        PyErr_Format(PyExc_OSError, "cuBLAS could not be loaded: %s", dlerror());
        return nullptr;
    }
    g_set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    g_gemm = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    g_gemm_batched = reinterpret_cast<GemmBatchedFn>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    if (g_set_stream == nullptr || g_gemm == nullptr || g_gemm_batched == nullptr) {
        g_set_stream = nullptr;
        PyErr_SetString(PyExc_OSError, "cuBLAS lacks cublasGemmEx or cublasGemmStridedBatchedEx.");
        return nullptr;
    }
    Py_RETURN_NONE;
}

// gemm(handle, stream, op_b, op_a, n, m, k, b, ldb, stride_b, a, lda, stride_a, c, ldc,
//      stride_c, batches, dtype, compute, double_scalars) -> the cuBLAS status (0: done).
// Column-major C (n x m) = op(B) op(A) with alpha 1 and beta 0, one call or a strided batch.
PyObject* gemm(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 20 || g_set_stream == nullptr) {
        PyErr_SetString(PyExc_TypeError, "gemm(20 integers) after setup_cublas()");
        return nullptr;
    }
    long long v[20];
    for (int i = 0; i < 20; ++i) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return nullptr;
    }
    void* handle = reinterpret_cast<void*>(v[0]);
    int status = g_set_stream(handle, reinterpret_cast<void*>(v[1]));
    if (status != 0) return PyLong_FromLong(status);
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void* one = v[19] ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
    const void* zero = v[19] ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
    int op_b = int(v[2]), op_a = int(v[3]), nn = int(v[4]), m = int(v[5]), k = int(v[6]);
    int dtype = int(v[17]), compute = int(v[18]);
    const void* b = reinterpret_cast<const void*>(v[7]);
    const void* a = reinterpret_cast<const void*>(v[10]);
    void* c = reinterpret_cast<void*>(v[13]);
    if (v[16] == 1) {
        status = g_gemm(handle, op_b, op_a, nn, m, k, one, b, dtype, int(v[8]), a, dtype, int(v[11]),
                        zero, c, dtype, int(v[14]), compute, -1);
    } else {
        status = g_gemm_batched(handle, op_b, op_a, nn, m, k, one, b, dtype, int(v[8]), v[9], a,
                                dtype, int(v[11]), v[12], zero, c, dtype, int(v[14]), v[15],
                                int(v[16]), compute, -1);
    }
    return PyLong_FromLong(status);
}

PyMethodDef methods[] = {
    {"setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setup)), METH_FASTCALL,
     "setup(ndarray_type, current_stream, error_class, generic_type): load the CUDA driver's "
     "launch function; CuPy's array type, a function returning the current stream (its "
     "handle or an object with .ptr), the exception a failed launch raises, numpy.generic."},
    {"setup_cublas", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setup_cublas)),
     METH_FASTCALL, "setup_cublas(path): load cuBLAS's GEMMs from the library CuPy loaded."},
    {"gemm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(gemm)), METH_FASTCALL,
     "gemm(handle, stream, op_b, op_a, n, m, k, b, ldb, stride_b, a, lda, stride_a, c, ldc, "
     "stride_c, batches, dtype, compute, double_scalars) -> cuBLAS's status."},
    {nullptr, nullptr, 0, nullptr}};

// Ready `t` (its own slots set) as a garbage-collected vectorcall type named `name` (the last
// dotted part is its name in module `m`) and add it to `m`.
void add_type(PyObject* m, PyTypeObject& t, const char* name, Py_ssize_t size,
              Py_ssize_t vectorcall_offset) {
    t.tp_name = name;
    t.tp_basicsize = size;
    t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
    t.tp_vectorcall_offset = vectorcall_offset;
    t.tp_call = PyVectorcall_Call;
    if (PyType_Ready(&t) < 0) throw nanobind::python_error();
    Py_INCREF(&t);
    if (PyModule_AddObject(m, std::strrchr(name, '.') + 1, reinterpret_cast<PyObject*>(&t)) < 0)
        throw nanobind::python_error();
}

}  // namespace

NB_MODULE(_native, m) {
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_data = PyUnicode_InternFromString("data");
    s_ptr = PyUnicode_InternFromString("ptr");
    s_base = PyUnicode_InternFromString("base");
    s_strides = PyUnicode_InternFromString("strides");
    s_name = PyUnicode_InternFromString("name");
    s_kernel = PyUnicode_InternFromString("kernel");
    s_shared_mem = PyUnicode_InternFromString("shared_mem");
    s_k_contiguous = PyUnicode_InternFromString("contiguous");
    s_k_native = PyUnicode_InternFromString("native");
    s_k_strided = PyUnicode_InternFromString("strided");
    s_k_donated = PyUnicode_InternFromString("donated");
    LauncherType.tp_dictoffset = offsetof(Launcher, dict);
    LauncherType.tp_new = launcher_new;
    LauncherType.tp_traverse = launcher_traverse;
    LauncherType.tp_clear = launcher_clear;
    LauncherType.tp_dealloc = launcher_dealloc;
    LauncherType.tp_methods = launcher_methods;
    LauncherType.tp_getattro = PyObject_GenericGetAttr;
    LauncherType.tp_setattro = PyObject_GenericSetAttr;
    LauncherType.tp_doc = "A cuda kernel launching generated element-wise kernels from C++, in "
                          "front of a Python kernel (fallback).";
    add_type(m.ptr(), LauncherType, "lazyx.backends.cuda._native.Launcher", sizeof(Launcher),
             offsetof(Launcher, vectorcall));
    RawFunctionType.tp_new = raw_new;
    RawFunctionType.tp_traverse = raw_traverse;
    RawFunctionType.tp_clear = raw_clear;
    RawFunctionType.tp_dealloc = raw_dealloc;
    RawFunctionType.tp_getattro = raw_getattro;
    RawFunctionType.tp_setattro = raw_setattro;
    RawFunctionType.tp_repr = raw_repr;
    RawFunctionType.tp_doc = "A cupy.RawKernel launched from C++ (CuPy arrays and NumPy scalars); "
                             "anything else, and its attributes, go to the RawKernel.";
    add_type(m.ptr(), RawFunctionType, "lazyx.backends.cuda._native.RawFunction",
             sizeof(RawFunction), offsetof(RawFunction, vectorcall));
    if (PyModule_AddFunctions(m.ptr(), methods) < 0) throw nanobind::python_error();
}
