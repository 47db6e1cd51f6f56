/*
 * dlreplay.analyze._kernels: the analysis passes' per-event loops in C (optional).
 *
 * Each kernel is one pass over columns the caller takes from the event table (numpy views of
 * polars' buffers), without a sort and without a join's temporaries; the GIL is released
 * while it runs. dlreplay.analyze.passes holds the polars queries they replace: those are the
 * definition (tests compare the two) and the path taken where this module is not built.
 *
 * read_flags_new() -> state;  read_flags(state, pid, file, kind, offset, size);
 * read_flag_groups(state) -> (file, size, n, seq, consec)
 *
 *   Darshan's sequential / consecutive reads, per (process, file) and per open of it,
 *   counted per (file, size) of the reads, over rows in time order (the order of the event
 *   table) given in one or more read_flags calls (batches of rows in that order, or of
 *   whole processes): the state carries each (process, file)'s last read across calls.
 *   Inputs, n rows each:
 *     pid     int64: the process id, INT64_MIN for a null pid (its own process, as in the
 *             polars query, where a null pid sorts as one group)
 *     file    uint32: the file's code (any integer naming the file)
 *     kind    uint8: 0 a row to skip, 1 an open (the next read of that process and file
 *             has no predecessor), 2 a read that counts (bytes moved, offset known)
 *     offset, size  int64: of the reads (other rows: any value)
 *   A read is sequential when its offset is at or past the end of the previous read of
 *   that (process, file) since its last open (0 when there is none), consecutive when it
 *   is that end. read_flag_groups gives, per (file, size) of the reads counted so far, in
 *   no particular order: file codes (bytes of uint32), sizes, reads, sequential and
 *   consecutive ones (bytes of int64).
 *
 * interval_sums(row_key, row_ts, row_val, iv_key, iv_ts, iv_end, overlap, counts, sums)
 *
 *   A backward as-of join by key, aggregated: each row's interval is the last of its key whose
 *   start is at or before the row's ts (of equal starts, the last: as polars' join_asof with
 *   strategy "backward" takes the last of equal right keys). Inputs:
 *     row_key, row_ts, row_val  int64, n rows in any order (rows in time order go fastest); a
 *                               row whose key or ts is INT64_MIN (null) matches nothing
 *     iv_key, iv_ts, iv_end     int64, m intervals sorted by (key, ts); no INT64_MIN key or ts
 *   The rows are then counted and summed per interval: without
 *   overlap, the rows inside it (ts <= its end) add 1 to counts and row_val to sums; with
 *   overlap, every row matched adds 1 to counts and to sums the time that [ts, ts + row_val)
 *   lies inside the interval (min(ts + row_val, end) - ts, at least 0). An interval whose end
 *   is INT64_MIN (null) takes no row. row_val int64 (n), iv_end int64 (m); counts and sums
 *   writable int64 (m), added to (so that batches of rows add up).
 *
 * All return None; ValueError where the buffers' sizes disagree or the intervals are not sorted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "_pybuf.h"

/* Open addressing over (int64, uint32) keys; grows at half load. */
typedef struct {
    int64_t a;
    uint32_t b;
    uint32_t used;
    int64_t v0; /* read_flags: the previous read's end; asof: the key's first interval */
    int64_t v1; /* read_flags: 1 when that read follows the last open; asof: one past its last */
    int64_t v2; /* asof: the interval last matched (a cursor), -1 none */
} Slot;

typedef struct {
    Slot *s;
    size_t cap, n;
} Table;

static inline uint64_t mix(int64_t a, uint32_t b)
{
    uint64_t h = (uint64_t)a * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)b + 0x632BE59BD9B4E019ULL) * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 31;
    h *= 0xD6E8FEB86659FD93ULL;
    return h ^ (h >> 32);
}

static int table_init(Table *t, size_t cap)
{
    t->cap = cap;
    t->n = 0;
    t->s = calloc(cap, sizeof(Slot));
    return t->s ? 0 : -1;
}

/* The slot of (a, b); a new one (used = 1, values 0) when absent. NULL when out of memory. */
static Slot *table_get(Table *t, int64_t a, uint32_t b, int *fresh)
{
    if (2 * (t->n + 1) > t->cap) {
        Table g;
        if (table_init(&g, t->cap * 2) < 0) return NULL;
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->s[i].used) continue;
            size_t j = mix(t->s[i].a, t->s[i].b) & (g.cap - 1);
            while (g.s[j].used) j = (j + 1) & (g.cap - 1);
            g.s[j] = t->s[i];
        }
        g.n = t->n;
        free(t->s);
        *t = g;
    }
    size_t j = mix(a, b) & (t->cap - 1);
    while (t->s[j].used) {
        if (t->s[j].a == a && t->s[j].b == b) {
            *fresh = 0;
            return &t->s[j];
        }
        j = (j + 1) & (t->cap - 1);
    }
    t->s[j].used = 1;
    t->s[j].a = a;
    t->s[j].b = b;
    t->n++;
    *fresh = 1;
    return &t->s[j];
}

static Slot *table_find(const Table *t, int64_t a, uint32_t b)
{
    size_t j = mix(a, b) & (t->cap - 1);
    while (t->s[j].used) {
        if (t->s[j].a == a && t->s[j].b == b) return &t->s[j];
        j = (j + 1) & (t->cap - 1);
    }
    return NULL;
}

/* read_flags' state: each (process, file)'s last read (files) and each (file, size)'s counts (groups) */
typedef struct {
    Table files, groups;
} FlagState;

static void flag_state_free(PyObject *capsule)
{
    FlagState *st = PyCapsule_GetPointer(capsule, "dlreplay.read_flags");
    if (!st) return;
    free(st->files.s);
    free(st->groups.s);
    free(st);
}

static PyObject *read_flags_new(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    FlagState *st = calloc(1, sizeof(FlagState));
    if (!st || table_init(&st->files, 1024) < 0 || table_init(&st->groups, 1024) < 0) {
        if (st) {
            free(st->files.s);
            free(st);
        }
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(st, "dlreplay.read_flags", flag_state_free);
    if (!cap) {
        free(st->files.s);
        free(st->groups.s);
        free(st);
    }
    return cap;
}

static PyObject *read_flags(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *o[5];
    if (!PyArg_ParseTuple(args, "OOOOOO", &cap, &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    FlagState *st = PyCapsule_GetPointer(cap, "dlreplay.read_flags");
    if (!st) return NULL;
    static const Py_ssize_t isz[5] = {8, 4, 1, 8, 8};
    Py_buffer b[5];
    int got = 0, oom = 0;
    PyObject *result = NULL;
    for (; got < 5; got++)
        if (get_buf(o[got], &b[got], isz[got], 0, "read_flags") < 0) goto done;
    Py_ssize_t n = b[0].len / 8;
    for (int i = 1; i < 5; i++)
        if (b[i].len / isz[i] != n) {
            PyErr_SetString(PyExc_ValueError, "read_flags: the columns differ in length");
            goto done;
        }
    const int64_t *pid = b[0].buf, *off = b[3].buf, *size = b[4].buf;
    const uint32_t *file = b[1].buf;
    const uint8_t *kind = b[2].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!kind[i]) continue;
        int fresh;
        Slot *s = table_get(&st->files, pid[i], file[i], &fresh);
        if (!s) {
            oom = 1;
            break;
        }
        if (kind[i] == 1) {
            s->v1 = 0;
            continue;
        }
        int64_t prev_end = s->v1 ? s->v0 : 0;
        s->v0 = (int64_t)((uint64_t)off[i] + (uint64_t)size[i]);
        s->v1 = 1;
        Slot *g = table_get(&st->groups, size[i], file[i], &fresh);
        if (!g) {
            oom = 1;
            break;
        }
        g->v0++;
        g->v1 += off[i] >= prev_end;
        g->v2 += off[i] == prev_end;
    }
    Py_END_ALLOW_THREADS
    if (oom) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *read_flag_groups(PyObject *self, PyObject *cap)
{
    (void)self;
    FlagState *st = PyCapsule_GetPointer(cap, "dlreplay.read_flags");
    if (!st) return NULL;
    Py_ssize_t m = (Py_ssize_t)st->groups.n;
    PyObject *out[5] = {PyBytes_FromStringAndSize(NULL, m * 4), PyBytes_FromStringAndSize(NULL, m * 8),
                        PyBytes_FromStringAndSize(NULL, m * 8), PyBytes_FromStringAndSize(NULL, m * 8),
                        PyBytes_FromStringAndSize(NULL, m * 8)};
    for (int i = 0; i < 5; i++)
        if (!out[i]) {
            for (int j = 0; j < 5; j++) Py_XDECREF(out[j]);
            return NULL;
        }
    uint32_t *code = (uint32_t *)PyBytes_AS_STRING(out[0]);
    int64_t *size = (int64_t *)PyBytes_AS_STRING(out[1]), *cnt = (int64_t *)PyBytes_AS_STRING(out[2]),
            *seq = (int64_t *)PyBytes_AS_STRING(out[3]), *con = (int64_t *)PyBytes_AS_STRING(out[4]);
    Py_ssize_t k = 0;
    for (size_t j = 0; j < st->groups.cap; j++) {
        const Slot *g = &st->groups.s[j];
        if (!g->used) continue;
        code[k] = g->b;
        size[k] = g->a;
        cnt[k] = g->v0;
        seq[k] = g->v1;
        con[k] = g->v2;
        k++;
    }
    return Py_BuildValue("(NNNNN)", out[0], out[1], out[2], out[3], out[4]);
}

/* The intervals' keys: each key's run [v0, v1) of intervals sorted by (key, ts); v2 a cursor. */
static int key_runs(Table *t, const int64_t *ik, const int64_t *it, Py_ssize_t m, int *unsorted)
{
    *unsorted = 0;
    for (Py_ssize_t j = 1; j < m; j++)
        if (ik[j] < ik[j - 1] || (ik[j] == ik[j - 1] && it[j] < it[j - 1])) {
            *unsorted = 1;
            return 0;
        }
    if (table_init(t, 64) < 0) return -1;
    for (Py_ssize_t j = 0; j < m; j++) {
        int fresh;
        Slot *s = table_get(t, ik[j], 0, &fresh);
        if (!s) {
            free(t->s);
            t->s = NULL;
            return -1;
        }
        if (fresh) {
            s->v0 = j;
            s->v2 = -1;
        }
        s->v1 = j + 1;
    }
    return 0;
}

/* The last interval of key whose start <= ts, or -1 (a null key or ts matches nothing). */
static inline int64_t find_last(const Table *t, const int64_t *it, int64_t key, int64_t ts)
{
    if (key == INT64_MIN || ts == INT64_MIN) return -1;
    Slot *s = table_find(t, key, 0);
    if (!s) return -1;
    int64_t lo = s->v0, hi = s->v1, c = s->v2, a = lo, z = hi;
    if (c >= 0 && it[c] <= ts) { /* rows in time order: a few steps on from the last match */
        int k = 0;
        while (k < 16 && c + 1 < hi && it[c + 1] <= ts) c++, k++;
        a = c + 1;
        z = (k < 16 || c + 1 >= hi || it[c + 1] > ts) ? a : hi;
    }
    while (a < z) { /* the first start > ts in [a, z) */
        int64_t mid = a + (z - a) / 2;
        if (it[mid] <= ts) a = mid + 1;
        else z = mid;
    }
    int64_t hit = a - 1 >= lo ? a - 1 : -1;
    if (hit >= 0) s->v2 = hit;
    return hit;
}

static PyObject *interval_sums(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[8];
    int overlap;
    if (!PyArg_ParseTuple(args, "OOOOOOpOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &overlap, &o[6], &o[7]))
        return NULL;
    Py_buffer b[8];
    int got = 0, bad = 0, unsorted = 0;
    PyObject *result = NULL;
    for (; got < 8; got++)
        if (get_buf(o[got], &b[got], 8, got >= 6, "interval_sums") < 0) goto done;
    Py_ssize_t n = b[0].len / 8, m = b[3].len / 8;
    if (b[1].len / 8 != n || b[2].len / 8 != n || b[4].len / 8 != m || b[5].len / 8 != m || b[6].len / 8 != m ||
        b[7].len / 8 != m) {
        PyErr_SetString(PyExc_ValueError, "interval_sums: rows or intervals of unlike lengths");
        goto done;
    }
    const int64_t *rk = b[0].buf, *rt = b[1].buf, *rv = b[2].buf, *ik = b[3].buf, *it = b[4].buf, *ie = b[5].buf;
    int64_t *cnt = b[6].buf, *sum = b[7].buf;
    Py_BEGIN_ALLOW_THREADS
    Table t = {0};
    if (key_runs(&t, ik, it, m, &unsorted) < 0) bad = 1;
    if (!bad && !unsorted) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t j = find_last(&t, it, rk[i], rt[i]);
            if (j < 0 || ie[j] == INT64_MIN) continue;
            if (overlap) {
                int64_t end = (int64_t)((uint64_t)rt[i] + (uint64_t)rv[i]);
                int64_t inside = (end < ie[j] ? end : ie[j]) - rt[i];
                cnt[j]++;
                sum[j] += inside > 0 ? inside : 0;
            } else if (rt[i] <= ie[j]) {
                cnt[j]++;
                sum[j] += rv[i];
            }
        }
    }
    free(t.s);
    Py_END_ALLOW_THREADS
    if (unsorted) PyErr_SetString(PyExc_ValueError, "interval_sums: intervals not sorted by (key, ts)");
    else if (bad) PyErr_NoMemory();
    else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"read_flags_new", read_flags_new, METH_NOARGS, "A fresh state for read_flags (see the module source)."},
    {"read_flags", read_flags, METH_VARARGS, "Darshan's seq / consec reads counted per (file, size), rows in time order."},
    {"read_flag_groups", read_flag_groups, METH_O, "The (file, size) groups read_flags counted, as bytes of arrays."},
    {"interval_sums", interval_sums, METH_VARARGS, "Rows counted and summed into their as-of intervals (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "The analysis passes' per-event loops in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
