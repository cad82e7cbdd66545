/*
 * HighwayHash-64 for Riegeli / ArrayRecord checksums, as a tiny CPython extension.
 *
 * Written from the algorithm description in ARRAYRECORD_FORMAT.md section 3.1
 * (state of four 4-lane u64 vectors, 32-byte packets, zipper merge, remainder
 * packet, four finalization rounds). Two implementations of the same function:
 *
 *   - portable C99: no intrinsics, no alignment assumptions (all loads go through
 *     memcpy), little-endian loads on any host; ~1.3 GB/s;
 *   - AVX2 (x86-64 with GCC or Clang, chosen at import when the CPU has it): the
 *     whole state in four 256-bit registers, one packet per few instructions, the
 *     zipper merge a single byte shuffle; ~8x faster on large inputs. Built with a
 *     function-level target attribute, so the module needs no -mavx2 and still
 *     imports on any x86-64.
 *
 * Chunk data in ArrayRecord files is mostly small (one record per chunk at
 * group_size 1, ~0.5-64 KiB), so the Python call itself matters too: `hash64` is
 * METH_FASTCALL and takes its view without copying.
 *
 *   hash64(data, /) -> int              key = b"Riegeli/records\nRiegeli/records\n"
 *   hash64_pair(a, b, /) -> (int, int)  two hash64s in lockstep (faster with AVX2)
 *   hash64_key(key32, data, /) -> int   any 32-byte key
 *   hash64_impl(impl, key32, data, /) -> int   one named implementation (for tests)
 *   hash64_update(state, data, /)       feed whole packets into a 128-byte state
 *   hash64_final(state, tail, /) -> int the hash of all fed, then a tail under 32 bytes
 *   IMPL                                the implementation in use: "avx2" or "portable"
 *   IMPLS                               the implementations this build and CPU can run
 *   _C_API                              a capsule: hash64 for other C code of the package
 *
 * `data` is any object exporting a C-contiguous buffer; its raw bytes are hashed.
 * The GIL is released for inputs of 4 KiB or more.
 *
 * Only the limited C API (3.11's: the buffer protocol joined it then) is used, so one
 * `abi3` build serves every CPython >= 3.11 (setup.py defines Py_LIMITED_API there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Little-endian loads that are safe at any alignment.                */

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}
#elif defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && \
    __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__ && (defined(__GNUC__) || defined(__clang__))
static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return __builtin_bswap64(x);
}
#else
/* Unknown byte order: assemble byte by byte (compilers still fuse this). */
static inline uint64_t load_le64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}
#endif

/* ------------------------------------------------------------------ */
/* The hash.                                                          */

typedef struct {
    uint64_t v0[4];
    uint64_t v1[4];
    uint64_t mul0[4];
    uint64_t mul1[4];
} hh_state;

static const uint64_t INIT_MUL0[4] = {
    0xdbe6d5d5fe4cce2fULL, 0xa4093822299f31d0ULL, 0x13198a2e03707344ULL, 0x243f6a8885a308d3ULL};
static const uint64_t INIT_MUL1[4] = {
    0x3bd39e10cb0ef593ULL, 0xc0acf169b5f18a8cULL, 0xbe5466cf34e90c6cULL, 0x452821e638d01377ULL};

/* b"Riegeli/records\nRiegeli/records\n" as four little-endian u64. */
static const uint64_t RIEGELI_KEY[4] = {
    0x2f696c6567656952ULL, 0x0a7364726f636572ULL, 0x2f696c6567656952ULL, 0x0a7364726f636572ULL};

static inline uint64_t rot32(uint64_t x) { return (x >> 32) | (x << 32); }

static void hh_init(hh_state *s, const uint64_t key[4]) {
    for (int i = 0; i < 4; i++) {
        s->mul0[i] = INIT_MUL0[i];
        s->mul1[i] = INIT_MUL1[i];
        s->v0[i] = INIT_MUL0[i] ^ key[i];
        s->v1[i] = INIT_MUL1[i] ^ rot32(key[i]);
    }
}

/*
 * Zipper merge: with x = le(a) || le(b) (16 bytes), lane 0 takes bytes
 * [3,12,2,5,14,1,15,0] of x and lane 1 takes [11,4,10,13,9,6,8,7]. Each byte
 * moves by a fixed shift, grouped below by source word and shift:
 *   lane 0: a3->0 (>>24), b4->1 (>>24), a2->2, a5->3 (>>16), b6->4 (>>16),
 *           a1->5 (<<32), b7->6 (>>8), a0->7 (<<56)
 *   lane 1: b3->0 (>>24), a4->1 (>>24), b2->2, b5->3 (>>16), b1->4 (<<24),
 *           a6->5 (>>8), b0->6 (<<48), a7->7
 * The results are added to dst0 and dst1.
 */
static inline void zipper_add(uint64_t a, uint64_t b, uint64_t *dst0, uint64_t *dst1) {
    *dst0 += (((a & 0x00000000ff000000ULL) | (b & 0x000000ff00000000ULL)) >> 24) |
             (a & 0x0000000000ff0000ULL) |
             (((a & 0x0000ff0000000000ULL) | (b & 0x00ff000000000000ULL)) >> 16) |
             ((a & 0x000000000000ff00ULL) << 32) |
             ((b & 0xff00000000000000ULL) >> 8) |
             (a << 56);
    *dst1 += (((b & 0x00000000ff000000ULL) | (a & 0x000000ff00000000ULL)) >> 24) |
             (b & 0x0000000000ff0000ULL) |
             ((b & 0x0000ff0000000000ULL) >> 16) |
             ((b & 0x000000000000ff00ULL) << 24) |
             ((a & 0x00ff000000000000ULL) >> 8) |
             ((b & 0x00000000000000ffULL) << 48) |
             (a & 0xff00000000000000ULL);
}

static inline void hh_update(hh_state *s, const uint64_t lanes[4]) {
    for (int i = 0; i < 4; i++) {
        s->v1[i] += s->mul0[i] + lanes[i];
        s->mul0[i] ^= (s->v1[i] & 0xffffffffULL) * (s->v0[i] >> 32);
        s->v0[i] += s->mul1[i];
        s->mul1[i] ^= (s->v0[i] & 0xffffffffULL) * (s->v1[i] >> 32);
    }
    zipper_add(s->v1[0], s->v1[1], &s->v0[0], &s->v0[1]);
    zipper_add(s->v1[2], s->v1[3], &s->v0[2], &s->v0[3]);
    zipper_add(s->v0[0], s->v0[1], &s->v1[0], &s->v1[1]);
    zipper_add(s->v0[2], s->v0[3], &s->v1[2], &s->v1[3]);
}

static inline void hh_update_packet(hh_state *s, const uint8_t *p) {
    uint64_t lanes[4];
    lanes[0] = load_le64(p);
    lanes[1] = load_le64(p + 8);
    lanes[2] = load_le64(p + 16);
    lanes[3] = load_le64(p + 24);
    hh_update(s, lanes);
}

static void hh_remainder_packet(uint8_t packet[32], const uint8_t *tail, size_t n);

/* The final partial packet; n = size % 32, 1..31, tail points at its n bytes. */
static void hh_update_remainder(hh_state *s, const uint8_t *tail, size_t n) {
    uint8_t packet[32];
    const unsigned r = (unsigned)n;

    for (int i = 0; i < 4; i++) {
        s->v0[i] += ((uint64_t)n << 32) + n;
        /* rotate each 32-bit half of v1[i] left by n (1..31) */
        uint32_t lo = (uint32_t)s->v1[i];
        uint32_t hi = (uint32_t)(s->v1[i] >> 32);
        lo = (lo << r) | (lo >> (32 - r));
        hi = (hi << r) | (hi >> (32 - r));
        s->v1[i] = ((uint64_t)hi << 32) | lo;
    }
    hh_remainder_packet(packet, tail, n);
    hh_update_packet(s, packet);
}

static uint64_t hh_finalize64(hh_state *s) {
    for (int k = 0; k < 4; k++) {
        uint64_t lanes[4];
        lanes[0] = rot32(s->v0[2]);
        lanes[1] = rot32(s->v0[3]);
        lanes[2] = rot32(s->v0[0]);
        lanes[3] = rot32(s->v0[1]);
        hh_update(s, lanes);
    }
    return s->v0[0] + s->v1[0] + s->mul0[0] + s->mul1[0];
}

/* The final partial packet's 32 bytes (n = 1..31 bytes at tail). */
static void hh_remainder_packet(uint8_t packet[32], const uint8_t *tail, size_t n) {
    const size_t whole = n & ~(size_t)3;
    const size_t m = n & 3;
    memset(packet, 0, 32);
    memcpy(packet, tail, whole);
    if (n & 16) {
        memcpy(packet + 28, tail + n - 4, 4);
    } else if (m) {
        const uint8_t *t = tail + whole;
        packet[16] = t[0];
        packet[17] = t[m >> 1];
        packet[18] = t[m - 1];
    }
}

static uint64_t hh_portable(const uint64_t key[4], const uint8_t *data, size_t size) {
    hh_state s;
    hh_init(&s, key);
    const size_t full = size & ~(size_t)31;
    for (size_t i = 0; i < full; i += 32) {
        hh_update_packet(&s, data + i);
    }
    if (size & 31) {
        hh_update_remainder(&s, data + full, size & 31);
    }
    return hh_finalize64(&s);
}

/* ------------------------------------------------------------------ */
/* AVX2: the same steps on whole 4-lane vectors.                      */

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(AIOLOADER_HH_PORTABLE_ONLY)
#define HH_HAVE_AVX2 1
#include <immintrin.h>

#define HH_AVX2 __attribute__((target("avx2")))

typedef struct {
    __m256i v0, v1, mul0, mul1;
} hh_avx2_state;

/* The zipper merge's byte indices (see zipper_add) as a per-128-bit-lane shuffle. */
HH_AVX2 static inline __m256i hh_avx2_zipper(__m256i v) {
    const __m256i mask = _mm256_set_epi64x(0x070806090D0A040BLL, 0x000F010E05020C03LL,
                                           0x070806090D0A040BLL, 0x000F010E05020C03LL);
    return _mm256_shuffle_epi8(v, mask);
}

HH_AVX2 static inline void hh_avx2_update(hh_avx2_state *s, __m256i packet) {
    __m256i v0 = s->v0, v1 = s->v1, mul0 = s->mul0, mul1 = s->mul1;
    v1 = _mm256_add_epi64(v1, _mm256_add_epi64(mul0, packet));
    /* _mm256_mul_epu32 multiplies the low 32 bits of each u64 lane. */
    mul0 = _mm256_xor_si256(mul0, _mm256_mul_epu32(v1, _mm256_srli_epi64(v0, 32)));
    v0 = _mm256_add_epi64(v0, mul1);
    mul1 = _mm256_xor_si256(mul1, _mm256_mul_epu32(v0, _mm256_srli_epi64(v1, 32)));
    v0 = _mm256_add_epi64(v0, hh_avx2_zipper(v1));
    v1 = _mm256_add_epi64(v1, hh_avx2_zipper(v0));
    s->v0 = v0;
    s->v1 = v1;
    s->mul0 = mul0;
    s->mul1 = mul1;
}

HH_AVX2 static void hh_avx2_init(hh_avx2_state *s, const uint64_t key[4]) {
    const __m256i k = _mm256_loadu_si256((const __m256i *)key);
    const __m256i m0 = _mm256_loadu_si256((const __m256i *)INIT_MUL0);
    const __m256i m1 = _mm256_loadu_si256((const __m256i *)INIT_MUL1);
    s->mul0 = m0;
    s->mul1 = m1;
    s->v0 = _mm256_xor_si256(m0, k);
    s->v1 = _mm256_xor_si256(m1, _mm256_shuffle_epi32(k, _MM_SHUFFLE(2, 3, 0, 1))); /* rot32 */
}

/* The packets of data[done:size] (`done` a multiple of 32), the remainder, finalization. */
HH_AVX2 static uint64_t hh_avx2_finish(hh_avx2_state *sp, const uint8_t *data, size_t size,
                                       size_t done) {
    hh_avx2_state s = *sp;
    const size_t full = size & ~(size_t)31;
    for (size_t i = done; i < full; i += 32) {
        hh_avx2_update(&s, _mm256_loadu_si256((const __m256i *)(data + i)));
    }
    const size_t n = size & 31;
    if (n) {
        uint8_t packet[32];
        const __m256i add = _mm256_set1_epi64x((long long)(((uint64_t)n << 32) + n));
        s.v0 = _mm256_add_epi64(s.v0, add);
        /* rotate each 32-bit half of v1 left by n (1..31) */
        const __m128i left = _mm_cvtsi32_si128((int)n);
        const __m128i right = _mm_cvtsi32_si128((int)(32 - n));
        s.v1 = _mm256_or_si256(_mm256_sll_epi32(s.v1, left), _mm256_srl_epi32(s.v1, right));
        hh_remainder_packet(packet, data + full, n);
        hh_avx2_update(&s, _mm256_loadu_si256((const __m256i *)packet));
    }
    for (int r = 0; r < 4; r++) {
        /* lanes (rot32(v0[2]), rot32(v0[3]), rot32(v0[0]), rot32(v0[1])) */
        __m256i p = _mm256_permute4x64_epi64(s.v0, _MM_SHUFFLE(1, 0, 3, 2));
        hh_avx2_update(&s, _mm256_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
    }
    const __m256i sum = _mm256_add_epi64(_mm256_add_epi64(s.v0, s.v1),
                                         _mm256_add_epi64(s.mul0, s.mul1));
    return (uint64_t)_mm_cvtsi128_si64(_mm256_castsi256_si128(sum));
}

HH_AVX2 static uint64_t hh_avx2(const uint64_t key[4], const uint8_t *data, size_t size) {
    hh_avx2_state s;
    hh_avx2_init(&s, key);
    return hh_avx2_finish(&s, data, size, 0);
}

/* Whole packets into a portable state (the same lane layout), for hash64_update. */
HH_AVX2 static void hh_avx2_packets(hh_state *st, const uint8_t *data, size_t size) {
    hh_avx2_state s;
    s.v0 = _mm256_loadu_si256((const __m256i *)st->v0);
    s.v1 = _mm256_loadu_si256((const __m256i *)st->v1);
    s.mul0 = _mm256_loadu_si256((const __m256i *)st->mul0);
    s.mul1 = _mm256_loadu_si256((const __m256i *)st->mul1);
    for (size_t i = 0; i < size; i += 32) {
        hh_avx2_update(&s, _mm256_loadu_si256((const __m256i *)(data + i)));
    }
    _mm256_storeu_si256((__m256i *)st->v0, s.v0);
    _mm256_storeu_si256((__m256i *)st->v1, s.v1);
    _mm256_storeu_si256((__m256i *)st->mul0, s.mul0);
    _mm256_storeu_si256((__m256i *)st->mul1, s.mul1);
}

/* Two inputs in lockstep: a packet's update is a chain of dependent multiplies and
 * shuffles, so one hash leaves most of the core idle; two independent chains fill it. */
HH_AVX2 static void hh_avx2_pair(const uint64_t key[4], const uint8_t *a, size_t na,
                                 const uint8_t *b, size_t nb, uint64_t out[2]) {
    hh_avx2_state sa, sb;
    hh_avx2_init(&sa, key);
    hh_avx2_init(&sb, key);
    const size_t common = (na < nb ? na : nb) & ~(size_t)31;
    for (size_t i = 0; i < common; i += 32) {
        hh_avx2_update(&sa, _mm256_loadu_si256((const __m256i *)(a + i)));
        hh_avx2_update(&sb, _mm256_loadu_si256((const __m256i *)(b + i)));
    }
    out[0] = hh_avx2_finish(&sa, a, na, common);
    out[1] = hh_avx2_finish(&sb, b, nb, common);
}
#endif

/* ------------------------------------------------------------------ */
/* Dispatch: chosen once, at import.                                  */

typedef uint64_t (*hh_fn)(const uint64_t key[4], const uint8_t *data, size_t size);

typedef void (*hh_pair_fn)(const uint64_t key[4], const uint8_t *a, size_t na,
                           const uint8_t *b, size_t nb, uint64_t out[2]);

static void hh_portable_pair(const uint64_t key[4], const uint8_t *a, size_t na,
                             const uint8_t *b, size_t nb, uint64_t out[2]) {
    out[0] = hh_portable(key, a, na);
    out[1] = hh_portable(key, b, nb);
}

static void hh_portable_packets(hh_state *s, const uint8_t *data, size_t size) {
    for (size_t i = 0; i < size; i += 32) hh_update_packet(s, data + i);
}

typedef void (*hh_packets_fn)(hh_state *s, const uint8_t *data, size_t size);
static hh_packets_fn hh_packets = hh_portable_packets;
static hh_fn highwayhash64 = hh_portable;
static hh_pair_fn highwayhash64_pair = hh_portable_pair;
static const char *hh_impl_name = "portable";

static void hh_choose(void) {
#ifdef HH_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        highwayhash64 = hh_avx2;
        highwayhash64_pair = hh_avx2_pair;
        hh_packets = hh_avx2_packets;
        hh_impl_name = "avx2";
    }
#endif
}

/* ------------------------------------------------------------------ */
/* Python bindings.                                                   */

#define RELEASE_GIL_THRESHOLD 4096

/* Get a C-contiguous byte view of obj; on failure set an exception and return -1. */
static int get_contiguous(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            /* The limited API hides tp_name; the type's qualified name is public API. */
            PyObject *type_name = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
            if (type_name == NULL) {
                return -1;
            }
            PyErr_Format(PyExc_TypeError,
                         "%s must support the buffer protocol (bytes, bytearray, "
                         "memoryview, ...), not '%.200U'",
                         what, type_name);
            Py_DECREF(type_name);
        }
        return -1;
    }
    /* PyBUF_SIMPLE already demands contiguity; check anyway in case an exporter
       ignores the flags. */
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_BufferError, "%s must be a C-contiguous buffer", what);
        return -1;
    }
    return 0;
}

static PyObject *hash_buffer(hh_fn fn, const uint64_t key[4], PyObject *data) {
    Py_buffer view;
    uint64_t h;
    if (get_contiguous(data, &view, "data") < 0) {
        return NULL;
    }
    if (view.len >= RELEASE_GIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS
        h = fn(key, (const uint8_t *)view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        h = fn(key, (const uint8_t *)view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong((unsigned long long)h);
}

/* Read a 32-byte key buffer as four little-endian u64; on failure set an exception, -1. */
static int parse_key(PyObject *obj, uint64_t key[4]) {
    Py_buffer kview;
    if (get_contiguous(obj, &kview, "key") < 0) {
        return -1;
    }
    if (kview.len != 32) {
        Py_ssize_t len = kview.len;
        PyBuffer_Release(&kview);
        PyErr_Format(PyExc_ValueError, "key must be exactly 32 bytes, got %zd", len);
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        key[i] = load_le64((const uint8_t *)kview.buf + 8 * i);
    }
    PyBuffer_Release(&kview);
    return 0;
}

PyDoc_STRVAR(hash64_doc,
"hash64(data, /) -> int\n"
"\n"
"HighwayHash-64 of the raw bytes of `data` (any C-contiguous buffer) with\n"
"Riegeli's key b\"Riegeli/records\\nRiegeli/records\\n\". Riegeli stores the\n"
"result as a little-endian u64.");

static PyObject *hh_hash64(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 1) {
        PyErr_Format(PyExc_TypeError, "hash64() takes exactly 1 argument (%zd given)", nargs);
        return NULL;
    }
    return hash_buffer(highwayhash64, RIEGELI_KEY, args[0]);
}

PyDoc_STRVAR(hash64_pair_doc,
"hash64_pair(a, b, /) -> tuple[int, int]\n"
"\n"
"(hash64(a), hash64(b)), computed in lockstep: ~1.5-2x the bytes per second of two\n"
"calls where the CPU has AVX2 (the same as two calls elsewhere).");

static PyObject *hh_hash64_pair(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    Py_buffer va, vb;
    uint64_t out[2];
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "hash64_pair() takes exactly 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (get_contiguous(args[0], &va, "a") < 0) {
        return NULL;
    }
    if (get_contiguous(args[1], &vb, "b") < 0) {
        PyBuffer_Release(&va);
        return NULL;
    }
    if (va.len + vb.len >= RELEASE_GIL_THRESHOLD) {
        Py_BEGIN_ALLOW_THREADS
        highwayhash64_pair(RIEGELI_KEY, (const uint8_t *)va.buf, (size_t)va.len,
                           (const uint8_t *)vb.buf, (size_t)vb.len, out);
        Py_END_ALLOW_THREADS
    } else {
        highwayhash64_pair(RIEGELI_KEY, (const uint8_t *)va.buf, (size_t)va.len,
                           (const uint8_t *)vb.buf, (size_t)vb.len, out);
    }
    PyBuffer_Release(&va);
    PyBuffer_Release(&vb);
    return Py_BuildValue("(KK)", (unsigned long long)out[0], (unsigned long long)out[1]);
}

PyDoc_STRVAR(hash64_key_doc,
"hash64_key(key32, data, /) -> int\n"
"\n"
"HighwayHash-64 of the raw bytes of `data` with an arbitrary key: `key32` is a\n"
"32-byte buffer read as four little-endian u64.");

static PyObject *hh_hash64_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    uint64_t key[4];
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "hash64_key() takes exactly 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (parse_key(args[0], key) < 0) {
        return NULL;
    }
    return hash_buffer(highwayhash64, key, args[1]);
}

PyDoc_STRVAR(hash64_impl_doc,
"hash64_impl(impl, key32, data, /) -> int\n"
"\n"
"hash64_key() computed by one named implementation (\"portable\" or \"avx2\", see\n"
"IMPLS), whatever the CPU would choose: lets the tests compare them.");

static PyObject *hh_hash64_impl(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    uint64_t key[4];
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "hash64_impl() takes exactly 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    const char *name = PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8AndSize(args[0], NULL) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "impl must be a str");
        }
        return NULL;
    }
    hh_fn chosen = NULL;
    if (strcmp(name, "portable") == 0) {
        chosen = hh_portable;
    }
#ifdef HH_HAVE_AVX2
    else if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        chosen = hh_avx2;
    }
#endif
    if (chosen == NULL) {
        PyErr_Format(PyExc_ValueError, "implementation %R is not available here", args[0]);
        return NULL;
    }
    if (parse_key(args[1], key) < 0) {
        return NULL;
    }
    return hash_buffer(chosen, key, args[2]);
}

/* ------------------------------------------------------------------ */
/* A hash over data that arrives in pieces (a footer read in windows). */

PyDoc_STRVAR(hash64_update_doc,
"hash64_update(state, data, impl=None, /) -> None\n"
"\n"
"Feed whole 32-byte packets of `data` (its length a multiple of 32) into `state`, a\n"
"writable buffer of 128 bytes; a state of all zero bytes is taken as fresh (Riegeli's\n"
"key). `hash64_final(state, tail)` then gives hash64 of everything fed and `tail`.\n"
"`impl` (\"portable\" or \"avx2\", see IMPLS) runs one named implementation, whatever\n"
"the CPU would choose: lets the tests compare them; None: the one in use.");

static int get_state(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) return -1;
    if (view->len != (Py_ssize_t)sizeof(hh_state)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "state must be a writable buffer of 128 bytes");
        return -1;
    }
    hh_state s;
    memcpy(&s, view->buf, sizeof s);
    int fresh = 1;
    for (int i = 0; i < 4; i++) fresh &= s.mul0[i] == 0 && s.mul1[i] == 0;
    if (fresh) {
        hh_init(&s, RIEGELI_KEY);
        memcpy(view->buf, &s, sizeof s);
    }
    return 0;
}

static PyObject *hh_hash64_update(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 && nargs != 3) {
        PyErr_Format(PyExc_TypeError, "hash64_update() takes 2 or 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    hh_packets_fn packets = hh_packets;
    if (nargs == 3 && args[2] != Py_None) {
        const char *name =
            PyUnicode_Check(args[2]) ? PyUnicode_AsUTF8AndSize(args[2], NULL) : NULL;
        if (name == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "impl must be a str");
            return NULL;
        }
        packets = NULL;
        if (strcmp(name, "portable") == 0) packets = hh_portable_packets;
#ifdef HH_HAVE_AVX2
        else if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2"))
            packets = hh_avx2_packets;
#endif
        if (packets == NULL) {
            PyErr_Format(PyExc_ValueError, "implementation %R is not available here", args[2]);
            return NULL;
        }
    }
    Py_buffer sview, dview;
    if (get_state(args[0], &sview) < 0) return NULL;
    if (get_contiguous(args[1], &dview, "data") < 0) {
        PyBuffer_Release(&sview);
        return NULL;
    }
    if (dview.len % 32) {
        PyBuffer_Release(&dview);
        PyBuffer_Release(&sview);
        PyErr_SetString(PyExc_ValueError, "hash64_update() takes whole 32-byte packets");
        return NULL;
    }
    hh_state s;
    memcpy(&s, sview.buf, sizeof s);
    const uint8_t *p = (const uint8_t *)dview.buf;
    Py_BEGIN_ALLOW_THREADS
    packets(&s, p, (size_t)dview.len);
    Py_END_ALLOW_THREADS
    memcpy(sview.buf, &s, sizeof s);
    PyBuffer_Release(&dview);
    PyBuffer_Release(&sview);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(hash64_final_doc,
"hash64_final(state, tail, /) -> int\n"
"\n"
"hash64 of what `hash64_update` fed into `state`, then `tail` (under 32 bytes).");

static PyObject *hh_hash64_final(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "hash64_final() takes exactly 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    Py_buffer sview, tview;
    if (get_state(args[0], &sview) < 0) return NULL;
    if (get_contiguous(args[1], &tview, "tail") < 0) {
        PyBuffer_Release(&sview);
        return NULL;
    }
    if (tview.len >= 32) {
        PyBuffer_Release(&tview);
        PyBuffer_Release(&sview);
        PyErr_SetString(PyExc_ValueError, "hash64_final() takes a tail of under 32 bytes");
        return NULL;
    }
    hh_state s;
    memcpy(&s, sview.buf, sizeof s);
    if (tview.len) hh_update_remainder(&s, (const uint8_t *)tview.buf, (size_t)tview.len);
    uint64_t h = hh_finalize64(&s);
    PyBuffer_Release(&tview);
    PyBuffer_Release(&sview);
    return PyLong_FromUnsignedLongLong((unsigned long long)h);
}

static PyMethodDef hh_methods[] = {
    {"hash64", (PyCFunction)(void (*)(void))hh_hash64, METH_FASTCALL, hash64_doc},
    {"hash64_pair", (PyCFunction)(void (*)(void))hh_hash64_pair, METH_FASTCALL, hash64_pair_doc},
    {"hash64_key", (PyCFunction)(void (*)(void))hh_hash64_key, METH_FASTCALL, hash64_key_doc},
    {"hash64_impl", (PyCFunction)(void (*)(void))hh_hash64_impl, METH_FASTCALL,
     hash64_impl_doc},
    {"hash64_update", (PyCFunction)(void (*)(void))hh_hash64_update, METH_FASTCALL,
     hash64_update_doc},
    {"hash64_final", (PyCFunction)(void (*)(void))hh_hash64_final, METH_FASTCALL,
     hash64_final_doc},
    {NULL, NULL, 0, NULL},
};

/* For other extensions of this package (`_onerecords`), which hash chunks in their own C
 * loops: `HH_CAPI_NAME` names a capsule holding a `hh_capi` (see `_onerecords.c`). */
typedef struct {
    uint64_t (*riegeli_hash64)(const uint8_t *data, size_t size);
    void (*riegeli_hash64_pair)(const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                                uint64_t out[2]);
} hh_capi;

static uint64_t riegeli_hash64(const uint8_t *data, size_t size) {
    return highwayhash64(RIEGELI_KEY, data, size);
}

static void riegeli_hash64_pair(const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                                uint64_t out[2]) {
    highwayhash64_pair(RIEGELI_KEY, a, na, b, nb, out);
}

static const hh_capi HH_CAPI = {riegeli_hash64, riegeli_hash64_pair};
#define HH_CAPI_NAME "aioloader.arrayrecord._highwayhash._C_API"

static int hh_exec(PyObject *module) {
    hh_choose();
    PyObject *capi = PyCapsule_New((void *)&HH_CAPI, HH_CAPI_NAME, NULL);
    if (capi == NULL || PyModule_AddObject(module, "_C_API", capi) < 0) {
        Py_XDECREF(capi);
        return -1;
    }
    PyObject *impls;
#ifdef HH_HAVE_AVX2
    if (__builtin_cpu_supports("avx2")) {
        impls = Py_BuildValue("(ss)", "portable", "avx2");
    } else
#endif
    {
        impls = Py_BuildValue("(s)", "portable");
    }
    if (impls == NULL || PyModule_AddObject(module, "IMPLS", impls) < 0) {
        Py_XDECREF(impls);
        return -1;
    }
    return PyModule_AddStringConstant(module, "IMPL", hh_impl_name);
}

/* The module's only state is the implementation, chosen from the CPU (the same answer in
 * every interpreter), so it is safe in subinterpreters. */
static PyModuleDef_Slot hh_slots[] = {
    {Py_mod_exec, (void *)hh_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(module_doc,
"HighwayHash-64 (portable C) for Riegeli/ArrayRecord block, chunk-header and data hashes.");

static struct PyModuleDef hh_module = {
    PyModuleDef_HEAD_INIT,
    "_highwayhash", /* m_name */
    module_doc,     /* m_doc */
    0,              /* m_size */
    hh_methods,     /* m_methods */
    hh_slots,       /* m_slots */
    NULL,           /* m_traverse */
    NULL,           /* m_clear */
    NULL,           /* m_free */
};

PyMODINIT_FUNC PyInit__highwayhash(void) { return PyModuleDef_Init(&hh_module); }
