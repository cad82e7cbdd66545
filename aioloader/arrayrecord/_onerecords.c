/*
 * Small one-record chunks of local files, read, checked and decoded in one C loop.
 *
 * `onerecord.one_record` is the short path for one chunk: a header unpack, a cached
 * comparison of the chunk's head, the hashes, one zstd decompression. For small records
 * (text at group_size 1: ~1 KiB each) its Python lines cost as much as the pread and the
 * decompression together. This loop runs the same checks, in the same order, over every
 * small chunk of a task:
 *
 *   read_small(fds, file, start, end, within, counts, budget, hashes, data_hashes,
 *              heads, decompress, ratio, small, into) -> list
 *
 * For chunk k (`fds[file[k]]`, bytes `[start[k], end[k])`) the list holds its record (bytes),
 * None when it was decoded into `into[k]`, or False when the loop did not take it: then the
 * caller's Python path reads it again and decodes it or names the error. The loop takes a
 * chunk only when
 *
 *   - it is record 0 (`within[k]`) of a chunk of one record (`counts[k]`, when given), of at
 *     most `small` bytes, lying within one block after its header (no block header to cut);
 *   - one pread returns all of it; its header says a simple chunk of one record whose data
 *     fills the range, decoding to at most `budget` bytes (and to `len(into[k])` exactly);
 *   - with `hashes`, the header hash agrees; the data begins with `heads[size]` (the codec
 *     byte, sizes block and values size prefix that `onerecord` checked for a zstd chunk of
 *     that size); with `data_hashes`, the data hash agrees;
 *   - the zstd frame's declared content size is the record's size, or absent (then
 *     `decompress(stream, max_output_size=size)`), the stream is not smaller than `ratio`
 *     allows, and `decompress` (a `ZstdDecompressor.decompress`) gives exactly `size`
 *     bytes without raising.
 *
 * Anything else is left to Python, so this loop never returns a record `one_record` would
 * not. Reads and hashes run without the GIL. Limited C API (3.11), like `_highwayhash.c`,
 * whose HighwayHash it takes through a capsule.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK_SIZE 65536
#define BLOCK_HEADER_SIZE 24
#define CHUNK_HEADER_SIZE 40
#define ONE_SIMPLE (0x72 | (1 << 8)) /* a simple chunk ('r') of one record */
#define ZSTD_MAGIC 0xFD2FB528u

typedef struct {
    uint64_t (*riegeli_hash64)(const uint8_t *data, size_t size);
} hh_capi;
#define HH_CAPI_NAME "aioloader.arrayrecord._highwayhash._C_API"

static const hh_capi *hh;

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* The frame's declared content size; -1: not declared; -2: not a zstd frame header we read
 * (the caller leaves the chunk to Python, which asks zstd itself). */
static int64_t frame_content_size(const uint8_t *p, size_t n) {
    static const int dict_bytes[4] = {0, 1, 2, 4};
    if (n < 5 || (uint32_t)le64((const uint8_t[8]){p[0], p[1], p[2], p[3], 0, 0, 0, 0}) !=
                     ZSTD_MAGIC)
        return -2;
    uint8_t fhd = p[4];
    if (fhd & 0x08) return -2; /* reserved bit */
    int single = (fhd >> 5) & 1, fcs_flag = fhd >> 6;
    size_t pos = 5 + (single ? 0 : 1) + (size_t)dict_bytes[fhd & 3];
    int fcs = fcs_flag == 0 ? (single ? 1 : 0) : (fcs_flag == 1 ? 2 : fcs_flag == 2 ? 4 : 8);
    if (pos + (size_t)fcs > n) return -2;
    const uint8_t *f = p + pos;
    switch (fcs) {
    case 0: return -1;
    case 1: return f[0];
    case 2: return (int64_t)(f[0] | (f[1] << 8)) + 256;
    case 4: return (int64_t)((uint32_t)f[0] | (uint32_t)f[1] << 8 | (uint32_t)f[2] << 16 |
                             (uint32_t)f[3] << 24);
    default: {
        uint64_t v = le64(f);
        return v > (uint64_t)INT64_MAX ? -2 : (int64_t)v;
    }
    }
}

/* Item k of a list of ints as long long; -1 with an exception on error. */
static int item_ll(PyObject *list, Py_ssize_t k, long long *out) {
    PyObject *o = PyList_GetItem(list, k);
    if (o == NULL) return -1;
    *out = PyLong_AsLongLong(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* A failure of the Python calls inside: an Exception is cleared (the chunk is left to
 * Python, which gives the same error or decodes it); anything else (KeyboardInterrupt)
 * propagates. */
static int swallow(void) {
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* decompress(stream) or decompress(stream, max_output_size=size); NULL with no exception
 * set: not taken. The view of `buf` is released if the callee kept it. */
static PyObject *decode(PyObject *decompress, const uint8_t *stream, Py_ssize_t n,
                        int64_t declared, long long size, int *fatal) {
    PyObject *view = PyMemoryView_FromMemory((char *)stream, n, PyBUF_READ);
    if (view == NULL) {
        *fatal = swallow();
        return NULL;
    }
    PyObject *args = PyTuple_Pack(1, view), *kw = NULL, *out = NULL;
    if (args != NULL && declared == -1) {
        kw = Py_BuildValue("{s:L}", "max_output_size", size);
    }
    if (args != NULL && (declared != -1 || kw != NULL)) {
        out = PyObject_Call(decompress, args, kw);
    }
    Py_XDECREF(kw);
    Py_XDECREF(args);
    if (out == NULL) {
        *fatal = swallow();
    }
    if (Py_REFCNT(view) > 1) { /* kept: never let it see the buffer again */
        PyObject *r = PyObject_CallMethod(view, "release", NULL);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_DECREF(view);
    if (out != NULL && (!PyBytes_Check(out) || PyBytes_Size(out) != size)) {
        Py_DECREF(out);
        out = NULL;
    }
    return out;
}

typedef struct {
    PyObject *fds, *file, *start, *end, *within, *counts, *heads, *decompress, *into;
    long long budget, ratio, small;
    int hashes, data_hashes;
} args_t;

/* Chunk k: its record (new ref), Py_None (decoded into its row), Py_False (not taken), or
 * NULL with an exception (a list of the wrong kind, KeyboardInterrupt). */
static PyObject *one(const args_t *a, Py_ssize_t k, uint8_t *buf) {
    long long f, s, e, j, c = 1, fd;
    if (item_ll(a->file, k, &f) < 0 || item_ll(a->start, k, &s) < 0 ||
        item_ll(a->end, k, &e) < 0 || item_ll(a->within, k, &j) < 0 ||
        (a->counts != Py_None && item_ll(a->counts, k, &c) < 0))
        return NULL;
    long long n = e - s, first = s % BLOCK_SIZE;
    if (j != 0 || c != 1 || n <= CHUNK_HEADER_SIZE + 2 || n > a->small || s < 0 ||
        first <= BLOCK_HEADER_SIZE || first + n > BLOCK_SIZE)
        Py_RETURN_FALSE;
    if (f < 0 || f >= PyList_Size(a->fds)) {
        PyErr_Format(PyExc_IndexError, "read_small(): file %lld of %zd", f,
                     PyList_Size(a->fds));
        return NULL;
    }
    if (item_ll(a->fds, (Py_ssize_t)f, &fd) < 0) return NULL;
    const uint8_t *h = buf, *data = buf + CHUNK_HEADER_SIZE;
    ssize_t got;
    int header_ok = 1, data_ok = 1;
    uint64_t size = 0;
    Py_BEGIN_ALLOW_THREADS
    got = pread((int)fd, buf, (size_t)n, (off_t)s);
    if (got == n) {
        size = le64(h + 32);
        if (le64(h + 24) != ONE_SIMPLE || CHUNK_HEADER_SIZE + le64(h + 8) != (uint64_t)n ||
            a->budget < 0 || size > (uint64_t)a->budget)
            header_ok = 0;
        else if (a->hashes && hh->riegeli_hash64(h + 8, CHUNK_HEADER_SIZE - 8) != le64(h))
            header_ok = 0;
        else if (a->data_hashes &&
                 hh->riegeli_hash64(data, (size_t)n - CHUNK_HEADER_SIZE) != le64(h + 16))
            data_ok = 0;
    }
    Py_END_ALLOW_THREADS
    if (got != n || !header_ok || !data_ok || size == 0) Py_RETURN_FALSE;
    PyObject *row = NULL;
    Py_buffer rowview;
    if (a->into != Py_None) {
        row = PySequence_GetItem(a->into, k);
        if (row == NULL || PyObject_GetBuffer(row, &rowview, PyBUF_WRITABLE) < 0) {
            Py_XDECREF(row);
            if (swallow() < 0) return NULL;
            Py_RETURN_FALSE;
        }
        if (rowview.len != (Py_ssize_t)size || rowview.itemsize != 1) {
            PyBuffer_Release(&rowview);
            Py_DECREF(row);
            Py_RETURN_FALSE;
        }
    }
    PyObject *result = Py_False;
    Py_INCREF(result);
    PyObject *key = PyLong_FromUnsignedLongLong(size);
    PyObject *head = key ? PyDict_GetItemWithError(a->heads, key) : NULL; /* borrowed */
    Py_XDECREF(key);
    Py_ssize_t hn = head != NULL && PyBytes_Check(head) ? PyBytes_Size(head) : -1;
    Py_ssize_t dn = (Py_ssize_t)n - CHUNK_HEADER_SIZE;
    if (PyErr_Occurred() && swallow() < 0) goto fail;
    if (hn > 0 && hn < dn && memcmp(data, PyBytes_AsString(head), (size_t)hn) == 0) {
        const uint8_t *stream = data + hn;
        Py_ssize_t sn = dn - hn;
        int64_t declared = frame_content_size(stream, (size_t)sn);
        if ((long double)size <= (long double)a->ratio * sn + 64 &&
            (declared == -1 || declared == (int64_t)size)) {
            int fatal = 0;
            PyObject *record = decode(a->decompress, stream, sn, declared, (long long)size,
                                      &fatal);
            if (fatal) goto fail;
            if (record != NULL) {
                Py_DECREF(result);
                if (row != NULL) {
                    memcpy(rowview.buf, PyBytes_AsString(record), (size_t)size);
                    Py_DECREF(record);
                    result = Py_None;
                    Py_INCREF(result);
                } else {
                    result = record;
                }
            }
        }
    }
    if (row != NULL) {
        PyBuffer_Release(&rowview);
        Py_DECREF(row);
    }
    return result;
fail:
    Py_DECREF(result);
    if (row != NULL) {
        PyBuffer_Release(&rowview);
        Py_DECREF(row);
    }
    return NULL;
}

PyDoc_STRVAR(read_small_doc,
"read_small(fds, file, start, end, within, counts, budget, hashes, data_hashes, heads,\n"
"           decompress, ratio, small, into, /) -> list\n"
"\n"
"Each small one-record chunk's record (bytes), None (decoded into into[k]) or False\n"
"(not taken: the caller's Python path decides); see the module's source.");

static PyObject *read_small(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 14) {
        PyErr_Format(PyExc_TypeError, "read_small() takes 14 arguments (%zd given)", nargs);
        return NULL;
    }
    args_t a = {args[0], args[1], args[2], args[3], args[4], args[5], args[9], args[10],
                args[13], 0, 0, 0, 0, 0};
    a.budget = PyLong_AsLongLong(args[6]);
    a.hashes = PyObject_IsTrue(args[7]);
    a.data_hashes = PyObject_IsTrue(args[8]);
    a.ratio = PyLong_AsLongLong(args[11]);
    a.small = PyLong_AsLongLong(args[12]);
    if (PyErr_Occurred() || a.hashes < 0 || a.data_hashes < 0) return NULL;
    if (!PyList_Check(a.fds) || !PyList_Check(a.file) || !PyList_Check(a.start) ||
        !PyList_Check(a.end) || !PyList_Check(a.within) || !PyDict_Check(a.heads) ||
        (a.counts != Py_None && !PyList_Check(a.counts))) {
        PyErr_SetString(PyExc_TypeError, "read_small(): fds, file, start, end, within and "
                                         "counts are lists, heads a dict");
        return NULL;
    }
    Py_ssize_t count = PyList_Size(a.file);
    if (PyList_Size(a.start) != count || PyList_Size(a.end) != count ||
        PyList_Size(a.within) != count ||
        (a.counts != Py_None && PyList_Size(a.counts) != count) ||
        (a.into != Py_None && PySequence_Size(a.into) != count) || a.small < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "read_small(): lists of different lengths");
        return NULL;
    }
    uint8_t *buf = malloc((size_t)(a.small > 0 ? a.small : 1));
    PyObject *out = PyList_New(count);
    if (buf == NULL || out == NULL) {
        free(buf);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *r = one(&a, k, buf);
        if (r == NULL) {
            free(buf);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SetItem(out, k, r); /* steals r */
    }
    free(buf);
    return out;
}

static PyMethodDef methods[] = {
    {"read_small", (PyCFunction)(void (*)(void))read_small, METH_FASTCALL, read_small_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    (void)module;
    PyObject *owner = PyImport_ImportModule("aioloader.arrayrecord._highwayhash");
    if (owner == NULL) return -1;
    Py_DECREF(owner); /* (the capsule's import finds it by attribute, so import it first) */
    hh = (const hh_capi *)PyCapsule_Import(HH_CAPI_NAME, 0);
    return hh == NULL ? -1 : 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)exec_module},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_onerecords",
    "Small one-record chunks of local files, read, checked and decoded in one C loop.", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__onerecords(void) { return PyModuleDef_Init(&module_def); }
