// Small element-wise kernels for the scheduler's native loop (lazyx._graph).
//
// A NumPy ufunc call on a 16-element array costs about 0.45 µs, almost all of it
// dispatch (type resolution, iterator set-up); the arithmetic takes nanoseconds. For
// the commonest small ops — add, subtract, multiply, divide, negative, abs, square on
// float32 and float64 (add, subtract, multiply, negative on int32 and int64 too) —
// these kernels do the same arithmetic directly: one output allocated through NumPy
// (so lazyx's allocation handler counts it), one loop. Each is exact IEEE arithmetic,
// one operation per element, so the result is bit-identical to the ufunc's.
//
// The protocol (lazyx.backend.Backend, "small_native"): a kernel carries a PyCapsule
// named "lazyx.small_kernel" holding a `PyObject* (*)(PyObject* const* inputs,
// Py_ssize_t n)`. It returns a new array, or nullptr WITHOUT an error set when it does
// not handle the inputs (another dtype, a layout other than C-contiguous, broadcasting
// beyond a one-element operand); the scheduler then calls the kernel's ufunc. It runs
// with the GIL held, on arrays below the kernel's small_limit.
#include <nanobind/nanobind.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL lazyx_native_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "packs.h"

using namespace nanobind::literals;

namespace {

using SmallFn = PyObject* (*)(PyObject* const*, Py_ssize_t);

// An input the loops can read: an exact, aligned, C-contiguous ndarray of type `num`.
inline PyArrayObject* usable(PyObject* o, int num) {
    if (!PyArray_CheckExact(o)) return nullptr;
    PyArrayObject* a = reinterpret_cast<PyArrayObject*>(o);
    if (PyArray_TYPE(a) != num || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) ||
        PyArray_DESCR(a)->byteorder == '>')
        return nullptr;
    return a;
}

inline PyObject* empty_like(PyArrayObject* like) {
    return PyArray_Empty(PyArray_NDIM(like), PyArray_DIMS(like),
                         PyArray_DescrFromType(PyArray_TYPE(like)), 0);
}

struct Add { template <class T> static T f(T a, T b) { return a + b; } };
struct Sub { template <class T> static T f(T a, T b) { return a - b; } };
struct Mul { template <class T> static T f(T a, T b) { return a * b; } };
struct Div { template <class T> static T f(T a, T b) { return a / b; } };
struct Neg { template <class T> static T f(T a) { return -a; } };
struct Sq { template <class T> static T f(T a) { return a * a; } };
struct Abs { template <class T> static T f(T a) { return std::fabs(a); } };

// Wrapping integer arithmetic, as NumPy's (no signed-overflow UB).
template <class T, class Op>
inline T int_op(T a, T b) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(Op::f(static_cast<U>(a), static_cast<U>(b)));
}

template <class Op, class T, int NUM>
PyObject* binary(PyObject* const* ins, Py_ssize_t n) {
    if (n != 2) return nullptr;
    PyArrayObject* a = usable(ins[0], NUM);
    PyArrayObject* b = a ? usable(ins[1], NUM) : nullptr;
    if (b == nullptr) return nullptr;
    npy_intp na = PyArray_SIZE(a), nb = PyArray_SIZE(b);
    PyArrayObject* shape_of;
    if (PyArray_NDIM(a) == PyArray_NDIM(b) &&
        std::memcmp(PyArray_DIMS(a), PyArray_DIMS(b), PyArray_NDIM(a) * sizeof(npy_intp)) == 0)
        shape_of = a;
    else if (nb == 1 && PyArray_NDIM(b) <= PyArray_NDIM(a))
        shape_of = a;
    else if (na == 1 && PyArray_NDIM(a) <= PyArray_NDIM(b))
        shape_of = b;
    else
        return nullptr;  // broadcasting: the ufunc's job
    PyObject* out = empty_like(shape_of);
    if (out == nullptr) return nullptr;  // MemoryError set: the scheduler raises it
    const T* x = static_cast<const T*>(PyArray_DATA(a));
    const T* y = static_cast<const T*>(PyArray_DATA(b));
    T* z = static_cast<T*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(out)));
    npy_intp m = PyArray_SIZE(shape_of);
    constexpr bool integral = std::is_integral_v<T>;
    auto op = [](T u, T v) { if constexpr (integral) return int_op<T, Op>(u, v); else return Op::f(u, v); };
    if (na == m && nb == m) {
        for (npy_intp i = 0; i < m; ++i) z[i] = op(x[i], y[i]);
    } else if (nb == 1) {
        T v = y[0];
        for (npy_intp i = 0; i < m; ++i) z[i] = op(x[i], v);
    } else {
        T u = x[0];
        for (npy_intp i = 0; i < m; ++i) z[i] = op(u, y[i]);
    }
    return out;
}

template <class Op, class T, int NUM>
PyObject* unary(PyObject* const* ins, Py_ssize_t n) {
    if (n != 1) return nullptr;
    PyArrayObject* a = usable(ins[0], NUM);
    if (a == nullptr) return nullptr;
    PyObject* out = empty_like(a);
    if (out == nullptr) return nullptr;
    const T* x = static_cast<const T*>(PyArray_DATA(a));
    T* z = static_cast<T*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(out)));
    npy_intp m = PyArray_SIZE(a);
    for (npy_intp i = 0; i < m; ++i) {
        if constexpr (std::is_integral_v<T>) {
            using U = std::make_unsigned_t<T>;
            z[i] = static_cast<T>(Op::f(static_cast<U>(x[i])));
        } else {
            z[i] = Op::f(x[i]);
        }
    }
    return out;
}

// One entry per op: tries each dtype's loop in turn.
template <SmallFn... Fns>
PyObject* any_of(PyObject* const* ins, Py_ssize_t n) {
    for (SmallFn f : {Fns...}) {
        PyObject* out = f(ins, n);
        if (out != nullptr || PyErr_Occurred()) return out;
    }
    return nullptr;
}

template <class Op>
PyObject* float_binary(PyObject* const* ins, Py_ssize_t n) {
    return any_of<binary<Op, float, NPY_FLOAT32>, binary<Op, double, NPY_FLOAT64>>(ins, n);
}
template <class Op>
PyObject* any_binary(PyObject* const* ins, Py_ssize_t n) {
    return any_of<binary<Op, float, NPY_FLOAT32>, binary<Op, double, NPY_FLOAT64>,
                  binary<Op, int32_t, NPY_INT32>, binary<Op, int64_t, NPY_INT64>>(ins, n);
}
template <class Op>
PyObject* float_unary(PyObject* const* ins, Py_ssize_t n) {
    return any_of<unary<Op, float, NPY_FLOAT32>, unary<Op, double, NPY_FLOAT64>>(ins, n);
}
template <class Op>
PyObject* any_unary(PyObject* const* ins, Py_ssize_t n) {
    return any_of<unary<Op, float, NPY_FLOAT32>, unary<Op, double, NPY_FLOAT64>,
                  unary<Op, int32_t, NPY_INT32>, unary<Op, int64_t, NPY_INT64>>(ins, n);
}

struct Entry {
    const char* name;  // the primitive's name (lazyx.plugins.elementwise)
    SmallFn fn;
};
const Entry kSmall[] = {
    {"Add", any_binary<Add>},        {"Subtract", any_binary<Sub>},
    {"Multiply", any_binary<Mul>},   {"Divide", float_binary<Div>},
    {"Negative", any_unary<Neg>},    {"Square", float_unary<Sq>},
    {"Abs", float_unary<Abs>},
};

}  // namespace

namespace lazyx {
void bind_small(nanobind::module_& m) {
    m.def(
        "small_kernel",
        [](const char* name) -> nanobind::object {
            for (const Entry& e : kSmall)
                if (std::strcmp(e.name, name) == 0)
                    return nanobind::steal(PyCapsule_New(reinterpret_cast<void*>(e.fn),
                                                         "lazyx.small_kernel", nullptr));
            return nanobind::none();
        },
        "name"_a,
        "The small-array kernel of element-wise primitive `name` for the scheduler's "
        "native loop (a PyCapsule), or None.");
    m.def(
        "small_call",
        [](const char* name, nanobind::args arrays) -> nanobind::object {
            for (const Entry& e : kSmall) {
                if (std::strcmp(e.name, name) != 0) continue;
                std::vector<PyObject*> ins;
                for (nanobind::handle h : arrays) ins.push_back(h.ptr());
                PyObject* out = e.fn(ins.data(), static_cast<Py_ssize_t>(ins.size()));
                if (out == nullptr && PyErr_Occurred()) throw nanobind::python_error();
                return out ? nanobind::steal(out) : nanobind::none();
            }
            throw nanobind::value_error("no small kernel of that name");
        },
        "name"_a, "arrays"_a,
        "Run small kernel `name` on `arrays` as the scheduler would: its result, or None "
        "where it declines (for tests).");
}
}  // namespace lazyx
