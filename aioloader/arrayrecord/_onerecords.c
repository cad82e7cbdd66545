/*
 * One-record chunks of local files, read, checked and decoded in one C loop.
 *
 * `onerecord.one_record` is the short path for one chunk: a header unpack, a cached
 * comparison of the chunk's head, the hashes, one zstd decompression; `workers.ones` reads
 * each chunk for it (a `preadv` that puts its block headers aside) and pairs the data
 * hashes of two chunks. Those Python lines cost as much as the reads and decompressions of
 * small records together, and a few microseconds a record of any size. This loop does the
 * same over every chunk of a task:
 *
 *   read_chunks(fds, file, start, end, within, counts, budget, hashes, data_hashes,
 *               heads, decompress, ratio, most, into) -> list
 *
 * For chunk k (`fds[file[k]]`, bytes `[start[k], end[k])`) the list holds its record (bytes),
 * None when it was decoded into `into[k]`, or False when the loop did not take it: then the
 * caller's Python path reads it again and decodes it or names the error. The loop takes a
 * chunk only when
 *
 *   - it is record 0 (`within[k]`) of a chunk of one record (`counts[k]`, when given), of at
 *     most `most` bytes, beginning after a block header and crossing at most MAX_HEADERS
 *     block boundaries, none within a block header or right after one (`headers_in`);
 *   - one `preadv` returns all of it, the block headers put aside; with `hashes`, each of
 *     their hashes agrees;
 *   - its header says a simple chunk of one record whose data fills the range, decoding to
 *     at most `budget` bytes (and to `len(into[k])` exactly); with `hashes`, the header
 *     hash agrees; the data begins with `heads[size]` (the codec byte, sizes block and
 *     values size prefix that `onerecord` checked for a zstd chunk of that size); with
 *     `data_hashes`, the data hash agrees (two chunks' hashes computed in lockstep);
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
#define _DEFAULT_SOURCE /* preadv */
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLOCK_SIZE 65536
#define BLOCK_HEADER_SIZE 24
#define CHUNK_HEADER_SIZE 40
#define MAX_HEADERS 64                /* `onerecord.MAX_HEADERS` */
#define ONE_SIMPLE (0x72 | (1 << 8)) /* a simple chunk ('r') of one record */
#define ZSTD_MAGIC 0xFD2FB528u

typedef struct {
    uint64_t (*riegeli_hash64)(const uint8_t *data, size_t size);
    void (*riegeli_hash64_pair)(const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                                uint64_t out[2]);
} hh_capi;
#define HH_CAPI_NAME "aioloader.arrayrecord._highwayhash._C_API"

static const hh_capi *hh;

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The frame's declared content size; -1: not declared; -2: not a zstd frame header we read
 * (the caller leaves the chunk to Python, which asks zstd itself). */
static int64_t frame_content_size(const uint8_t *p, size_t n) {
    static const int dict_bytes[4] = {0, 1, 2, 4};
    if (n < 5 || le32(p) != ZSTD_MAGIC) return -2;
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
    case 4: return (int64_t)le32(f);
    default: {
        uint64_t v = le64(f);
        return v > (uint64_t)INT64_MAX ? -2 : (int64_t)v;
    }
    }
}

/* How many block headers lie within `[start, start + n)`, all whole and followed by data;
 * -1 where `onerecord.headers_in` gives -1 (the chunk is left to Python). */
static long long headers_in(long long start, long long n) {
    long long first = start % BLOCK_SIZE;
    if (first <= BLOCK_HEADER_SIZE) return -1;
    long long stop = first + n;
    if (stop <= BLOCK_SIZE) return 0;
    long long count = (stop - 1) / BLOCK_SIZE;
    if (stop - count * BLOCK_SIZE <= BLOCK_HEADER_SIZE || count > MAX_HEADERS) return -1;
    return count;
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

/* decompress(stream) or decompress(stream, max_output_size=size): the record, or NULL
 * with no exception set (not taken; `*fatal` when an exception must propagate). The view
 * of the buffer is released if the callee kept it. */
static PyObject *decode(PyObject *decompress, const uint8_t *stream, Py_ssize_t n,
                        int64_t declared, long long size, int *fatal) {
    PyObject *view = PyMemoryView_FromMemory((char *)stream, n, PyBUF_READ);
    if (view == NULL) {
        *fatal = swallow() < 0;
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
        *fatal = swallow() < 0;
    }
    if (Py_REFCNT(view) > 1) { /* kept (zstandard keeps nothing): cut it off the buffer */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb); /* (a KeyboardInterrupt on its way out) */
        PyObject *r = PyObject_CallMethod(view, "release", NULL);
        if (r == NULL) PyErr_Clear();
        Py_XDECREF(r);
        PyErr_Restore(type, value, tb);
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
    long long budget, ratio, most;
    int hashes, data_hashes;
} args_t;

/* A chunk read and its headers checked, its data hash not yet. */
typedef struct {
    uint8_t *buf; /* its logical bytes: chunk header, then data */
    size_t cap;
    size_t n;      /* logical bytes */
    uint64_t size; /* the record's size, as the header says */
} slot_t;

/* Room for one read's plan and the block headers it puts aside (a call's own: other
 * threads run while a read waits). */
typedef struct {
    uint8_t heads[MAX_HEADERS * BLOCK_HEADER_SIZE];
    struct iovec iov[2 * MAX_HEADERS + 1];
} plan_t;

/* Read chunk k into `sl` and check what comes before its data hash: 1 taken so far, 0 not
 * taken, -1 an exception. */
static int fetch(const args_t *a, Py_ssize_t k, slot_t *sl, plan_t *p) {
    long long f, s, e, j, c = 1, fd;
    if (item_ll(a->file, k, &f) < 0 || item_ll(a->start, k, &s) < 0 ||
        item_ll(a->end, k, &e) < 0 || item_ll(a->within, k, &j) < 0 ||
        (a->counts != Py_None && item_ll(a->counts, k, &c) < 0))
        return -1;
    if (j != 0 || c != 1 || s < 0 || s > LLONG_MAX / 2 || e <= s + CHUNK_HEADER_SIZE + 2 ||
        e - s > a->most)
        return 0;
    long long n = e - s, crossed = headers_in(s, n);
    if (crossed < 0) return 0;
    size_t logical = (size_t)(n - crossed * BLOCK_HEADER_SIZE);
    if (logical <= CHUNK_HEADER_SIZE + 2) return 0;
    if (f < 0 || f >= PyList_Size(a->fds)) {
        PyErr_Format(PyExc_IndexError, "read_chunks(): file %lld of %zd", f,
                     PyList_Size(a->fds));
        return -1;
    }
    if (item_ll(a->fds, (Py_ssize_t)f, &fd) < 0) return -1;
    if (sl->cap < logical) {
        size_t cap = logical > 2 * sl->cap ? logical : 2 * sl->cap;
        uint8_t *grown = realloc(sl->buf, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        sl->buf = grown;
        sl->cap = cap;
    }
    /* the plan of `onerecord.read_plan`: data pieces in `buf`, block headers aside */
    struct iovec *iov = p->iov;
    uint8_t *block_heads = p->heads;
    int pieces = 0;
    size_t at = 0;
    long long lo = 0, boundary = BLOCK_SIZE - s % BLOCK_SIZE;
    for (long long h = 0; h < crossed; h++) {
        iov[pieces].iov_base = sl->buf + at;
        iov[pieces++].iov_len = (size_t)(boundary - lo);
        iov[pieces].iov_base = block_heads + h * BLOCK_HEADER_SIZE;
        iov[pieces++].iov_len = BLOCK_HEADER_SIZE;
        at += (size_t)(boundary - lo);
        lo = boundary + BLOCK_HEADER_SIZE;
        boundary += BLOCK_SIZE;
    }
    iov[pieces].iov_base = sl->buf + at;
    iov[pieces++].iov_len = (size_t)(n - lo);
    ssize_t got;
    int ok = 1;
    const uint8_t *h = sl->buf;
    Py_BEGIN_ALLOW_THREADS
    got = preadv((int)fd, iov, pieces, (off_t)s);
    if (got == n) {
        sl->n = logical;
        sl->size = le64(h + 32);
        if (le64(h + 24) != ONE_SIMPLE || CHUNK_HEADER_SIZE + le64(h + 8) != logical ||
            a->budget < 0 || sl->size > (uint64_t)a->budget || sl->size == 0)
            ok = 0;
        for (long long b = 0; ok && a->hashes && b < crossed; b++) {
            const uint8_t *bh = block_heads + b * BLOCK_HEADER_SIZE;
            ok = hh->riegeli_hash64(bh + 8, BLOCK_HEADER_SIZE - 8) == le64(bh);
        }
        if (ok && a->hashes)
            ok = hh->riegeli_hash64(h + 8, CHUNK_HEADER_SIZE - 8) == le64(h);
    }
    Py_END_ALLOW_THREADS
    return got == n && ok;
}

/* The record of chunk k, read into `sl`, its data hash checked (`data_ok`): a new ref to
 * the record, Py_None (decoded into its row), Py_False (not taken), or NULL (exception). */
static PyObject *finish(const args_t *a, Py_ssize_t k, const slot_t *sl, int data_ok) {
    if (!data_ok) Py_RETURN_FALSE;
    uint64_t size = sl->size;
    const uint8_t *data = sl->buf + CHUNK_HEADER_SIZE;
    Py_ssize_t dn = (Py_ssize_t)sl->n - CHUNK_HEADER_SIZE;
    PyObject *row = NULL;
    Py_buffer rowview;
    if (a->into != Py_None) {
        row = PySequence_GetItem(a->into, k);
        if (row == NULL || PyObject_GetBuffer(row, &rowview, PyBUF_WRITABLE) < 0) {
            Py_XDECREF(row);
            if (swallow() < 0) return NULL;
            Py_RETURN_FALSE;
        }
        if (rowview.len != (Py_ssize_t)size || rowview.itemsize != 1 ||
            PyObject_Size(row) != (Py_ssize_t)size) { /* (`len(out)`, as Python checks it) */
            PyErr_Clear();
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
    if (PyErr_Occurred() && swallow() < 0) goto fail;
    Py_ssize_t hn = head != NULL && PyBytes_Check(head) ? PyBytes_Size(head) : -1;
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

static int data_hash_ok(const slot_t *sl, uint64_t h) {
    return le64(sl->buf + 16) == h;
}

/* out[k] = finish(...); -1 with an exception. */
static int put(const args_t *a, PyObject *out, Py_ssize_t k, const slot_t *sl, int ok) {
    PyObject *r = finish(a, k, sl, ok);
    if (r == NULL) return -1;
    PyList_SetItem(out, k, r); /* steals r; the False there goes */
    return 0;
}

PyDoc_STRVAR(read_chunks_doc,
"read_chunks(fds, file, start, end, within, counts, budget, hashes, data_hashes, heads,\n"
"            decompress, ratio, most, into, /) -> list\n"
"\n"
"Each one-record chunk's record (bytes), None (decoded into into[k]) or False (not\n"
"taken: the caller's Python path decides); see the module's source.");

static PyObject *read_chunks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 14) {
        PyErr_Format(PyExc_TypeError, "read_chunks() takes 14 arguments (%zd given)", nargs);
        return NULL;
    }
    args_t a = {args[0], args[1], args[2], args[3], args[4], args[5], args[9], args[10],
                args[13], 0, 0, 0, 0, 0};
    int over = 0;
    a.budget = PyLong_AsLongLongAndOverflow(args[6], &over);
    if (over) a.budget = over > 0 ? LLONG_MAX : -1; /* (beyond any record: as Python) */
    if (a.budget == -1 && PyErr_Occurred()) return NULL;
    a.ratio = PyLong_AsLongLong(args[11]);
    if (a.ratio == -1 && PyErr_Occurred()) return NULL;
    a.most = PyLong_AsLongLong(args[12]);
    if (a.most == -1 && PyErr_Occurred()) return NULL;
    a.hashes = PyObject_IsTrue(args[7]);
    if (a.hashes < 0) return NULL;
    a.data_hashes = PyObject_IsTrue(args[8]);
    if (a.data_hashes < 0) return NULL;
    if (!PyList_Check(a.fds) || !PyList_Check(a.file) || !PyList_Check(a.start) ||
        !PyList_Check(a.end) || !PyList_Check(a.within) || !PyDict_Check(a.heads) ||
        (a.counts != Py_None && !PyList_Check(a.counts))) {
        PyErr_SetString(PyExc_TypeError, "read_chunks(): fds, file, start, end, within and "
                                         "counts are lists, heads a dict");
        return NULL;
    }
    Py_ssize_t count = PyList_Size(a.file);
    if (PyList_Size(a.start) != count || PyList_Size(a.end) != count ||
        PyList_Size(a.within) != count ||
        (a.counts != Py_None && PyList_Size(a.counts) != count) ||
        (a.into != Py_None && PySequence_Size(a.into) != count)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "read_chunks(): lists of different lengths");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_INCREF(Py_False);
        PyList_SetItem(out, k, Py_False);
    }
    slot_t slots[2] = {{NULL, 0, 0, 0}, {NULL, 0, 0, 0}};
    plan_t plan;
    int cur = 0;
    Py_ssize_t pending = -1; /* read into slots[cur ^ 1], its data hash not yet computed */
    for (Py_ssize_t k = 0; k < count; k++) {
        int got = fetch(&a, k, &slots[cur], &plan);
        if (got < 0) goto fail;
        if (!got) continue;
        if (!a.data_hashes) {
            if (put(&a, out, k, &slots[cur], 1) < 0) goto fail;
            continue;
        }
        if (pending < 0) {
            pending = k;
            cur ^= 1;
            continue;
        }
        slot_t *first = &slots[cur ^ 1], *second = &slots[cur];
        uint64_t hs[2];
        Py_BEGIN_ALLOW_THREADS
        hh->riegeli_hash64_pair(first->buf + CHUNK_HEADER_SIZE, first->n - CHUNK_HEADER_SIZE,
                                second->buf + CHUNK_HEADER_SIZE,
                                second->n - CHUNK_HEADER_SIZE, hs);
        Py_END_ALLOW_THREADS
        if (put(&a, out, pending, first, data_hash_ok(first, hs[0])) < 0 ||
            put(&a, out, k, second, data_hash_ok(second, hs[1])) < 0)
            goto fail;
        pending = -1;
    }
    if (pending >= 0) {
        slot_t *last = &slots[cur ^ 1];
        uint64_t h0;
        Py_BEGIN_ALLOW_THREADS
        h0 = hh->riegeli_hash64(last->buf + CHUNK_HEADER_SIZE, last->n - CHUNK_HEADER_SIZE);
        Py_END_ALLOW_THREADS
        if (put(&a, out, pending, last, data_hash_ok(last, h0)) < 0) goto fail;
    }
    free(slots[0].buf);
    free(slots[1].buf);
    return out;
fail:
    free(slots[0].buf);
    free(slots[1].buf);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"read_chunks", (PyCFunction)(void (*)(void))read_chunks, METH_FASTCALL, read_chunks_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    (void)module;
    PyObject *owner = PyImport_ImportModule("aioloader.arrayrecord._highwayhash");
    if (owner == NULL) return -1;
    Py_DECREF(owner); /* (the capsule's import finds it by attribute, so import it first) */
    hh = (const hh_capi *)PyCapsule_Import(HH_CAPI_NAME, 0);
    if (hh == NULL) { /* (an older _highwayhash build): Python's loop, not a failed import */
        PyErr_Clear();
        PyErr_SetString(PyExc_ImportError, "_onerecords: _highwayhash has no _C_API");
        return -1;
    }
    return 0;
}

/* Its one global is `hh`, the same functions in every interpreter. The GIL stays: the loop
 * reads lists and a dict by borrowed references. */
static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)exec_module},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_onerecords",
    "One-record chunks of local files, read, checked and decoded in one C loop.", 0,
    methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__onerecords(void) { return PyModuleDef_Init(&module_def); }
