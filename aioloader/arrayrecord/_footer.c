/*
 * Footer entries of an ArrayRecord file, parsed in C: a 5M-chunk footer is 30M varints,
 * which NumPy decodes in seconds and this loop in tens of milliseconds.
 *
 *   entries(values, ends, offsets, decoded, records, /) -> int
 *
 * `values` is the footer's decoded records (any C-contiguous buffer); `ends` an int64
 * buffer of m + 1 record boundaries (entry k is values[ends[k]:ends[k+1]]); `offsets`,
 * `decoded`, `records` writable int64 buffers of m: the entries' three fields. Only the
 * canonical form is parsed: fields 1, 2, 3 in order, each a varint below 2^63, filling the
 * entry exactly. Returns how many entries from the start had that form (m when all did);
 * the caller parses the rest its general way, or says what is wrong with them. The GIL is
 * released while parsing. Limited C API only (3.11's), for the abi3 wheel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

static inline int read_varint(const uint8_t *p, const uint8_t *end, const uint8_t **next,
                              uint64_t *value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 63 && p < end; shift += 7) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            if (v >> 63) return 0;
            *next = p;
            *value = v;
            return 1;
        }
    }
    return 0;
}

static Py_ssize_t parse(const uint8_t *values, Py_ssize_t size, const int64_t *ends,
                        Py_ssize_t m, int64_t *out[3]) {
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t a = ends[k], b = ends[k + 1];
        if (a < 0 || b < a || b > size) return k;
        const uint8_t *p = values + a, *end = values + b;
        for (int field = 1; field <= 3; field++) {
            uint64_t tag, v;
            if (!read_varint(p, end, &p, &tag) || tag != (uint64_t)(field << 3) ||
                !read_varint(p, end, &p, &v))
                return k;
            out[field - 1][k] = (int64_t)v;
        }
        if (p != end) return k;
    }
    return m;
}

static PyObject *footer_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "entries() takes exactly 5 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer bufs[5];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 5; got++) {
        int flags = PyBUF_C_CONTIGUOUS | (got >= 2 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[got], &bufs[got], flags) < 0) goto done;
    }
    Py_ssize_t m = bufs[1].len / 8 - 1;
    if (bufs[1].len % 8 || m < 0 || bufs[2].len != 8 * m || bufs[3].len != 8 * m ||
        bufs[4].len != 8 * m) {
        PyErr_SetString(PyExc_ValueError,
                        "entries(): ends must hold m + 1 int64, each output m int64");
        goto done;
    }
    int64_t *out[3] = {(int64_t *)bufs[2].buf, (int64_t *)bufs[3].buf, (int64_t *)bufs[4].buf};
    Py_ssize_t parsed;
    Py_BEGIN_ALLOW_THREADS
    parsed = parse((const uint8_t *)bufs[0].buf, bufs[0].len, (const int64_t *)bufs[1].buf, m,
                   out);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(parsed);
done:
    while (got-- > 0) PyBuffer_Release(&bufs[got]);
    return result;
}

static PyMethodDef footer_methods[] = {
    {"entries", (PyCFunction)(void (*)(void))footer_entries, METH_FASTCALL,
     "entries(values, ends, offsets, decoded, records, /) -> int: canonical entries."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot footer_slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef footer_module = {
    PyModuleDef_HEAD_INIT, "_footer", "ArrayRecord footer entries, parsed in C.", 0,
    footer_methods, footer_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__footer(void) { return PyModuleDef_Init(&footer_module); }
