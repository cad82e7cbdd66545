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
 *
 *   columns(sizes, values, footer_offset, offsets, decoded, records, /) -> tuple | None
 *
 * The whole footer at once, for the usual one: `sizes` is the decoded sizes block (one varint
 * per record: the metadata, then m entries), `values` the decoded records, the outputs m
 * int64 each. Parses the sizes (exactly m + 1 varints, filling `sizes`, adding up to
 * len(values)) and every entry in canonical form, and checks what the index needs: chunk
 * offsets increasing from byte 64 to below `footer_offset`, each chunk holding at least one
 * record and at most one per byte of its span. Returns (metadata length, records in all
 * chunks, most in one, largest decoded size); None when anything is otherwise, and the caller
 * then takes its general path, which parses what is valid and names what is not. Opening
 * thousands of small files was mostly the dozen NumPy calls this replaces per footer.
 * Lean outputs, so a group_size 1 footer builds only what the index keeps: `decoded` may be
 * m uint32 (None is returned for a size of 2^32 or more) and `records` None (None is
 * returned unless every chunk holds one record). `lean_columns` is the same function, under
 * a name that says an extension built before these forms is not in use.
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

/* 0 when anything is not as `columns` wants it; else 1 and the summary filled in. */
static int parse_columns(const uint8_t *sizes, Py_ssize_t sizes_len, const uint8_t *values,
                         Py_ssize_t values_len, int64_t footer_offset, Py_ssize_t m,
                         int narrow, int64_t *out[3], int64_t summary[4]) {
    const uint8_t *p = sizes, *sizes_end = sizes + sizes_len;
    uint64_t meta;
    if (!read_varint(p, sizes_end, &p, &meta) || meta > (uint64_t)values_len) return 0;
    int64_t at = (int64_t)meta, total = 0, most = 0, widest = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        uint64_t len;
        if (!read_varint(p, sizes_end, &p, &len) || len > (uint64_t)(values_len - at)) return 0;
        const uint8_t *q = values + at, *end = q + len;
        at += (int64_t)len;
        uint64_t v[3];
        for (int field = 1; field <= 3; field++) {
            uint64_t tag;
            if (!read_varint(q, end, &q, &tag) || tag != (uint64_t)(field << 3) ||
                !read_varint(q, end, &q, &v[field - 1]))
                return 0;
        }
        if (q != end) return 0;
        out[0][k] = (int64_t)v[0];
        if (narrow) {
            if (v[1] > UINT32_MAX) return 0;
            ((uint32_t *)out[1])[k] = (uint32_t)v[1];
        } else {
            out[1][k] = (int64_t)v[1];
        }
        if (out[2] != NULL) out[2][k] = (int64_t)v[2];
        else if (v[2] != 1) return 0;
        if ((int64_t)v[1] > widest) widest = (int64_t)v[1];
    }
    if (p != sizes_end || at != values_len) return 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t offset = out[0][k], next = k + 1 < m ? out[0][k + 1] : footer_offset;
        int64_t count = out[2] != NULL ? out[2][k] : 1, span = next - offset;
        if ((k == 0 && offset < 64) || span <= 0 || count < 1 || count > span) return 0;
        total += count;
        if (count > most) most = count;
    }
    summary[0] = (int64_t)meta;
    summary[1] = total;
    summary[2] = most;
    summary[3] = widest;
    return 1;
}

static PyObject *footer_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "columns() takes exactly 6 arguments (%zd given)", nargs);
        return NULL;
    }
    long long footer_offset = PyLong_AsLongLong(args[2]);
    if (footer_offset == -1 && PyErr_Occurred()) return NULL;
    Py_buffer bufs[5];
    int idx[5] = {0, 1, 3, 4, 5};
    int ones = args[5] == Py_None;  /* no records column: every chunk must hold one */
    int got = 0;
    PyObject *result = NULL;
    for (; got < 5 - ones; got++) {
        int flags = PyBUF_C_CONTIGUOUS | (got >= 2 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[idx[got]], &bufs[got], flags) < 0) goto done;
    }
    Py_ssize_t m = bufs[2].len / 8;
    int narrow = bufs[3].len == 4 * m && m > 0;
    if (bufs[2].len % 8 || (bufs[3].len != 8 * m && !narrow) ||
        (!ones && bufs[4].len != 8 * m)) {
        PyErr_SetString(PyExc_ValueError,
                        "columns(): offsets and records must hold m int64, decoded m int64 "
                        "or m uint32");
        goto done;
    }
    int64_t *out[3] = {(int64_t *)bufs[2].buf, (int64_t *)bufs[3].buf,
                       ones ? NULL : (int64_t *)bufs[4].buf};
    int64_t summary[4];
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = parse_columns((const uint8_t *)bufs[0].buf, bufs[0].len, (const uint8_t *)bufs[1].buf,
                       bufs[1].len, (int64_t)footer_offset, m, narrow, out, summary);
    Py_END_ALLOW_THREADS
    if (ok)
        result = Py_BuildValue("(LLLL)", (long long)summary[0], (long long)summary[1],
                               (long long)summary[2], (long long)summary[3]);
    else
        result = Py_NewRef(Py_None);
done:
    while (got-- > 0) PyBuffer_Release(&bufs[got]);
    return result;
}

/*
 * Streaming: a large footer parsed as its windows arrive, so it is never held whole.
 *
 *   stream_entries(values, footer_offset, offsets, decoded, records, state, /) -> int
 *
 * Parses entries from `values`, the next piece of the footer's decoded records after the
 * metadata record, into row state[0] on of `offsets` (int64), `decoded` (uint32) and
 * `records` (int64, or None while every chunk holds one record). Entries are delimited by
 * their own form, which must be canonical (fields 1, 2, 3 in order, minimal varints):
 * `stream_sizes` then checks each record size against the entry's length, which proves
 * the delimiting right. state is int64[6]: rows done, the last offset, records in all,
 * most in one, largest decoded size (carried between calls), and the status the call
 * leaves: 0 (the rest of `values` is the start of an entry: feed more), 1 (not as this
 * parser wants it: the caller's general path parses or names it), 2 (a chunk of more than
 * one record and `records` is None: call again, with a records column, from the returned
 * byte). Returns how many bytes of `values` were parsed. Checks what `columns` checks:
 * offsets increasing from 64 and below `footer_offset`, each chunk at least one record
 * and at most one per byte of its span (the last one's span is the caller's to check).
 *
 *   stream_sizes(sizes, offsets, decoded, records, state, /) -> int
 *
 * The record sizes after the metadata's, from row state[0] on: each must be the canonical
 * length of the entry parsed into that row. state is int64[3]: rows done, rows in all, the
 * status left (0 feed more, 1 a size differs, is not minimal, or is one too many). Returns
 * the bytes parsed.
 */
static inline int read_varint_min(const uint8_t *p, const uint8_t *end, const uint8_t **next,
                                  uint64_t *value) {
    uint64_t v = 0;
    for (int i = 0; i < 9; i++) {
        if (p >= end) return 0;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            if (i > 0 && b == 0) return -1; /* not minimal */
            *next = p;
            *value = v;
            return 1;
        }
    }
    return -1; /* 2^63 or more */
}

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static Py_ssize_t parse_stream(const uint8_t *buf, Py_ssize_t len, Py_ssize_t m,
                               int64_t footer_offset, int64_t *offsets, uint32_t *decoded,
                               int64_t *records, int64_t st[6]) {
    const uint8_t *p = buf, *end = buf + len;
    int64_t k = st[0], prev = st[1], total = st[2], most = st[3], widest = st[4], status = 0;
    for (;;) {
        const uint8_t *q = p;
        uint64_t v[3];
        int r = 1;
        for (int field = 0; field < 3 && r == 1; field++) {
            if (q >= end) {
                r = 0;
                break;
            }
            if (*q++ != (uint8_t)((field + 1) << 3)) {
                r = -1;
                break;
            }
            r = read_varint_min(q, end, &q, &v[field]);
        }
        if (r == 0) break;
        if (r < 0 || k >= m || v[1] > UINT32_MAX || v[2] < 1 ||
            v[0] >= (uint64_t)footer_offset || (k == 0 && v[0] < 64) ||
            (k > 0 && (int64_t)v[0] <= prev)) {
            status = 1;
            break;
        }
        if (v[2] != 1 && records == NULL) {
            status = 2;
            break;
        }
        if (k > 0 && records != NULL && records[k - 1] > (int64_t)v[0] - prev) {
            status = 1;
            break;
        }
        offsets[k] = (int64_t)v[0];
        decoded[k] = (uint32_t)v[1];
        if (records != NULL) records[k] = (int64_t)v[2];
        total += (int64_t)v[2];
        if ((int64_t)v[2] > most) most = (int64_t)v[2];
        if ((int64_t)v[1] > widest) widest = (int64_t)v[1];
        prev = (int64_t)v[0];
        k++;
        p = q;
    }
    st[0] = k;
    st[1] = prev;
    st[2] = total;
    st[3] = most;
    st[4] = widest;
    st[5] = status;
    return p - buf;
}

static Py_ssize_t parse_sizes(const uint8_t *buf, Py_ssize_t len, const int64_t *offsets,
                              const uint32_t *decoded, const int64_t *records, int64_t st[3]) {
    const uint8_t *p = buf, *end = buf + len;
    int64_t k = st[0], m = st[1], status = 0;
    while (p < end) {
        uint64_t size;
        int r = read_varint_min(p, end, &p, &size);
        if (r == 0) break;
        if (r < 0 || k >= m) {
            status = 1;
            break;
        }
        uint64_t want = 3 + varint_len((uint64_t)offsets[k]) + varint_len(decoded[k]) +
                        varint_len(records != NULL ? (uint64_t)records[k] : 1);
        if (size != want) {
            status = 1;
            break;
        }
        k++;
    }
    st[0] = k;
    st[2] = status;
    return p - buf;
}

/* The buffers of a streaming call: the piece (read-only), offsets, decoded, records (or
 * None), state (writable); 0 on success, else -1 with an exception set. */
static int stream_buffers(PyObject *const *args, Py_buffer bufs[5], int *got,
                          Py_ssize_t state_len) {
    int ones = args[3] == Py_None;
    for (*got = 0; *got < 5; (*got)++) {
        if (*got == 3 && ones) {
            bufs[3].buf = NULL;
            bufs[3].len = 0;
            bufs[3].obj = NULL;
            continue;
        }
        int flags = PyBUF_C_CONTIGUOUS | (*got >= 1 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[*got], &bufs[*got], flags) < 0) return -1;
    }
    Py_ssize_t m = bufs[1].len / 8;
    if (bufs[1].len % 8 || bufs[2].len != 4 * m || (!ones && bufs[3].len != 8 * m) ||
        bufs[4].len != 8 * state_len) {
        PyErr_SetString(PyExc_ValueError,
                        "offsets and records must hold m int64, decoded m uint32, state the "
                        "documented int64s");
        return -1;
    }
    return 0;
}

static void release_buffers(Py_buffer bufs[5], int got) {
    while (got-- > 0)
        if (bufs[got].obj != NULL) PyBuffer_Release(&bufs[got]);
}

static PyObject *footer_stream_entries(PyObject *module, PyObject *const *args,
                                       Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "stream_entries() takes exactly 6 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    long long footer_offset = PyLong_AsLongLong(args[1]);
    if (footer_offset == -1 && PyErr_Occurred()) return NULL;
    PyObject *rest[5] = {args[0], args[2], args[3], args[4], args[5]};
    Py_buffer bufs[5];
    int got = 0;
    PyObject *result = NULL;
    if (stream_buffers(rest, bufs, &got, 6) == 0) {
        Py_ssize_t used;
        Py_BEGIN_ALLOW_THREADS
        used = parse_stream((const uint8_t *)bufs[0].buf, bufs[0].len, bufs[1].len / 8,
                            (int64_t)footer_offset, (int64_t *)bufs[1].buf,
                            (uint32_t *)bufs[2].buf, (int64_t *)bufs[3].buf,
                            (int64_t *)bufs[4].buf);
        Py_END_ALLOW_THREADS
        result = PyLong_FromSsize_t(used);
    }
    release_buffers(bufs, got);
    return result;
}

static PyObject *footer_stream_sizes(PyObject *module, PyObject *const *args,
                                     Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "stream_sizes() takes exactly 5 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    Py_buffer bufs[5];
    int got = 0;
    PyObject *result = NULL;
    if (stream_buffers(args, bufs, &got, 3) == 0) {
        int64_t *st = (int64_t *)bufs[4].buf;
        if (st[1] > bufs[1].len / 8) {
            PyErr_SetString(PyExc_ValueError, "stream_sizes(): more rows than the columns hold");
        } else {
            Py_ssize_t used;
            Py_BEGIN_ALLOW_THREADS
            used = parse_sizes((const uint8_t *)bufs[0].buf, bufs[0].len,
                               (const int64_t *)bufs[1].buf, (const uint32_t *)bufs[2].buf,
                               (const int64_t *)bufs[3].buf, st);
            Py_END_ALLOW_THREADS
            result = PyLong_FromSsize_t(used);
        }
    }
    release_buffers(bufs, got);
    return result;
}

static PyMethodDef footer_methods[] = {
    {"columns", (PyCFunction)(void (*)(void))footer_columns, METH_FASTCALL,
     "columns(sizes, values, footer_offset, offsets, decoded, records, /) -> tuple | None."},
    {"lean_columns", (PyCFunction)(void (*)(void))footer_columns, METH_FASTCALL,
     "columns, also taking decoded as m uint32 and records as None."},
    {"entries", (PyCFunction)(void (*)(void))footer_entries, METH_FASTCALL,
     "entries(values, ends, offsets, decoded, records, /) -> int: canonical entries."},
    {"stream_entries", (PyCFunction)(void (*)(void))footer_stream_entries, METH_FASTCALL,
     "stream_entries(values, footer_offset, offsets, decoded, records, state, /) -> int."},
    {"stream_sizes", (PyCFunction)(void (*)(void))footer_stream_sizes, METH_FASTCALL,
     "stream_sizes(sizes, offsets, decoded, records, state, /) -> int."},
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
