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
#include <string.h>

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
            v[2] > (uint64_t)(INT64_MAX - total) ||
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
        const int64_t *st = (const int64_t *)bufs[4].buf;
        Py_ssize_t used;
        if (footer_offset < 0 || st[0] < 0 || st[0] > bufs[1].len / 8 || st[1] < 0 ||
            st[1] > footer_offset || st[2] < 0 || st[3] < 0 || st[4] < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "stream_entries(): footer_offset must be >= 0 and the state "
                            "[rows done (0..m), last offset (0..footer_offset), total, most, "
                            "widest (all >= 0), status]");
            release_buffers(bufs, got);
            return NULL;
        }
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
        if (st[0] < 0 || st[1] < st[0] || st[1] > bufs[1].len / 8) {
            PyErr_SetString(PyExc_ValueError,
                            "stream_sizes(): the state must be [rows done, rows] with "
                            "0 <= rows done <= rows <= what the columns hold");
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

/*
 * A small file's opening in two calls, for the usual file (the general path in Python parses
 * anything else, and names what is wrong with a damaged file):
 *
 *   postscript(head, post_at, size, verify, hash64, /) -> int | None
 *
 * The footer offset from the postscript's first bytes `head` (the last block, at `post_at`,
 * of a file of `size` bytes): one uncompressed simple chunk of one to three one-byte-sized
 * records, the first a canonical ArrayRecord postscript, the rest of the block one padding
 * chunk. The same checks as `postscript.quick_postscript`; None for anything else.
 *
 *   small_footer(raw, footer_offset, have, max_decoded, verify, hash64, decompress, /)
 *       -> tuple | None
 *
 * The footer chunk whose physical bytes `raw` start at `footer_offset`, its range ending at
 * `have` (`raw` holds at least the footer chunk and its padding chunk's header), decoded and
 * checked as `index._parse_footer` does: block and chunk header hashes, the data hash (with
 * `verify`; the padding chunk's header always), the range filled by the chunk and at most one
 * padding chunk, the budget before anything is allocated, the sizes and entries (`columns`'
 * checks), the metadata (version 1, chunk and record counts agreeing). Returns (bounds,
 * decoded, narrow, records, options, spec, total, most): `bounds` a bytearray of m + 1 int64
 * (the chunk offsets, then `footer_offset`), `decoded` m uint32 (`narrow`) or int64, `records`
 * m int64 or None when every chunk holds one record, `options` and `spec` the metadata's bytes;
 * None for anything else. `hash64(buffer) -> int` is the Riegeli HighwayHash (the
 * `_highwayhash` extension's); `decompress(codec, block, expected, max_size)` decodes a
 * compressed block (`codecs.decompress_block`): its errors mean None here.
 *
 * Both calls decline (None) a position past MAX_POSITION before any arithmetic. A callback's
 * buffer is a view of memory the call owns, released when the callback returns; a callback's
 * `Exception` means None, anything else (KeyboardInterrupt, SystemExit) propagates.
 */

#define BLOCK 65536
#define BLOCK_HEADER 24
#define USABLE (BLOCK - BLOCK_HEADER)
#define CHUNK_HEADER 40
#define FOOTER_COST 40
#define RECORD_COST_POSTSCRIPT 48  /* chunk.RECORD_COST */
/* The largest position taken: past it (no file is that large) the call declines before any
 * arithmetic, so the layout's sums below stay far from the int64 limit. */
#define MAX_POSITION ((int64_t)1 << 60)

static inline uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Python's floor modulo for the layout's arithmetic (positions are never negative). */
static inline int64_t add_with_overhead(int64_t begin, int64_t length) {
    return begin + length +
           BLOCK_HEADER * ((length + (begin + USABLE - 1) % BLOCK) / USABLE);
}

static inline int64_t remaining_in_block(int64_t pos) { return (BLOCK - pos % BLOCK) % BLOCK; }

static inline int64_t chunk_end_at(int64_t begin, int64_t data_size, int64_t n) {
    int64_t a = add_with_overhead(begin, CHUNK_HEADER + data_size);
    int64_t pos = begin + n, extra = remaining_in_block(pos) - (USABLE - 1);
    int64_t b = pos + (extra > 0 ? extra : 0);
    return a > b ? a : b;
}

static inline int64_t padding_length_at(int64_t pos) {
    int64_t room = remaining_in_block(pos);
    return (room > 0 && room < CHUNK_HEADER) ? room + BLOCK : room;
}

/* A callback's error: an ordinary one (an `Exception`) is cleared, the call declining, and
 * the general path meets the problem again and names it; anything else (KeyboardInterrupt,
 * SystemExit) stays set, and the call returns NULL so that it propagates. */
static void clear_ordinary_error(void) {
    if (PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
}

/* Call fn(view of p[:n], *rest) and release the view after: memory the call owns is never
 * readable through a view the callback kept. NULL on an error (left set). */
static PyObject *call_with_view(PyObject *fn, const uint8_t *p, Py_ssize_t n, const char *fmt,
                                int codec, PyObject *exp, long long max_size) {
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) return NULL;
    PyObject *got = fmt == NULL ? PyObject_CallFunctionObjArgs(fn, view, NULL)
                                : PyObject_CallFunction(fn, fmt, codec, view, exp, max_size);
    PyObject *type = NULL, *value = NULL, *trace = NULL;
    if (got == NULL) PyErr_Fetch(&type, &value, &trace);  /* (the callback's error wins) */
    PyObject *released = PyObject_CallMethod(view, "release", NULL);
    Py_DECREF(view);
    if (got == NULL) {
        Py_XDECREF(released);
        PyErr_Clear();
        PyErr_Restore(type, value, trace);
        return NULL;
    }
    if (released == NULL) {  /* still exported by the callback: its answer is not used */
        Py_DECREF(got);
        return NULL;
    }
    Py_DECREF(released);
    return got;
}

/* 1 when hash64(p[:n]) == want, 0 when not, -1 on a Python error (an ordinary one cleared,
 * see `clear_ordinary_error`). */
static int hash_is(PyObject *hash64, const uint8_t *p, Py_ssize_t n, uint64_t want) {
    PyObject *got = call_with_view(hash64, p, n, NULL, 0, NULL, 0);
    if (got == NULL) goto fail;
    unsigned long long h = PyLong_AsUnsignedLongLong(got);
    Py_DECREF(got);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
    return h == want;
fail:
    clear_ordinary_error();
    return -1;
}

/* The logical bytes of the physical range [start, start + len) into `out` (room for len):
 * block headers skipped, those wholly inside checked with `verify`, as
 * `layout.strip_block_headers`. Returns the logical length, or -1. */
static Py_ssize_t strip_headers(const uint8_t *raw, Py_ssize_t len, int64_t start, int verify,
                                PyObject *hash64, uint8_t *out) {
    int64_t end = start + len, boundary = start - start % BLOCK;
    Py_ssize_t n = 0;
    for (; boundary < end; boundary += BLOCK) {
        int64_t lo = boundary + BLOCK_HEADER > start ? boundary + BLOCK_HEADER : start;
        int64_t hi = boundary + BLOCK < end ? boundary + BLOCK : end;
        if (verify && boundary >= start && boundary + BLOCK_HEADER <= end) {
            const uint8_t *h = raw + (boundary - start);
            if (hash_is(hash64, h + 8, 16, le64(h)) != 1) return -1;
        }
        if (lo < hi) {
            memcpy(out + n, raw + (lo - start), (size_t)(hi - lo));
            n += (Py_ssize_t)(hi - lo);
        }
    }
    return n;
}

/* Whether [start, have) holds exactly the chunk (of data_size bytes and n records) and at most
 * a padding chunk to the block boundary, as `decoding._check_fills` checks; `raw` is the
 * range's physical bytes from `start` (len of them). */
static int fills(const uint8_t *raw, Py_ssize_t len, int64_t start, int64_t data_size,
                 int64_t n, int64_t have, PyObject *hash64) {
    int64_t stop = chunk_end_at(start, data_size, n);
    if (have == stop) return 1;
    if (have != stop + padding_length_at(stop)) return 0;
    int64_t until = add_with_overhead(stop, CHUNK_HEADER);
    if (until > have) until = have;
    if (until - start > len) until = start + len;  /* a short gap fails the header's length */
    if (until <= stop) return 0;
    uint8_t gap[CHUNK_HEADER + 2 * BLOCK_HEADER];
    if (until - stop > (int64_t)sizeof gap) return 0;
    Py_ssize_t got = strip_headers(raw + (stop - start), (Py_ssize_t)(until - stop), stop, 1,
                                   hash64, gap);
    if (got < CHUNK_HEADER || hash_is(hash64, gap + 8, CHUNK_HEADER - 8, le64(gap)) != 1)
        return 0;
    uint64_t pad_size = le64(gap + 8), type_count = le64(gap + 24);
    if ((type_count & 0xFF) != 0x70 || (type_count >> 8) != 0 || pad_size > (uint64_t)have)
        return 0;
    return chunk_end_at(stop, (int64_t)pad_size, 0) == have;
}

static const uint8_t MAGIC_FIELD[] = {0x10, 0xDE, 0xC0, 0xEB, 0xFE, 0x84, 0xCE, 0xC3, 0xC9, 0x71};

static PyObject *footer_postscript(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "postscript() takes exactly 5 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    long long pos = PyLong_AsLongLong(args[1]), size = PyLong_AsLongLong(args[2]);
    int verify = PyObject_IsTrue(args[3]);
    if (((pos == -1 || size == -1) && PyErr_Occurred()) || verify < 0) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const uint8_t *raw = (const uint8_t *)b.buf;
    Py_ssize_t len = b.len;
    PyObject *hash64 = args[4];
    long long found = -1;
    const Py_ssize_t at = BLOCK_HEADER + CHUNK_HEADER;
    if (pos < 0 || pos > MAX_POSITION || size > MAX_POSITION || pos % BLOCK || len < at + 2 ||
        le64(raw + 8) != 0)
        goto done;
    uint64_t data_size = le64(raw + BLOCK_HEADER + 8), data_hash = le64(raw + BLOCK_HEADER + 16);
    uint64_t type_count = le64(raw + BLOCK_HEADER + 24), decoded = le64(raw + BLOCK_HEADER + 32);
    uint64_t n = type_count >> 8;
    if ((type_count & 0xFF) != 0x72 || n < 1 || n > 3 || data_size > (uint64_t)(len - at) ||
        decoded > 65536 || decoded + RECORD_COST_POSTSCRIPT * n > 65536)
        goto done;
    const uint8_t *data = raw + at;
    if (data_size < 2 || data[0] != 0 || data[1] != n || 2 + n + decoded != data_size) goto done;
    uint64_t sum = 0;
    for (uint64_t k = 0; k < n; k++) {
        if (data[2 + k] >= 0x80) goto done;
        sum += data[2 + k];
    }
    if (sum != decoded) goto done;
    if (verify && (hash_is(hash64, raw + 8, 16, le64(raw)) != 1 ||
                   hash_is(hash64, raw + BLOCK_HEADER + 8, CHUNK_HEADER - 8,
                           le64(raw + BLOCK_HEADER)) != 1 ||
                   hash_is(hash64, data, (Py_ssize_t)data_size, data_hash) != 1))
        goto done;
    const uint8_t *record = data + 2 + n, *end = record + data[2];
    const uint8_t *p = record + 1;
    uint64_t offset;
    if (data[2] < 2 || record[0] != 0x08 || !read_varint(p, end, &p, &offset)) goto done;
    if ((size_t)(end - p) != sizeof MAGIC_FIELD || memcmp(p, MAGIC_FIELD, sizeof MAGIC_FIELD) ||
        offset < 64 || offset >= (uint64_t)pos)
        goto done;
    if (!fills(raw, len, pos, (int64_t)data_size, (int64_t)n, size, hash64))
        goto done;
    found = (long long)offset;
done:
    PyBuffer_Release(&b);
    if (PyErr_Occurred()) return NULL;  /* a callback's interrupt */
    if (found < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(found);
}

/* Skip one protobuf field's value of wire type `wire` at p; 0 when it does not parse. */
static int skip_field(const uint8_t **p, const uint8_t *end, uint64_t wire) {
    uint64_t v;
    switch (wire) {
    case 0: return read_varint(*p, end, p, &v);
    case 1: if (end - *p < 8) return 0; *p += 8; return 1;
    case 5: if (end - *p < 4) return 0; *p += 4; return 1;
    case 2:
        if (!read_varint(*p, end, p, &v) || v > (uint64_t)(end - *p)) return 0;
        *p += v;
        return 1;
    default: return 0;
    }
}

typedef struct {
    const uint8_t *options, *spec;
    Py_ssize_t options_len, spec_len;
} Meta;

/* The footer's metadata record (`RiegeliFooterMetadata{array_record_metadata{...}}`), as
 * `index._parse_footer` reads it: version 1, the chunk and record counts (where present)
 * equal to m and total; 0 for anything else, which the general path reads or names. */
static int read_meta(const uint8_t *p, const uint8_t *end, int64_t m, int64_t total,
                     Meta *meta) {
    const uint8_t *inner = NULL, *inner_end = NULL;
    while (p < end) {
        uint64_t key, n;
        if (!read_varint(p, end, &p, &key) || key >> 3 == 0) return 0;
        if (key >> 3 == 1) {
            if ((key & 7) != 2 || !read_varint(p, end, &p, &n) || n > (uint64_t)(end - p))
                return 0;
            inner = p;
            inner_end = p + n;
            p += n;
        } else if (!skip_field(&p, end, key & 7)) {
            return 0;
        }
    }
    if (inner == NULL) return 0;
    int version = 0;
    meta->options = meta->spec = inner;
    meta->options_len = meta->spec_len = 0;
    for (p = inner; p < inner_end;) {
        uint64_t key, v;
        if (!read_varint(p, inner_end, &p, &key) || key >> 3 == 0) return 0;
        uint64_t number = key >> 3, wire = key & 7;
        if (number >= 1 && number <= 3) {
            if (wire != 0 || !read_varint(p, inner_end, &p, &v)) return 0;
            if ((number == 1 && v != 1) || (number == 2 && v != (uint64_t)m) ||
                (number == 3 && v != (uint64_t)total))
                return 0;
            if (number == 1) version = 1;
        } else if (number == 4 || number == 1818) {
            if (wire != 2 || !read_varint(p, inner_end, &p, &v) ||
                v > (uint64_t)(inner_end - p))
                return 0;
            if (number == 4) {
                meta->options = p;
                meta->options_len = (Py_ssize_t)v;
            } else {
                meta->spec = p;
                meta->spec_len = (Py_ssize_t)v;
            }
            p += v;
        } else if (!skip_field(&p, inner_end, wire)) {
            return 0;
        }
    }
    return version;
}

/* `decompress(codec, block, expected, max_size)` into `view`; 0 when it raises (an ordinary
 * error cleared, see `clear_ordinary_error`) or gives another length than `expected` (when
 * >= 0). */
static int decompressed(PyObject *decompress, int codec, const uint8_t *block, Py_ssize_t len,
                        long long expected, long long max_size, PyObject **owner,
                        Py_buffer *view) {
    PyObject *exp = expected >= 0 ? PyLong_FromLongLong(expected) : Py_NewRef(Py_None);
    if (exp == NULL) goto fail;
    PyObject *out = call_with_view(decompress, block, len, "iOOL", codec, exp, max_size);
    Py_DECREF(exp);
    if (out == NULL) goto fail;
    if (PyObject_GetBuffer(out, view, PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(out);
        goto fail;
    }
    if (expected >= 0 && view->len != expected) {
        PyBuffer_Release(view);
        Py_DECREF(out);
        return 0;
    }
    *owner = out;
    return 1;
fail:
    clear_ordinary_error();
    return 0;
}

static PyObject *footer_small(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "small_footer() takes exactly 7 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[1]), have = PyLong_AsLongLong(args[2]);
    long long max_decoded = PyLong_AsLongLong(args[3]);
    int verify = PyObject_IsTrue(args[4]);
    if (((start == -1 || have == -1 || max_decoded == -1) && PyErr_Occurred()) || verify < 0)
        return NULL;
    PyObject *hash64 = args[5], *decompress = args[6];
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *result = NULL, *sizes_owner = NULL, *values_owner = NULL;
    PyObject *bounds = NULL, *decoded = NULL, *records = NULL;
    Py_buffer sizes_view, values_view;
    int have_sizes = 0, have_values = 0;
    uint8_t *copy = NULL;
    const uint8_t *raw = (const uint8_t *)b.buf, *logical = raw;
    Py_ssize_t len = b.len, llen = len;
    if (start < 64 || have <= start || have > MAX_POSITION || len < CHUNK_HEADER ||
        len > MAX_POSITION)
        goto done;
    int64_t in_block = start % BLOCK;
    if (in_block < BLOCK_HEADER || in_block + len > BLOCK) {
        copy = PyMem_Malloc((size_t)len);
        if (copy == NULL) goto done;
        llen = strip_headers(raw, len, start, verify, hash64, copy);
        if (llen < 0) goto done;
        logical = copy;
    }
    if (llen < CHUNK_HEADER) goto done;
    uint64_t data_size = le64(logical + 8), data_hash = le64(logical + 16);
    uint64_t type_count = le64(logical + 24), decoded_size = le64(logical + 32);
    uint64_t n = type_count >> 8;
    uint64_t most_chunks = (uint64_t)((start - 64) / CHUNK_HEADER + 1);
    if ((verify && hash_is(hash64, logical + 8, CHUNK_HEADER - 8, le64(logical)) != 1) ||
        data_size > (uint64_t)(llen - CHUNK_HEADER) || n > most_chunks ||
        (type_count & 0xFF) != 0x72 || n < 2)
        goto done;
    if (!fills(raw, len, start, (int64_t)data_size, (int64_t)n, have, hash64)) goto done;
    const uint8_t *data = logical + CHUNK_HEADER;
    if (verify && hash_is(hash64, data, (Py_ssize_t)data_size, data_hash) != 1) goto done;
    if (decoded_size > (uint64_t)max_decoded ||
        decoded_size + FOOTER_COST * n > (uint64_t)max_decoded || data_size < 2)
        goto done;
    /* the simple chunk: codec, the sizes block's length, the sizes block, the values block */
    const uint8_t *p = data + 1, *data_end = data + data_size;
    uint64_t sizes_len;
    if (!read_varint(p, data_end, &p, &sizes_len) || sizes_len > (uint64_t)(data_end - p))
        goto done;
    int codec = data[0];
    const uint8_t *sizes = p, *values = p + sizes_len;
    Py_ssize_t values_len = data_end - values, slen = (Py_ssize_t)sizes_len;
    long long sizes_max = (long long)n * 10 < max_decoded ? (long long)n * 10 : max_decoded;
    if (codec == 0) {
        if (slen > sizes_max || (uint64_t)values_len != decoded_size) goto done;
    } else {
        if (!decompressed(decompress, codec, sizes, slen, -1, sizes_max, &sizes_owner,
                          &sizes_view))
            goto done;
        have_sizes = 1;
        sizes = sizes_view.buf;
        slen = sizes_view.len;
        if (!decompressed(decompress, codec, values, values_len, (long long)decoded_size,
                          (long long)decoded_size, &values_owner, &values_view))
            goto done;
        have_values = 1;
        values = values_view.buf;
        values_len = values_view.len;
    }
    Py_ssize_t m = (Py_ssize_t)n - 1;
    bounds = PyByteArray_FromStringAndSize(NULL, 8 * (m + 1));
    decoded = PyByteArray_FromStringAndSize(NULL, 4 * m);
    if (bounds == NULL || decoded == NULL) goto error;
    int64_t *offsets = (int64_t *)PyByteArray_AsString(bounds);
    offsets[m] = (int64_t)start;
    int64_t *out[3] = {offsets, (int64_t *)PyByteArray_AsString(decoded), NULL};
    int64_t summary[4];
    int narrow = 1;
    if (!parse_columns(sizes, slen, values, values_len, (int64_t)start, m, 1, out, summary)) {
        narrow = 0;
        Py_DECREF(decoded);
        decoded = PyByteArray_FromStringAndSize(NULL, 8 * m);
        records = PyByteArray_FromStringAndSize(NULL, 8 * m);
        if (decoded == NULL || records == NULL) goto error;
        out[1] = (int64_t *)PyByteArray_AsString(decoded);
        out[2] = (int64_t *)PyByteArray_AsString(records);
        if (!parse_columns(sizes, slen, values, values_len, (int64_t)start, m, 0, out, summary))
            goto done;
        offsets[m] = (int64_t)start;
    }
    Meta meta;
    if (!read_meta(values, values + summary[0], m, summary[1], &meta)) goto done;
    result = Py_BuildValue("(OOOOy#y#LLL)", bounds, decoded, narrow ? Py_True : Py_False,
                           records != NULL ? records : Py_None, meta.options, meta.options_len,
                           meta.spec, meta.spec_len, (long long)summary[1],
                           (long long)summary[2], (long long)summary[3]);
    goto done;
error:
    clear_ordinary_error();  /* (out of memory: the general path meets it again, and says so) */
done:
    if (have_sizes) PyBuffer_Release(&sizes_view);
    if (have_values) PyBuffer_Release(&values_view);
    Py_XDECREF(sizes_owner);
    Py_XDECREF(values_owner);
    Py_XDECREF(bounds);
    Py_XDECREF(decoded);
    Py_XDECREF(records);
    PyMem_Free(copy);
    PyBuffer_Release(&b);
    if (result == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
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
    {"postscript", (PyCFunction)(void (*)(void))footer_postscript, METH_FASTCALL,
     "postscript(head, post_at, size, verify, hash64, /) -> int | None: the usual postscript."},
    {"small_footer", (PyCFunction)(void (*)(void))footer_small, METH_FASTCALL,
     "small_footer(raw, footer_offset, have, max_decoded, verify, hash64, decompress, /) -> "
     "tuple | None: the usual footer chunk, decoded and checked."},
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
