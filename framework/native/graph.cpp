// lazyx._graph: the per-operation hot path of the core, in C++ (issue 16, item 1).
//
// Every op builds one node (`lazy`) and every evaluation walks the graph
// (`unevaluated_order`) and runs its nodes (`run`). In Python those three cost about
// 1.5 µs per operation on a small machine, more than NumPy's own ufunc call; here they
// cost a few tens of nanoseconds. They do exactly what the Python versions in
// lazyx/array.py and lazyx/scheduler.py do — those remain the reference, run where this
// module is not built, and the tests check that both give the same graphs and results.
//
// How it is fast:
// * The array's attributes are __slots__: `setup` reads each slot's offset from its
//   member descriptor once, and the functions below read and write the slots at those
//   offsets (with the same reference counting CPython's member descriptors do), after
//   checking that the object is an array.
// * The functions are METH_FASTCALL (vectorcall) functions added to the nanobind
//   module, so a call costs no argument tuple or keyword parsing.
// * The common case of a node is handled here: a kernel that returns one NumPy array of
//   the promised shape and dtype, or one device buffer of them from a kernel that says it
//   returns device buffers (`device_outputs`). Everything else (several outputs, a wrong
//   output) goes to the Python function `finish` that the scheduler passes in, so there
//   is one implementation of the rare and error paths.
// * Donation: a kernel that takes donors (`donates`, the protocol of compile's plans,
//   lazyx/transforms/compile.py) gets a third argument, the positions of the inputs that
//   nothing but this node reads any more, whose buffers it may write its output into.
//
// Nothing here owns state beyond the offsets and the interned attribute names.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <nanobind/nanobind.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <unordered_map>
#include <utility>
#include <unordered_set>
#include <vector>

namespace {

PyTypeObject* g_array = nullptr;  // lazyx.array.array (a strong reference)
Py_ssize_t off_shape = -1, off_dtype = -1, off_data = -1, off_prim = -1, off_inputs = -1,
           off_siblings = -1;
PyTypeObject* g_primitive = nullptr;  // lazyx.primitive.Primitive
Py_ssize_t off_stream = -1;
PyObject* s_stream = nullptr;  // interned "stream", "kind", "np", "small_ufunc", "small_limit"
PyObject* s_kind = nullptr;
PyObject* s_np = nullptr;
PyObject* s_small_ufunc = nullptr;
PyObject* s_small_limit = nullptr;
PyObject* s_small_native = nullptr;
PyObject* s_donates = nullptr;  // interned "donates", "device_outputs", "shape", "dtype"
PyObject* s_device_outputs = nullptr;
PyObject* s_shape = nullptr;
PyObject* s_dtype = nullptr;

// What a kernel declares for small inputs (lazyx.backend.Backend docs, "small_ufunc"):
// for inputs that are all NumPy arrays of fewer than `limit` elements, the kernel is
// `ufunc(*inputs)`, which run() then calls directly. Keyed by the kernel, which the
// cache keeps alive (so an address is never reused while it is a key).
// A kernel may also carry `small_native`, a PyCapsule "lazyx.small_kernel" of a C
// function that runs small inputs without the ufunc's dispatch (or declines: nullptr
// with no error set); see backends/cpu/native/small.cpp.
using SmallFn = PyObject* (*)(PyObject* const*, Py_ssize_t);
// What else a kernel declares, read once per kernel with the above: `donates` (it takes
// donors, see run()) and `device_outputs` (it returns device buffers with `shape` and
// `dtype` attributes; run() stores one of the promised shape and dtype itself).
struct Small {
    PyObject* ufunc;  // nullptr: the kernel declares nothing
    npy_intp limit;
    SmallFn native;   // nullptr: none
    bool donates;
    bool device;
};
std::unordered_map<PyObject*, Small> g_small;

const Small& small_of(PyObject* kernel) {
    auto it = g_small.find(kernel);
    if (it != g_small.end()) return it->second;
    if (g_small.size() > 4096) {  // backends swapped many times: start again
        for (auto& kv : g_small) { Py_DECREF(kv.first); Py_XDECREF(kv.second.ufunc); }
        g_small.clear();
    }
    Small info{nullptr, 0, nullptr, false, false};
    for (int k = 0; k < 2; ++k) {
        PyObject* flag = PyObject_GetAttr(kernel, k ? s_device_outputs : s_donates);
        int on = flag != nullptr ? PyObject_IsTrue(flag) : 0;
        Py_XDECREF(flag);
        PyErr_Clear();
        (k ? info.device : info.donates) = on > 0;
    }
    PyObject* u = PyObject_GetAttr(kernel, s_small_ufunc);
    PyObject* l = u ? PyObject_GetAttr(kernel, s_small_limit) : nullptr;
    if (u && l && u != Py_None && PyLong_Check(l)) {
        info.ufunc = u;
        info.limit = static_cast<npy_intp>(PyLong_AsSsize_t(l));
        u = nullptr;
        PyObject* cap = PyObject_GetAttr(kernel, s_small_native);
        if (cap != nullptr && PyCapsule_IsValid(cap, "lazyx.small_kernel"))
            info.native = reinterpret_cast<SmallFn>(PyCapsule_GetPointer(cap, "lazyx.small_kernel"));
        Py_XDECREF(cap);  // the kernel's attribute keeps the capsule (and its module) alive
    }
    PyErr_Clear();
    Py_XDECREF(u);
    Py_XDECREF(l);
    Py_INCREF(kernel);
    return g_small.emplace(kernel, info).first->second;
}

inline PyObject*& slot(PyObject* o, Py_ssize_t off) {
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + off);
}

// Set a slot, dropping the old value (as a member descriptor's setter does).
inline void set_slot(PyObject* o, Py_ssize_t off, PyObject* v) {
    PyObject* old = slot(o, off);
    Py_XINCREF(v);
    slot(o, off) = v;
    Py_XDECREF(old);
}

inline bool is_array(PyObject* o) { return PyObject_TypeCheck(o, g_array); }

bool ready() {
    if (g_array == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "lazyx._graph.setup(array) was not called.");
        return false;
    }
    return true;
}

Py_ssize_t slot_offset(PyObject* type, const char* name) {
    PyObject* d = PyDict_GetItemString(reinterpret_cast<PyTypeObject*>(type)->tp_dict, name);
    if (d == nullptr || Py_TYPE(d) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "lazyx._graph.setup: %R has no slot %s.", type, name);
        return -1;
    }
    PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
    if (m->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "lazyx._graph.setup: slot %s is not an object slot.", name);
        return -1;
    }
    return m->offset;
}

// setup(array_type, primitive_type): read the slot offsets of lazyx.array.array and
// lazyx.primitive.Primitive.
PyObject* setup(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup(array_type, primitive_type)");
        return nullptr;
    }
    Py_ssize_t ps = slot_offset(args[1], "stream");
    if (ps < 0) return nullptr;
    PyObject* t = args[0];
    Py_ssize_t offs[6];
    const char* names[6] = {"_shape", "_dtype", "_data", "_prim", "_inputs", "_siblings"};
    for (int i = 0; i < 6; ++i)
        if ((offs[i] = slot_offset(t, names[i])) < 0) return nullptr;
    Py_INCREF(t);
    Py_XDECREF(reinterpret_cast<PyObject*>(g_array));
    g_array = reinterpret_cast<PyTypeObject*>(t);
    off_shape = offs[0]; off_dtype = offs[1]; off_data = offs[2];
    off_prim = offs[3]; off_inputs = offs[4]; off_siblings = offs[5];
    Py_INCREF(args[1]);
    Py_XDECREF(reinterpret_cast<PyObject*>(g_primitive));
    g_primitive = reinterpret_cast<PyTypeObject*>(args[1]);
    off_stream = ps;
    Py_RETURN_NONE;
}

// lazy(shape, dtype, prim, inputs) -> a new unevaluated array (lazyx.array.lazy).
PyObject* lazy(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "lazy(shape, dtype, prim, inputs) takes 4 arguments.");
        return nullptr;
    }
    PyObject* a = g_array->tp_alloc(g_array, 0);
    if (a == nullptr) return nullptr;
    Py_INCREF(args[0]); slot(a, off_shape) = args[0];
    Py_INCREF(args[1]); slot(a, off_dtype) = args[1];
    Py_INCREF(Py_None); slot(a, off_data) = Py_None;
    Py_INCREF(args[2]); slot(a, off_prim) = args[2];
    Py_INCREF(args[3]); slot(a, off_inputs) = args[3];
    Py_INCREF(Py_None); slot(a, off_siblings) = Py_None;
    return a;
}

// node(cls, stream, shape, dtype, inputs) -> lazy(shape, dtype, cls(stream), inputs), for
// a primitive class without parameters or an __init__ of its own (the op functions
// check that once), whose instance is then just its stream.
PyObject* node(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (n != 5 || !PyType_Check(args[0]) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[0]), g_primitive)) {
        PyErr_SetString(PyExc_TypeError, "node(primitive_class, stream, shape, dtype, inputs)");
        return nullptr;
    }
    PyTypeObject* cls = reinterpret_cast<PyTypeObject*>(args[0]);
    PyObject* p = cls->tp_alloc(cls, 0);
    if (p == nullptr) return nullptr;
    Py_INCREF(args[1]);
    slot(p, off_stream) = args[1];
    PyObject* lazy_args[4] = {args[2], args[3], p, args[4]};
    PyObject* a = lazy(nullptr, lazy_args, 4);
    Py_DECREF(p);
    return a;
}

inline bool unevaluated(PyObject* a) { return slot(a, off_data) == Py_None; }

// A node's inputs: a tuple (what op functions give) or a list; anything else is refused.
inline bool inputs_of(PyObject* a, Py_ssize_t* m, PyObject*** items) {
    PyObject* ins = slot(a, off_inputs);
    if (PyTuple_Check(ins) || PyList_Check(ins)) {
        *m = PySequence_Fast_GET_SIZE(ins);
        *items = PySequence_Fast_ITEMS(ins);
        return true;
    }
    PyErr_Format(PyExc_TypeError, "lazyx scheduler: a node's inputs must be a tuple of arrays, "
                 "got %R (from lazyx.extend.lazy).", Py_TYPE(ins));
    return false;
}

// unevaluated_order(roots) -> the unevaluated nodes the roots depend on, inputs
// first, each once (one array stands for a multi-output node). Iterative.
PyObject* unevaluated_order(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (!ready()) return nullptr;
    if (n != 1) {
        PyErr_SetString(PyExc_TypeError, "unevaluated_order(roots)");
        return nullptr;
    }
    PyObject* seq = PySequence_Fast(args[0], "unevaluated_order: roots must be a sequence");
    if (seq == nullptr) return nullptr;
    PyObject* order = PyList_New(0);
    if (order == nullptr) { Py_DECREF(seq); return nullptr; }
    std::unordered_set<PyObject*> seen;
    std::vector<std::pair<PyObject*, Py_ssize_t>> stack;
    Py_ssize_t nr = PySequence_Fast_GET_SIZE(seq);
    PyObject** roots = PySequence_Fast_ITEMS(seq);
    auto bad = [&](PyObject* o) {
        PyErr_Format(PyExc_TypeError, "lazyx scheduler: %R is not a lazyx array.", Py_TYPE(o));
        Py_DECREF(seq);
        Py_DECREF(order);
        return nullptr;
    };
    for (Py_ssize_t r = 0; r < nr; ++r) {
        PyObject* root = roots[r];
        if (!is_array(root)) return bad(root);
        if (!unevaluated(root) || seen.count(root)) continue;
        stack.emplace_back(root, 0);
        while (!stack.empty()) {
            auto [a, i] = stack.back();
            stack.pop_back();
            Py_ssize_t m;
            PyObject** ins;
            if (!inputs_of(a, &m, &ins)) {
                Py_DECREF(seq);
                Py_DECREF(order);
                return nullptr;
            }
            bool descended = false;
            while (i < m) {
                PyObject* x = ins[i];
                ++i;
                if (!is_array(x)) return bad(x);
                if (unevaluated(x) && !seen.count(x)) {
                    stack.emplace_back(a, i);
                    stack.emplace_back(x, 0);
                    descended = true;
                    break;
                }
            }
            if (descended) continue;
            PyObject* sib = slot(a, off_siblings);
            if (sib == Py_None || !PyTuple_Check(sib)) {
                seen.insert(a);
            } else {
                for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(sib); ++s)
                    seen.insert(PyTuple_GET_ITEM(sib, s));
            }
            if (PyList_Append(order, a) < 0) {
                Py_DECREF(seq);
                Py_DECREF(order);
                return nullptr;
            }
        }
    }
    Py_DECREF(seq);
    return order;
}

// structure(order, roots, classes, class_info) -> (parts, leaf_signature, kept, leaves)
// or None: the structure of the graph of `order` (from unevaluated_order), for eager
// replay (lazyx/transforms/replay.py, whose `_structure` is the reference and says
// what each part is). `classes` is the dict {primitive class: parameter getter or
// False}; `class_info(cls)` fills it for a class not in it. None: a node is not
// replayed (its class refuses, or a stream differs from the first node's).
PyObject* structure(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (!ready()) return nullptr;
    if (n != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "structure(order: list, roots, classes: dict, class_info)");
        return nullptr;
    }
    PyObject* order = args[0];
    PyObject* classes = args[2];
    PyObject* class_info = args[3];
    Py_ssize_t nn = PyList_GET_SIZE(order);
    if (nn == 0) Py_RETURN_NONE;
    PyObject* rseq = PySequence_Fast(args[1], "structure: roots must be a sequence");
    if (rseq == nullptr) return nullptr;
    // Node outputs: code k * 65536 + j (k: node position, j: output position); leaves:
    // -(number + 1).
    std::unordered_map<PyObject*, long long> where;
    std::unordered_map<PyObject*, Py_ssize_t> uses;
    where.reserve(static_cast<size_t>(nn) * 3);
    PyObject* leaves = PyList_New(0);
    PyObject* parts = PyTuple_New(nn);
    PyObject* result = nullptr;
    PyObject* stream0 = nullptr;
    auto fail = [&]() -> PyObject* {
        Py_DECREF(rseq);
        Py_XDECREF(leaves);
        Py_XDECREF(parts);
        return nullptr;
    };
    auto refuse = [&]() -> PyObject* {
        Py_DECREF(rseq);
        Py_XDECREF(leaves);
        Py_XDECREF(parts);
        Py_RETURN_NONE;
    };
    if (leaves == nullptr || parts == nullptr) return fail();
    for (Py_ssize_t k = 0; k < nn; ++k) {
        PyObject* a = PyList_GET_ITEM(order, k);
        if (!is_array(a)) {
            PyErr_SetString(PyExc_TypeError, "structure: order holds a non-array");
            return fail();
        }
        PyObject* prim = slot(a, off_prim);
        PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(prim));
        if (!PyObject_TypeCheck(prim, g_primitive)) return refuse();
        PyObject* getter = PyDict_GetItemWithError(classes, cls);  // borrowed
        PyObject* owned = nullptr;
        if (getter == nullptr) {
            if (PyErr_Occurred()) return fail();
            owned = getter = PyObject_CallOneArg(class_info, cls);
            if (getter == nullptr) return fail();
        }
        if (getter == Py_False) { Py_XDECREF(owned); return refuse(); }
        PyObject* stream = slot(prim, off_stream);
        if (stream0 == nullptr) {
            stream0 = stream;
        } else if (stream != stream0) {
            int eq = PyObject_RichCompareBool(stream, stream0, Py_EQ);
            if (eq < 0) { Py_XDECREF(owned); return fail(); }
            if (eq == 0) { Py_XDECREF(owned); return refuse(); }
        }
        PyObject* params = PyObject_CallOneArg(getter, prim);
        Py_XDECREF(owned);
        if (params == nullptr) return fail();
        // An array among the parameters: not a key (it would be kept alive, and compared
        // by value); the node is not replayed.
        bool holds_array = is_array(params);
        if (PyTuple_Check(params))
            for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(params) && !holds_array; ++q)
                holds_array = is_array(PyTuple_GET_ITEM(params, q));
        if (holds_array) { Py_DECREF(params); return refuse(); }
        Py_ssize_t m;
        PyObject** ins;
        if (!inputs_of(a, &m, &ins)) { Py_DECREF(params); return fail(); }
        PyObject* refs = PyTuple_New(m);
        if (refs == nullptr) { Py_DECREF(params); return fail(); }
        for (Py_ssize_t i = 0; i < m; ++i) {
            PyObject* x = ins[i];
            long long code;
            auto it = where.find(x);
            if (it == where.end()) {
                code = -static_cast<long long>(PyList_GET_SIZE(leaves)) - 1;
                if (PyList_Append(leaves, x) < 0) { Py_DECREF(params); Py_DECREF(refs); return fail(); }
                where.emplace(x, code);
            } else {
                code = it->second;
                if (code >= 0) ++uses[x];
            }
            PyObject* c = PyLong_FromLongLong(code);
            if (c == nullptr) { Py_DECREF(params); Py_DECREF(refs); return fail(); }
            PyTuple_SET_ITEM(refs, i, c);
        }
        PyObject* sib = slot(a, off_siblings);
        PyObject* part;
        if (sib == Py_None || !PyTuple_Check(sib)) {
            where[a] = static_cast<long long>(k) * 65536;
            part = PyTuple_Pack(5, cls, params, refs, slot(a, off_shape), slot(a, off_dtype));
        } else {
            Py_ssize_t ns = PyTuple_GET_SIZE(sib);
            PyObject* outs = PyTuple_New(ns);
            if (outs == nullptr) { Py_DECREF(params); Py_DECREF(refs); return fail(); }
            for (Py_ssize_t j = 0; j < ns; ++j) {
                PyObject* o = PyTuple_GET_ITEM(sib, j);
                where[o] = static_cast<long long>(k) * 65536 + j;
                PyObject* sd = PyTuple_Pack(2, slot(o, off_shape), slot(o, off_dtype));
                if (sd == nullptr) { Py_DECREF(outs); Py_DECREF(params); Py_DECREF(refs); return fail(); }
                PyTuple_SET_ITEM(outs, j, sd);
            }
            part = PyTuple_Pack(4, cls, params, refs, outs);
            Py_DECREF(outs);
        }
        Py_DECREF(params);
        Py_DECREF(refs);
        if (part == nullptr) return fail();
        PyTuple_SET_ITEM(parts, k, part);
    }
    // The kept outputs: asked for, or referenced by more than the graph's own references
    // (the order list holds each node's first output; a siblings tuple each sibling; the
    // graph's input tuples each use).
    std::unordered_set<PyObject*> asked;
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(rseq); ++r)
        asked.insert(PySequence_Fast_GET_ITEM(rseq, r));
    PyObject* kept = PyList_New(0);
    PyObject* leaf_sig = nullptr;
    if (kept == nullptr) return fail();
    for (Py_ssize_t k = 0; k < nn; ++k) {
        PyObject* a = PyList_GET_ITEM(order, k);
        PyObject* sib = slot(a, off_siblings);
        bool single = sib == Py_None || !PyTuple_Check(sib);
        Py_ssize_t ns = single ? 1 : PyTuple_GET_SIZE(sib);
        for (Py_ssize_t j = 0; j < ns; ++j) {
            PyObject* o = single ? a : PyTuple_GET_ITEM(sib, j);
            auto u = uses.find(o);
            Py_ssize_t base = (o == a ? 1 : 0) + (single ? 0 : 1) + (u == uses.end() ? 0 : u->second);
            if (asked.count(o) || Py_REFCNT(o) > base) {
                PyObject* kj = Py_BuildValue("(nn)", k, j);
                if (kj == nullptr || PyList_Append(kept, kj) < 0) {
                    Py_XDECREF(kj);
                    Py_DECREF(kept);
                    return fail();
                }
                Py_DECREF(kj);
            }
        }
    }
    Py_ssize_t nl = PyList_GET_SIZE(leaves);
    leaf_sig = PyTuple_New(nl);
    if (leaf_sig == nullptr) { Py_DECREF(kept); return fail(); }
    for (Py_ssize_t i = 0; i < nl; ++i) {
        PyObject* x = PyList_GET_ITEM(leaves, i);
        PyObject* sig = PyTuple_Pack(3, slot(x, off_shape), slot(x, off_dtype),
                                     reinterpret_cast<PyObject*>(Py_TYPE(slot(x, off_data))));
        if (sig == nullptr) { Py_DECREF(kept); Py_DECREF(leaf_sig); return fail(); }
        PyTuple_SET_ITEM(leaf_sig, i, sig);
    }
    PyObject* kept_t = PyList_AsTuple(kept);
    Py_DECREF(kept);
    if (kept_t == nullptr) { Py_DECREF(leaf_sig); return fail(); }
    result = PyTuple_Pack(4, parts, leaf_sig, kept_t, leaves);
    Py_DECREF(leaf_sig);
    Py_DECREF(kept_t);
    Py_DECREF(rseq);
    Py_DECREF(leaves);
    Py_DECREF(parts);
    return result;
}

// Whether NumPy array `out` has exactly `shape` (a tuple of ints) and the dtype `want`.
inline bool matches(PyObject* out, PyObject* shape, PyObject* want) {
    PyArrayObject* o = reinterpret_cast<PyArrayObject*>(out);
    int nd = PyArray_NDIM(o);
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != nd) return false;
    npy_intp* dims = PyArray_DIMS(o);
    for (int d = 0; d < nd; ++d) {
        PyObject* v = PyTuple_GET_ITEM(shape, d);
        if (!PyLong_CheckExact(v)) return false;
        int overflow = 0;
        long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || s != static_cast<long long>(dims[d])) return false;
    }
    PyObject* descr = reinterpret_cast<PyObject*>(PyArray_DESCR(o));
    if (descr == want) return true;
    int eq = PyObject_RichCompareBool(descr, want, Py_EQ);
    if (eq < 0) { PyErr_Clear(); return false; }
    return eq == 1;
}

// Store the output `out` (a reference taken) as `a`'s data and detach the node.
inline void store(PyObject* a, PyObject* out) {
    PyObject* old = slot(a, off_data);
    slot(a, off_data) = out;
    Py_XDECREF(old);
    set_slot(a, off_prim, Py_None);
    set_slot(a, off_inputs, Py_None);
}

// run(order, tables, keep, check, finish, failed): run the nodes of `order` (from
// unevaluated_order) in order, as lazyx.scheduler.eval_arrays's loop does.
//   tables  the dispatch tables indexed by Stream.kind (lazyx.backend.dispatch_tables)
//   keep    whether the graph is retained (then `finish` does the bookkeeping)
//   check   None, or check(prim, a) run after each kernel (the tests' shape-rule check)
//   finish  finish(prim, a, out) for every node this loop does not finish itself
//   failed  a one-element list: the node whose kernel raised is stored there
PyObject* run(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (!ready()) return nullptr;
    if (n != 6 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "run(order, tables, keep, check, finish, failed)");
        return nullptr;
    }
    PyObject* order = args[0];
    PyObject* tables = args[1];
    int keep = PyObject_IsTrue(args[2]);
    if (keep < 0) return nullptr;
    PyObject* check = args[3] == Py_None ? nullptr : args[3];
    PyObject* finish = args[4];
    PyObject* failed = args[5];
    Py_ssize_t count = PyList_GET_SIZE(order);
    for (Py_ssize_t k = 0; k < count; ++k) {
        PyObject* a = PyList_GET_ITEM(order, k);  // take the walk's reference
        Py_INCREF(Py_None);
        PyList_SET_ITEM(order, k, Py_None);
        PyObject* prim = slot(a, off_prim);
        if (prim == Py_None || prim == nullptr) {  // a sibling evaluated it already
            Py_DECREF(a);
            continue;
        }
        Py_INCREF(prim);
        PyObject* out = nullptr;
        PyObject* kernel = nullptr;
        PyObject* ins_data = nullptr;
        {
            // kernel = tables[prim.stream.kind][type(prim)]
            PyObject* stream = PyObject_GetAttr(prim, s_stream);
            PyObject* kind = stream ? PyObject_GetAttr(stream, s_kind) : nullptr;
            Py_XDECREF(stream);
            PyObject* table = kind ? PyObject_GetItem(tables, kind) : nullptr;
            Py_XDECREF(kind);
            if (table != nullptr) {
                PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(prim));
                kernel = PyDict_Check(table) ? PyDict_GetItemWithError(table, cls) : nullptr;
                if (kernel != nullptr) Py_INCREF(kernel);
                else if (!PyErr_Occurred()) kernel = PyObject_GetItem(table, cls);  // __missing__
                Py_DECREF(table);
            }
        }
        Py_ssize_t m = 0;
        PyObject** ins = nullptr;
        if (kernel != nullptr && !inputs_of(a, &m, &ins)) Py_CLEAR(kernel);
        const Small* info = kernel != nullptr ? &small_of(kernel) : nullptr;
        if (kernel != nullptr && m <= 3) {
            const Small& sm = *info;
            if (sm.ufunc != nullptr) {
                PyObject* data[3];
                bool small = true;
                for (Py_ssize_t i = 0; i < m && small; ++i) {
                    data[i] = slot(ins[i], off_data);
                    small = PyArray_CheckExact(data[i]) &&
                            PyArray_SIZE(reinterpret_cast<PyArrayObject*>(data[i])) < sm.limit;
                }
                if (small) {
                    if (sm.native != nullptr) out = sm.native(data, m);
                    if (out == nullptr && !PyErr_Occurred())
                        out = PyObject_Vectorcall(sm.ufunc, data, m, nullptr);
                    Py_CLEAR(kernel);
                    if (out == nullptr) {
                        PyList_SetItem(failed, 0, a);
                        Py_DECREF(prim);
                        return nullptr;
                    }
                }
            }
        }
        if (kernel != nullptr) {
            ins_data = PyList_New(m);
            // Donors: an input array held by this node's input tuple alone (once), the tuple
            // by this node alone, the array's buffer by the array alone, and no sibling of a
            // multi-output node: nothing can read that buffer after this node (as compile's
            // _donors decides for its plans; the kernel checks the buffer's own fitness).
            Py_ssize_t dead[64];
            Py_ssize_t nd = 0;
            if (ins_data != nullptr && info->donates && !keep &&
                Py_REFCNT(slot(a, off_inputs)) == 1) {
                for (Py_ssize_t i = 0; i < m && i < 64; ++i) {
                    PyObject* x = ins[i];
                    if (Py_REFCNT(x) == 1 && Py_REFCNT(slot(x, off_data)) == 1 &&
                        slot(x, off_siblings) == Py_None)
                        dead[nd++] = i;
                }
            }
            PyObject* donors = nd > 0 ? PyTuple_New(nd) : nullptr;  // the positions
            for (Py_ssize_t j = 0; j < nd && donors != nullptr; ++j) {
                PyObject* pos = PyLong_FromSsize_t(dead[j]);
                if (pos == nullptr) Py_CLEAR(donors);
                else PyTuple_SET_ITEM(donors, j, pos);
            }
            if (nd > 0 && donors == nullptr) PyErr_Clear();  // none then: the kernel allocates
            if (ins_data != nullptr) {
                for (Py_ssize_t i = 0; i < m; ++i) {
                    PyObject* d = slot(ins[i], off_data);
                    Py_INCREF(d);
                    PyList_SET_ITEM(ins_data, i, d);
                }
                PyObject* call[3] = {prim, ins_data, donors};
                out = PyObject_Vectorcall(kernel, call, donors != nullptr ? 3 : 2, nullptr);
                Py_DECREF(ins_data);
            }
            Py_XDECREF(donors);
            Py_DECREF(kernel);
        }
        if (out != nullptr && check != nullptr) {
            PyObject* call[2] = {prim, a};
            PyObject* r = PyObject_Vectorcall(check, call, 2, nullptr);
            if (r == nullptr) Py_CLEAR(out);
            else Py_DECREF(r);
        }
        if (out == nullptr) {
            PyList_SetItem(failed, 0, a);  // steals the walk's reference
            Py_DECREF(prim);
            return nullptr;
        }
        bool done = false;
        if (!keep && slot(a, off_siblings) == Py_None && info != nullptr && info->device &&
            !PyArray_Check(out) && !PyArray_IsAnyScalar(out) && !PyTuple_Check(out) &&
            !PyList_Check(out)) {
            // A device buffer: its shape (a tuple) and dtype are compared with the promise.
            PyObject* shape = PyObject_GetAttr(out, s_shape);
            PyObject* dtype = shape ? PyObject_GetAttr(out, s_dtype) : nullptr;
            PyObject* want = dtype ? PyObject_GetAttr(slot(a, off_dtype), s_np) : nullptr;
            if (want != nullptr) {
                done = (dtype == want || PyObject_RichCompareBool(dtype, want, Py_EQ) == 1) &&
                       PyObject_RichCompareBool(shape, slot(a, off_shape), Py_EQ) == 1;
            }
            PyErr_Clear();
            Py_XDECREF(shape);
            Py_XDECREF(dtype);
            Py_XDECREF(want);
            if (done) store(a, out);
        }
        if (!done && !keep && slot(a, off_siblings) == Py_None && PyArray_CheckExact(out)) {
            PyObject* want = PyObject_GetAttr(slot(a, off_dtype), s_np);
            if (want == nullptr) {
                PyErr_Clear();
            } else {
                done = matches(out, slot(a, off_shape), want);
                Py_DECREF(want);
            }
            if (done) store(a, out);
        }
        if (!done) {
            PyObject* call[3] = {prim, a, out};
            PyObject* r = PyObject_Vectorcall(finish, call, 3, nullptr);
            Py_DECREF(out);
            if (r == nullptr) {
                PyList_SetItem(failed, 0, a);
                Py_DECREF(prim);
                return nullptr;
            }
            Py_DECREF(r);
        }
        Py_DECREF(prim);
        Py_DECREF(a);
    }
    Py_RETURN_NONE;
}


// -- element-wise op functions ------------------------------------------------------
// An op function of plugins/elementwise.py (`mx.multiply`, `array.__mul__`) does, in
// the common case, a few checks and one node: both operands lazyx arrays of one dtype
// and one shape, the dtype's rule "no cast", no stream given. ElementwiseOp is that
// case in C++ in front of the Python function (`py_op`), which it calls for everything
// else (Python scalars, casts, broadcasting, a stream, errors), so there is one
// implementation of the op's semantics. It behaves as the function: attribute reads
// and writes go to `py_op` (`__name__`, `__doc__`, `__wrapped__` is `py_op` itself, so
// `inspect.signature` sees its signature), and as a class attribute it binds like a
// method (Py_TPFLAGS_METHOD_DESCRIPTOR: `x * y` calls it with x first, no bound object).
struct ElementwiseOp {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject* py_op;   // the Python op function
    PyObject* cls;     // the primitive class (no parameters, no __init__: node() applies)
    PyObject* table;   // dict: dtype -> (cast to or None, output dtype) | None | message
    PyObject* tls;     // lazyx.device.thread_state (its `stream`: the current stream)
    PyObject* constant;  // constant(value, dtype): a Python scalar's array; nullptr: none
    int arity;
};

PyObject* s_kind_attr = nullptr;  // interned "kind"
std::unordered_map<PyObject*, bool> g_floating;  // lazyx dtype -> its kind is "f"

// Whether lazyx dtype `d` is a floating type (read once per dtype; dtypes are singletons,
// kept alive by the cache's reference).
bool floating(PyObject* d) {
    auto it = g_floating.find(d);
    if (it != g_floating.end()) return it->second;
    PyObject* k = PyObject_GetAttr(d, s_kind_attr);
    bool f = k != nullptr && PyUnicode_Check(k) && PyUnicode_CompareWithASCIIString(k, "f") == 0;
    Py_XDECREF(k);
    PyErr_Clear();
    Py_INCREF(d);
    g_floating.emplace(d, f);
    return f;
}

PyObject* s_wrapped = nullptr;
PyObject* s_class = nullptr;

// The node of the common case, or nullptr with no error set: not the common case.
PyObject* op_fast(ElementwiseOp* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != self->arity) return nullptr;
    if (kwnames != nullptr) {  // only stream=None
        if (PyTuple_GET_SIZE(kwnames) != 1 || args[n] != Py_None ||
            PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_stream) != 0)
            return nullptr;
    }
    PyObject* a = args[0];
    PyObject* b = n == 2 ? args[1] : nullptr;
    PyObject* scalar = nullptr;  // a Python float or int operand's constant (a new reference)
    if (Py_TYPE(a) != g_array) {
        // A Python float or int before a floating array (`1 - x`): the array's dtype, as
        // MLX's weak scalars; anything else is the Python function's.
        if (b == nullptr || Py_TYPE(b) != g_array || self->constant == nullptr ||
            !(PyFloat_CheckExact(a) || PyLong_CheckExact(a)) || !floating(slot(b, off_dtype)))
            return nullptr;
        std::swap(a, b);  // the array first; the order is restored for the inputs below
        scalar = b;
    }
    PyObject* dtype = slot(a, off_dtype);
    PyObject* shape = slot(a, off_shape);
    if (b != nullptr && scalar == nullptr && Py_TYPE(b) != g_array) {
        if (self->constant == nullptr || !(PyFloat_CheckExact(b) || PyLong_CheckExact(b)) ||
            !floating(dtype))
            return nullptr;
        scalar = b;
    }
    if (scalar != nullptr) {
        PyObject* cargs[2] = {scalar, dtype};
        scalar = PyObject_Vectorcall(self->constant, cargs, 2, nullptr);
        if (scalar == nullptr) { PyErr_Clear(); return nullptr; }  // the Python path says why
        if (Py_TYPE(scalar) != g_array) { Py_DECREF(scalar); return nullptr; }
    } else if (b != nullptr) {
        if (slot(b, off_dtype) != dtype) return nullptr;
        PyObject* sb = slot(b, off_shape);
        if (sb != shape) {
            int eq = PyObject_RichCompareBool(shape, sb, Py_EQ);
            if (eq != 1) { if (eq < 0) PyErr_Clear(); return nullptr; }
        }
    }
    PyObject* r = PyDict_GetItemWithError(self->table, dtype);  // borrowed
    if (r == nullptr || !PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2 ||
        PyTuple_GET_ITEM(r, 0) != Py_None) {
        PyErr_Clear();
        Py_XDECREF(scalar);
        return nullptr;
    }
    PyObject* stream = PyObject_GetAttr(self->tls, s_stream);
    if (stream == nullptr || stream == Py_None) {
        PyErr_Clear();
        Py_XDECREF(stream);
        Py_XDECREF(scalar);
        return nullptr;
    }
    PyObject* inputs;
    if (scalar != nullptr) {  // in the call's order
        inputs = Py_TYPE(args[0]) == g_array ? PyTuple_Pack(2, args[0], scalar)
                                             : PyTuple_Pack(2, scalar, args[1]);
        Py_DECREF(scalar);
    } else {
        inputs = n == 2 ? PyTuple_Pack(2, args[0], args[1]) : PyTuple_Pack(1, args[0]);
    }
    if (inputs == nullptr) { Py_DECREF(stream); return nullptr; }
    PyObject* node_args[5] = {self->cls, stream, shape, PyTuple_GET_ITEM(r, 1), inputs};
    PyObject* out = node(nullptr, node_args, 5);
    Py_DECREF(stream);
    Py_DECREF(inputs);
    return out;
}

PyObject* op_vectorcall(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    ElementwiseOp* self = reinterpret_cast<ElementwiseOp*>(obj);
    PyObject* out = op_fast(self, args, nargsf, kwnames);
    if (out != nullptr || PyErr_Occurred()) return out;
    return PyObject_Vectorcall(self->py_op, args, nargsf, kwnames);
}

PyObject* op_get(PyObject* self, PyObject* obj, PyObject*) {
    if (obj == nullptr || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

// Pickled and copied as functions are: by reference (the name it is found under).
PyObject* op_reduce(PyObject* self, PyObject*) {
    return PyObject_GetAttrString(reinterpret_cast<ElementwiseOp*>(self)->py_op, "__qualname__");
}
PyObject* op_reduce_ex(PyObject* self, PyObject*) { return op_reduce(self, nullptr); }
PyObject* op_copy(PyObject* self, PyObject*) { Py_INCREF(self); return self; }

PyMethodDef op_methods[] = {
    {"__reduce__", op_reduce, METH_NOARGS, nullptr},
    {"__reduce_ex__", op_reduce_ex, METH_O, nullptr},
    {"__copy__", op_copy, METH_NOARGS, nullptr},
    {"__deepcopy__", op_copy, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyObject* op_getattro(PyObject* self, PyObject* name) {
    ElementwiseOp* op = reinterpret_cast<ElementwiseOp*>(self);
    if (PyUnicode_Compare(name, s_wrapped) == 0) { Py_INCREF(op->py_op); return op->py_op; }
    if (PyUnicode_Compare(name, s_class) == 0) return PyObject_GenericGetAttr(self, name);
    for (PyMethodDef* m = op_methods; m->ml_name != nullptr; ++m)  // its own: pickling, copies
        if (PyUnicode_CompareWithASCIIString(name, m->ml_name) == 0)
            return PyObject_GenericGetAttr(self, name);
    return PyObject_GetAttr(op->py_op, name);
}

int op_setattro(PyObject* self, PyObject* name, PyObject* value) {
    return PyObject_SetAttr(reinterpret_cast<ElementwiseOp*>(self)->py_op, name, value);
}

PyObject* op_repr(PyObject* self) { return PyObject_Repr(reinterpret_cast<ElementwiseOp*>(self)->py_op); }

int op_traverse(PyObject* self, visitproc visit, void* arg) {
    ElementwiseOp* op = reinterpret_cast<ElementwiseOp*>(self);
    Py_VISIT(op->py_op); Py_VISIT(op->cls); Py_VISIT(op->table); Py_VISIT(op->tls);
    Py_VISIT(op->constant);
    return 0;
}

int op_clear(PyObject* self) {
    ElementwiseOp* op = reinterpret_cast<ElementwiseOp*>(self);
    Py_CLEAR(op->py_op); Py_CLEAR(op->cls); Py_CLEAR(op->table); Py_CLEAR(op->tls);
    Py_CLEAR(op->constant);
    return 0;
}

void op_dealloc(PyObject* self) {
    PyObject_GC_UnTrack(self);
    op_clear(self);
    Py_TYPE(self)->tp_free(self);
}

PyTypeObject ElementwiseOpType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// elementwise_op(py_op, cls, table, thread_state, arity[, constant]) -> the op function in
// front of py_op; with `constant` (lazyx.arguments.constant), a binary op also takes a
// Python float or int with a floating array in C++ (the scalar becomes the array's dtype).
PyObject* elementwise_op(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (!ready()) return nullptr;
    if ((n != 5 && n != 6) || !PyCallable_Check(args[0]) || !PyType_Check(args[1]) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[1]), g_primitive) ||
        !PyDict_Check(args[2]) || !PyLong_Check(args[4]) ||
        (n == 6 && args[5] != Py_None && !PyCallable_Check(args[5]))) {
        PyErr_SetString(PyExc_TypeError,
                        "elementwise_op(py_op, primitive_class, table, thread_state, arity"
                        "[, constant])");
        return nullptr;
    }
    long arity = PyLong_AsLong(args[4]);
    if (arity != 1 && arity != 2) {
        PyErr_SetString(PyExc_ValueError, "elementwise_op: arity must be 1 or 2");
        return nullptr;
    }
    ElementwiseOp* op = PyObject_GC_New(ElementwiseOp, &ElementwiseOpType);
    if (op == nullptr) return nullptr;
    op->vectorcall = op_vectorcall;
    Py_INCREF(args[0]); op->py_op = args[0];
    Py_INCREF(args[1]); op->cls = args[1];
    Py_INCREF(args[2]); op->table = args[2];
    Py_INCREF(args[3]); op->tls = args[3];
    op->constant = n == 6 && args[5] != Py_None ? args[5] : nullptr;
    Py_XINCREF(op->constant);
    op->arity = static_cast<int>(arity);
    PyObject_GC_Track(op);
    return reinterpret_cast<PyObject*>(op);
}

// -- trees (lazyx.transforms.trees and lazyx.scheduler.tree_arrays) -------------------------
// A compiled call flattens its arguments and its inputs= state, writes the outputs= state
// back, and the loop around it evaluates the state: several walks of a tree of tens of
// arrays per step. These are the Python functions' walks, in C++: exact lists, tuples and
// dicts are read directly; subclasses (an nn.Module is a dict; a namedtuple) through their
// own iteration, keys() and values(), as the Python versions call them.

PyObject* s_keys = nullptr;    // interned "keys", "values"
PyObject* s_values = nullptr;

// The items of a list or tuple as a new tuple (a list is copied: the walk below may run
// Python code, a subclass's __iter__, that changes it).
inline PyObject* seq_items(PyObject* t, PyTypeObject* tt) {
    if (tt == &PyTuple_Type) { Py_INCREF(t); return t; }
    if (tt == &PyList_Type) return PyList_AsTuple(t);
    return PySequence_Tuple(t);
}

// A dict's keys and values as two new tuples (a subclass through its keys() and values()).
bool dict_items(PyObject* t, PyTypeObject* tt, PyObject** keys, PyObject** values) {
    PyObject *k, *v;
    if (tt == &PyDict_Type) {
        k = PyDict_Keys(t);
        v = k ? PyDict_Values(t) : nullptr;
    } else {
        k = PyObject_CallMethodNoArgs(t, s_keys);
        v = k ? PyObject_CallMethodNoArgs(t, s_values) : nullptr;
    }
    *keys = k ? PySequence_Tuple(k) : nullptr;
    *values = v ? PySequence_Tuple(v) : nullptr;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (*keys == nullptr || *values == nullptr) {
        Py_CLEAR(*keys);
        Py_CLEAR(*values);
        return false;
    }
    return true;
}

PyObject* flatten_tree(PyObject* t, PyObject* leaves);

// The children's treedefs of `items` (a tuple), each flattened into `leaves`.
PyObject* flatten_children(PyObject* items, PyObject* leaves) {
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject* kids = PyTuple_New(n);
    if (kids == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* d = flatten_tree(PyTuple_GET_ITEM(items, i), leaves);
        if (d == nullptr) { Py_DECREF(kids); return nullptr; }
        PyTuple_SET_ITEM(kids, i, d);
    }
    return kids;
}

// lazyx.transforms.trees._flatten: append the leaves of `t` to `leaves`, return its treedef
// (None for a leaf, (type, children) for a list or tuple, (dict, keys, children) for a dict).
PyObject* flatten_tree(PyObject* t, PyObject* leaves) {
    PyTypeObject* tt = Py_TYPE(t);
    if (tt == g_array) {
        if (PyList_Append(leaves, t) < 0) return nullptr;
        Py_RETURN_NONE;
    }
    bool seq = tt == &PyTuple_Type || tt == &PyList_Type ||
               (tt != &PyDict_Type && (PyTuple_Check(t) || PyList_Check(t)));
    if (!seq && !PyDict_Check(t)) {
        if (PyList_Append(leaves, t) < 0) return nullptr;
        Py_RETURN_NONE;
    }
    if (Py_EnterRecursiveCall(" while flattening a tree of arrays")) return nullptr;
    PyObject* out = nullptr;
    if (seq) {
        PyObject* items = seq_items(t, tt);
        PyObject* kids = items ? flatten_children(items, leaves) : nullptr;
        if (kids) out = PyTuple_Pack(2, reinterpret_cast<PyObject*>(tt), kids);
        Py_XDECREF(items);
        Py_XDECREF(kids);
    } else {
        PyObject *keys, *values;
        if (dict_items(t, tt, &keys, &values)) {
            PyObject* kids = flatten_children(values, leaves);
            if (kids) out = PyTuple_Pack(3, reinterpret_cast<PyObject*>(&PyDict_Type), keys, kids);
            Py_XDECREF(kids);
            Py_DECREF(keys);
            Py_DECREF(values);
        }
    }
    Py_LeaveRecursiveCall();
    return out;
}

// flatten(tree, leaves) -> treedef.
PyObject* flatten(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (!ready()) return nullptr;
    if (n != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "flatten(tree, leaves: list)");
        return nullptr;
    }
    return flatten_tree(args[0], args[1]);
}

// lazyx.scheduler.tree_arrays: append every array of `t` to `out`, in order.
int collect_arrays(PyObject* t, PyObject* out) {
    PyTypeObject* tt = Py_TYPE(t);
    if (tt == g_array) return PyList_Append(out, t);
    bool seq = PyTuple_Check(t) || PyList_Check(t);
    if (!seq && !PyDict_Check(t)) return is_array(t) ? PyList_Append(out, t) : 0;
    if (Py_EnterRecursiveCall(" while collecting the arrays of a tree")) return -1;
    PyObject* items = nullptr;
    if (seq) {
        items = seq_items(t, tt);
    } else {
        PyObject* v = tt == &PyDict_Type ? PyDict_Values(t) : PyObject_CallMethodNoArgs(t, s_values);
        items = v ? PySequence_Tuple(v) : nullptr;
        Py_XDECREF(v);
    }
    int rc = items ? 0 : -1;
    for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(items); ++i)
        rc = collect_arrays(PyTuple_GET_ITEM(items, i), out);
    Py_XDECREF(items);
    Py_LeaveRecursiveCall();
    return rc;
}

// tree_arrays(tree, out) -> out.
PyObject* tree_arrays(PyObject*, PyObject* const* args, Py_ssize_t n) {
    if (!ready()) return nullptr;
    if (n != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "tree_arrays(tree, out: list)");
        return nullptr;
    }
    if (collect_arrays(args[0], args[1]) < 0) return nullptr;
    Py_INCREF(args[1]);
    return args[1];
}

PyMethodDef methods[] = {
    {"setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setup)), METH_FASTCALL,
     "setup(array_type): read the slot offsets of lazyx's array class."},
    {"lazy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(lazy)), METH_FASTCALL,
     "lazy($module, shape, dtype, prim, inputs, /)\n--\n\n"
     "A new unevaluated array: output of ``prim`` applied to ``inputs``.\n\n"
     "This is how op functions add a node to the graph; ``shape`` and ``dtype`` are\n"
     "what the op function computed (the shape rule and MLX's dtype rules); ``inputs``\n"
     "is a tuple of arrays."},
    {"node", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(node)), METH_FASTCALL,
     "node(primitive_class, stream, shape, dtype, inputs) -> a new unevaluated array."},
    {"elementwise_op", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(elementwise_op)),
     METH_FASTCALL, "elementwise_op(py_op, primitive_class, table, thread_state, arity[, constant]) "
     "-> the op function with its common case in C++, in front of py_op."},
    {"unevaluated_order", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(unevaluated_order)),
     METH_FASTCALL, "unevaluated_order(roots) -> the unevaluated nodes, inputs first."},
    {"structure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(structure)),
     METH_FASTCALL, "structure(order, roots, classes, class_info) -> (parts, leaf_signature, "
     "kept, leaves) or None: an eager graph's structure (lazyx.transforms.replay)."},
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL,
     "run(order, tables, keep, check, finish, failed): run the nodes of order."},
    {"flatten", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(flatten)), METH_FASTCALL,
     "flatten(tree, leaves) -> treedef: lazyx.transforms.trees._flatten."},
    {"tree_arrays", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tree_arrays)),
     METH_FASTCALL, "tree_arrays(tree, out) -> out: lazyx.scheduler.tree_arrays."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

NB_MODULE(_graph, m) {
    if (_import_array() < 0) throw nanobind::python_error();
    s_stream = PyUnicode_InternFromString("stream");
    s_kind = PyUnicode_InternFromString("kind");
    s_np = PyUnicode_InternFromString("np");
    s_small_ufunc = PyUnicode_InternFromString("small_ufunc");
    s_small_limit = PyUnicode_InternFromString("small_limit");
    s_small_native = PyUnicode_InternFromString("small_native");
    s_donates = PyUnicode_InternFromString("donates");
    s_kind_attr = PyUnicode_InternFromString("kind");
    s_device_outputs = PyUnicode_InternFromString("device_outputs");
    s_shape = PyUnicode_InternFromString("shape");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_wrapped = PyUnicode_InternFromString("__wrapped__");
    s_class = PyUnicode_InternFromString("__class__");
    s_keys = PyUnicode_InternFromString("keys");
    s_values = PyUnicode_InternFromString("values");
    ElementwiseOpType.tp_name = "lazyx._graph.ElementwiseOp";
    ElementwiseOpType.tp_basicsize = sizeof(ElementwiseOp);
    ElementwiseOpType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                                 Py_TPFLAGS_METHOD_DESCRIPTOR;
    ElementwiseOpType.tp_vectorcall_offset = offsetof(ElementwiseOp, vectorcall);
    ElementwiseOpType.tp_call = PyVectorcall_Call;
    ElementwiseOpType.tp_descr_get = op_get;
    ElementwiseOpType.tp_getattro = op_getattro;
    ElementwiseOpType.tp_setattro = op_setattro;
    ElementwiseOpType.tp_repr = op_repr;
    ElementwiseOpType.tp_methods = op_methods;
    ElementwiseOpType.tp_traverse = op_traverse;
    ElementwiseOpType.tp_clear = op_clear;
    ElementwiseOpType.tp_dealloc = op_dealloc;
    ElementwiseOpType.tp_doc = "An element-wise op function: its common case in C++, the rest in "
                               "the Python function it wraps (__wrapped__).";
    if (PyType_Ready(&ElementwiseOpType) < 0) throw nanobind::python_error();
    if (PyModule_AddFunctions(m.ptr(), methods) < 0) throw nanobind::python_error();
}
