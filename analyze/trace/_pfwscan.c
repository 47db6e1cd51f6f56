/*
 * dlreplay.analyze._pfwscan: a strict scanner of DFTracer JSON lines into column arrays.
 *
 * scan(texts, ints, imask, strs, rows[, checked]) -> (nevents, nmeta, rejected, uniques, any_mask, fields) | None
 *
 *   texts  decoded trace text: one bytes-like object, or a list of them scanned as one text
 *          whose lines are numbered on across them (each holds complete "\n"-separated lines;
 *          its last line may lack "\n": the end of a text always ends a line)
 *   ints   writable int64 buffer of NI * cap values: int field f of output row r at f*cap + r
 *   imask  writable uint32 buffer of cap values: bit f set when int field f of row r is present
 *   strs   writable int32 buffer of NS * cap values: string field f of row r at f*cap + r, a
 *          code into ``uniques`` (-1: absent or null)
 *   rows   writable int64 buffer of cap values: the line number (0-based, across texts) of row r
 *
 *   checked  true when the caller already found text valid UTF-8 (text_info): not checked again
 *
 * cap (the length of ``rows``) must be at least the number of lines of all texts.
 *
 * Returns None when a text is not valid UTF-8 (the caller parses it with the Python path, which
 * then decodes it lossily, exactly as before). Otherwise: accepted event lines are rows
 * [0, nevents) in line order, accepted metadata records rows [cap - nmeta, cap) in reverse
 * line order; ``rejected`` is bytes of int64 triples (line number, start, end byte offset in
 * the line's own text, without the newline) of non-blank lines this scanner does not fully understand, for the
 * Python path; ``uniques`` the decoded strings of the codes; ``any_mask`` the OR of imask;
 * ``fields`` bytes of a uint16 per code: bit f set when the string was a value of field f.
 *
 * Accepted lines (anything else is rejected, never guessed): one JSON object starting at the
 * first byte, optionally followed by one "," (DFTracer 1.x array elements) and nothing else;
 * spaces/tabs between tokens; strings without backslash escapes or control characters; the
 * kept keys (top level: name cat ph pid tid ts dur args; in args: see ARG_KEYS) at most
 * once each, with values
 *   int fields:    a JSON integer in int64, or a string holding one (1.x), or null
 *   string fields: a string, or a JSON integer (kept as written, e.g. "ph":1 -> "1"), or null
 * and "args" an object; other keys may hold any JSON value (validated, skipped). A line must
 * be a metadata record (ph "4" or "M") or have integer ts and pid and a name, and not be an
 * aggregated or counter record (ph "3", "A", "2", "C": the Python path reads those). Empty lines and
 * the bare "[" / "]" lines of the 1.x array form are skipped (not rows, not rejected).
 *
 * text_info(text) -> (newlines, valid): the number of "\n" bytes of text and whether it is
 * valid UTF-8 (the check scan makes), in one pass.
 *
 * compact(...) turns scan's event rows into a parsed batch's columns, and file_offsets(...)
 * reconstructs file positions (both documented where they are defined).
 *
 * The scan runs without the GIL: several texts can be scanned in parallel threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../_pybuf.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum {
    I_PID, I_TID, I_TS, I_DUR, I_RET, I_COUNT, I_ISIZE, I_AOFFSET, I_WHENCE, I_FLAGS, I_PPID,
    I_EPOCH, I_STEP, I_BATCH, I_IMAGE, I_ABYTES, I_CPUTIME, I_CPUTHREADS, I_TENSORS, NI
};
enum {
    S_NAME, S_CAT, S_PH, S_HHASH, S_FHASH, S_MODE, S_CWD, S_ANAME, S_AVALUE, S_PATH, S_FNAME, NS
};
/* field ids: ints 0..NI-1, strings NI..NI+NS-1, args F_ARGS; -1 unknown */
#define F_STR(k) (NI + (k))
#define F_ARGS (NI + NS)
#define MAX_DEPTH 64

typedef struct {
    int64_t iv[NI];
    uint32_t imask;
    const char *sp[NS];
    Py_ssize_t sl[NS];
    uint32_t smask;
    uint64_t seen;
} Row;

/* ------------------------------------------------------------------------------------ keys */

static int top_field(const char *k, Py_ssize_t n)
{
    switch (n) {
    case 2:
        if (!memcmp(k, "ph", 2)) return F_STR(S_PH);
        if (!memcmp(k, "ts", 2)) return I_TS;
        break;
    case 3:
        if (!memcmp(k, "cat", 3)) return F_STR(S_CAT);
        if (!memcmp(k, "pid", 3)) return I_PID;
        if (!memcmp(k, "tid", 3)) return I_TID;
        if (!memcmp(k, "dur", 3)) return I_DUR;
        break;
    case 4:
        if (!memcmp(k, "name", 4)) return F_STR(S_NAME);
        if (!memcmp(k, "args", 4)) return F_ARGS;
        break;
    }
    return -1;
}

static int arg_field(const char *k, Py_ssize_t n)
{
    switch (n) {
    case 3:
        if (!memcmp(k, "ret", 3)) return I_RET;
        if (!memcmp(k, "cwd", 3)) return F_STR(S_CWD);
        break;
    case 4:
        if (!memcmp(k, "size", 4)) return I_ISIZE;
        if (!memcmp(k, "mode", 4)) return F_STR(S_MODE);
        if (!memcmp(k, "ppid", 4)) return I_PPID;
        if (!memcmp(k, "name", 4)) return F_STR(S_ANAME);
        if (!memcmp(k, "step", 4)) return I_STEP;
        if (!memcmp(k, "path", 4)) return F_STR(S_PATH);
        break;
    case 5:
        if (!memcmp(k, "hhash", 5)) return F_STR(S_HHASH);
        if (!memcmp(k, "fhash", 5)) return F_STR(S_FHASH);
        if (!memcmp(k, "count", 5)) return I_COUNT;
        if (!memcmp(k, "flags", 5)) return I_FLAGS;
        if (!memcmp(k, "value", 5)) return F_STR(S_AVALUE);
        if (!memcmp(k, "epoch", 5)) return I_EPOCH;
        if (!memcmp(k, "bytes", 5)) return I_ABYTES;
        if (!memcmp(k, "fname", 5)) return F_STR(S_FNAME);
        break;
    case 6:
        if (!memcmp(k, "offset", 6)) return I_AOFFSET;
        if (!memcmp(k, "whence", 6)) return I_WHENCE;
        break;
    case 7:
        if (!memcmp(k, "tensors", 7)) return I_TENSORS;
        break;
    case 8:
        if (!memcmp(k, "cpu_time", 8)) return I_CPUTIME;
        break;
    case 9:
        if (!memcmp(k, "image_idx", 9)) return I_IMAGE;
        break;
    case 10:
        if (!memcmp(k, "batch_size", 10)) return I_BATCH;
        break;
    case 11:
        if (!memcmp(k, "cpu_threads", 11)) return I_CPUTHREADS;
        break;
    }
    return -1;
}

/* ---------------------------------------------------------------------------------- tokens */

static inline const char *ws(const char *p, const char *e)
{
    if (p < e && (unsigned char)*p <= ' ') /* rare: DFTracer writes no blanks */
        while (p < e && (*p == ' ' || *p == '\t')) p++;
    return p;
}

/* SWAR helpers: a byte mask (high bit set) of bytes of w equal to c / below 0x20. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline uint64_t bytes_eq(uint64_t w, unsigned char c)
{
    uint64_t x = w ^ (ONES * c);
    return (x - ONES) & ~x & HIGHS;
}
static inline uint64_t bytes_lt32(uint64_t w)
{
    return (w - ONES * 0x20) & ~w & HIGHS;
}

/* A string at p (p points at the opening quote): its content [*s, *s + *n); returns the byte
 * after the closing quote, or NULL (escape, control character, unterminated). */
static inline const char *str_tok(const char *p, const char *e, const char **s, Py_ssize_t *n)
{
    const char *q = ++p;
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (e - q >= 8) {
        uint64_t w;
        memcpy(&w, q, 8);
        uint64_t hit = bytes_eq(w, '"') | bytes_eq(w, '\\') | bytes_lt32(w);
        if (hit) {
            q += __builtin_ctzll(hit) >> 3; /* little-endian: the first such byte */
            break;
        }
        q += 8;
    }
#endif
    while (q < e) {
        unsigned char c = (unsigned char)*q;
        if (c == '"') {
            *s = p;
            *n = q - p;
            return q + 1;
        }
        if (c == '\\' || c < 0x20) return NULL;
        q++;
    }
    return NULL;
}

/* A JSON number at p. *kind: 1 integer that fits int64 (*v), 2 integer beyond int64, 3 with
 * fraction or exponent. Returns the byte after it, or NULL when it is not a JSON number. */
static inline const char *num_tok(const char *p, const char *e, int64_t *v, int *kind)
{
    int neg = 0;
    uint64_t acc = 0;
    int big = 0;
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= e || *p < '0' || *p > '9') return NULL;
    if (*p == '0') {
        p++;
    } else {
        /* eight digits at a time (SWAR), then one by one; up to 19 digits cannot overflow */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        const char *d0 = p;
        while (e - p >= 8 && p - d0 <= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if ((w & 0xF0F0F0F0F0F0F0F0ULL) != 0x3030303030303030ULL ||
                ((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) != 0x3030303030303030ULL)
                break;
            w -= 0x3030303030303030ULL;
            w = (w * 10 + (w >> 8)) & 0x00FF00FF00FF00FFULL;
            w = (w * 100 + (w >> 16)) & 0x0000FFFF0000FFFFULL;
            w = (w * 10000 + (w >> 32)) & 0xFFFFFFFFULL;
            acc = acc * 100000000ULL + w;
            p += 8;
        }
        const char *stop = e - p > 19 - (p - d0) ? p + (19 - (p - d0)) : e;
#else
        const char *stop = e - p > 19 ? p + 19 : e;
#endif
        while (p < stop && (unsigned)(*p - '0') < 10) acc = acc * 10 + (unsigned)(*p++ - '0');
        if (p < e && (unsigned)(*p - '0') < 10) { /* a 20th digit, maybe more */
            unsigned d = (unsigned)(*p++ - '0');
            if (acc > (UINT64_MAX - d) / 10) big = 1;
            else acc = acc * 10 + d;
            while (p < e && (unsigned)(*p - '0') < 10) {
                big = 1;
                p++;
            }
        }
    }
    *kind = 1;
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') p++;
        *kind = 3;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') p++;
        *kind = 3;
    }
    if (*kind == 1) {
        if (big || (!neg && acc > (uint64_t)INT64_MAX) || (neg && acc > (uint64_t)INT64_MAX + 1)) {
            *kind = 2;
        } else {
            *v = neg ? (int64_t)(0 - acc) : (int64_t)acc;
        }
    }
    return p;
}

static inline const char *lit_tok(const char *p, const char *e, const char *lit, Py_ssize_t n)
{
    return (e - p >= n && !memcmp(p, lit, (size_t)n)) ? p + n : NULL;
}

/* The value of 8 digit values (bytes 0-9) in w, the first byte the most significant. */
static inline uint64_t eight_digits(uint64_t w)
{
    w = (w * 10 + (w >> 8)) & 0x00FF00FF00FF00FFULL;
    w = (w * 100 + (w >> 16)) & 0x0000FFFF0000FFFFULL;
    return (w * 10000 + (w >> 32)) & 0xFFFFFFFFULL;
}

/* Bytes of w (digits XOR '0') that are no digit: their high bit set (no carries between
 * bytes: the high bits are masked off before the add). */
static inline uint64_t non_digits(uint64_t x)
{
    return (((x & 0x7F7F7F7F7F7F7F7FULL) + 0x7676767676767676ULL) | x) & HIGHS;
}

/* A plain JSON integer of 1 to 16 digits at p, as num_tok reads it (no sign, no leading
 * zero before another digit, no fraction or exponent after it): *v and the byte after
 * it, or NULL for anything else (num_tok then decides). The digits are found and
 * converted 8 bytes at a time: the usual values (ids, sizes, return values, µs
 * timestamps) take no loop and no branch on their length. (num_tok's digit loop and
 * checks were about a quarter of the scan's time: with this path and the branch-free
 * same_bytes, the benchmark's worker file scans at 175-180 ns a line, from 225-235.) */
static inline const char *small_int(const char *p, const char *e, int64_t *v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    static const uint64_t pow10[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
    if (e - p < 8) return NULL;
    uint64_t x, y;
    memcpy(&x, p, 8);
    x ^= 0x3030303030303030ULL;
    uint64_t nd = non_digits(x);
    if (!(x & 0xFF) && !(nd & 0x8000)) return NULL; /* a leading zero before another digit */
    if (nd) {
        int len = __builtin_ctzll(nd) >> 3;
        char t = p[len];
        if (len == 0 || t == '.' || t == 'e' || t == 'E') return NULL;
        *v = (int64_t)eight_digits(x << (8 * (8 - len)));
        return p + len;
    }
    /* 8 digits, and up to 8 more */
    if (e - p < 17) return NULL;
    memcpy(&y, p + 8, 8);
    y ^= 0x3030303030303030ULL;
    nd = non_digits(y);
    int len = nd ? __builtin_ctzll(nd) >> 3 : 8;
    char t = p[8 + len];
    if (t == '.' || t == 'e' || t == 'E' || (unsigned)(t - '0') < 10) return NULL;
    uint64_t low = len ? eight_digits(y << (8 * (8 - len))) : 0;
    *v = (int64_t)(eight_digits(x) * pow10[len] + low);
    return p + 8 + len;
#else
    (void)p, (void)e, (void)v;
    return NULL;
#endif
}

/* Skip (and validate) any JSON value at p. */
static const char *skip_value(const char *p, const char *e, int depth)
{
    const char *s;
    Py_ssize_t n;
    int64_t v;
    int kind;
    if (p >= e || depth > MAX_DEPTH) return NULL;
    switch (*p) {
    case '"':
        return str_tok(p, e, &s, &n);
    case 't':
        return lit_tok(p, e, "true", 4);
    case 'f':
        return lit_tok(p, e, "false", 5);
    case 'n':
        return lit_tok(p, e, "null", 4);
    case '{':
        p = ws(p + 1, e);
        if (p < e && *p == '}') return p + 1;
        for (;;) {
            if (p >= e || *p != '"' || !(p = str_tok(p, e, &s, &n))) return NULL;
            p = ws(p, e);
            if (p >= e || *p != ':') return NULL;
            p = skip_value(ws(p + 1, e), e, depth + 1);
            if (!p) return NULL;
            p = ws(p, e);
            if (p < e && *p == ',') {
                p = ws(p + 1, e);
                continue;
            }
            if (p < e && *p == '}') return p + 1;
            return NULL;
        }
    case '[':
        p = ws(p + 1, e);
        if (p < e && *p == ']') return p + 1;
        for (;;) {
            p = skip_value(p, e, depth + 1);
            if (!p) return NULL;
            p = ws(p, e);
            if (p < e && *p == ',') {
                p = ws(p + 1, e);
                continue;
            }
            if (p < e && *p == ']') return p + 1;
            return NULL;
        }
    default:
        return num_tok(p, e, &v, &kind);
    }
}

/* skip_value with the common scalars (numbers, strings) inline. */
static inline const char *skip_fast(const char *p, const char *e)
{
    const char *s;
    Py_ssize_t n;
    int64_t v;
    int kind;
    const char *q = small_int(p, e, &v);
    if (q) return q;
    if (p < e && ((unsigned)(*p - '0') < 10 || *p == '-')) return num_tok(p, e, &v, &kind);
    if (p < e && *p == '"') return str_tok(p, e, &s, &n);
    return skip_value(p, e, 1);
}

/* The value of int field f at p into row (without the duplicate-key check): the byte
 * after it, or NULL when its form is not accepted. int_value_slow takes the forms
 * small_int leaves: null, a string holding an integer (1.x), a sign, more digits. */
static const char *int_value_slow(const char *p, const char *e, int f, Row *row)
{
    const char *s;
    Py_ssize_t n;
    int64_t v;
    int kind;
    if (p >= e) return NULL;
    if (*p == 'n') return lit_tok(p, e, "null", 4);
    if (*p == '"') {
        const char *q = str_tok(p, e, &s, &n);
        if (!q || n == 0 || num_tok(s, s + n, &v, &kind) != s + n || kind != 1) return NULL;
        p = q;
    } else {
        p = num_tok(p, e, &v, &kind);
        if (!p || kind != 1) return NULL;
    }
    row->iv[f] = v;
    row->imask |= (uint32_t)1 << f;
    return p;
}

static inline const char *int_value(const char *p, const char *e, int f, Row *row)
{
    int64_t v;
    const char *q = small_int(p, e, &v);
    if (!q) return int_value_slow(p, e, f, row);
    row->iv[f] = v;
    row->imask |= (uint32_t)1 << f;
    return q;
}

/* The value of string field k (S_*) at p into row (no duplicate-key check): a string, or
 * a JSON integer kept as written (str_value_slow, with null). */
static const char *str_value_slow(const char *p, const char *e, int k, Row *row)
{
    int64_t v;
    int kind;
    if (p >= e) return NULL;
    if (*p == 'n') return lit_tok(p, e, "null", 4);
    const char *s = p;
    p = num_tok(p, e, &v, &kind);
    if (!p || kind == 3) return NULL;
    row->sp[k] = s;
    row->sl[k] = p - s;
    row->smask |= (uint32_t)1 << k;
    return p;
}

static inline const char *str_value(const char *p, const char *e, int k, Row *row)
{
    const char *s;
    Py_ssize_t n;
    if (p >= e || *p != '"') return str_value_slow(p, e, k, row);
    p = str_tok(p, e, &s, &n);
    if (!p) return NULL;
    row->sp[k] = s;
    row->sl[k] = n;
    row->smask |= (uint32_t)1 << k;
    return p;
}

/* A value of kept field f at p into row; NULL when the value's form is not accepted. */
static inline const char *field_value(const char *p, const char *e, int f, Row *row)
{
    uint64_t bit = (uint64_t)1 << f;
    if (row->seen & bit) return NULL; /* duplicate key */
    row->seen |= bit;
    return f < NI ? int_value(p, e, f, row) : str_value(p, e, f - NI, row);
}

/* ------------------------------------------------------------------------------ layouts */

/* DFTracer writes every event of one function with the same keys in the same order, and
 * the same bytes between the values. A layout is that sequence, recorded from a line the
 * general parser accepted: per value, the bytes from the end of the previous value (or the
 * line start) to the start of this one (separators, the key, its quotes and colon, "{" of
 * args) and the field the key names; then the bytes after the last value to the line end.
 * A later line is parsed with a layout by comparing those bytes and parsing only the values
 * (with the same value parsers as the general parser); where the bytes differ it continues
 * with another layout that shares the steps so far, and when none matches, the line goes
 * to the general parser. Equal bytes take the general parser through the same keys and
 * separators, so the result is the same either way. */
#define LAYOUT_STEPS 40 /* values per line */
#define LAYOUT_LIT 32   /* bytes before one value */
#define NLAYOUTS 16
#define ACT_SKIP (-1)   /* a key that is not kept: its value is validated and skipped */
#define ACT_END (-2)    /* the bytes after the last value: must reach the line end */

typedef struct {
    int8_t action;   /* field id, ACT_SKIP or ACT_END */
    uint8_t args;    /* the bytes open the args object */
    uint8_t len;
    char lit[LAYOUT_LIT];
} Step;

typedef struct {
    int n;
    Step steps[LAYOUT_STEPS];
} Layout;

/* What the general parser saw of the current line (a layout when ok at the end). */
typedef struct {
    Layout lay;
    const char *prev; /* end of the previous value */
    int args;         /* the args object was opened since the last step */
    int ok;
} Rec;

static inline void rec_step(Rec *rec, const char *at, int action)
{
    Py_ssize_t n = at - rec->prev;
    if (!rec->ok || rec->lay.n >= LAYOUT_STEPS || n > LAYOUT_LIT) {
        rec->ok = 0;
        return;
    }
    Step *st = &rec->lay.steps[rec->lay.n++];
    st->action = (int8_t)action;
    st->args = (uint8_t)rec->args;
    st->len = (uint8_t)n;
    memcpy(st->lit, rec->prev, (size_t)n);
    rec->args = 0;
}

/* Parse the members of the args object; p points after "{". */
static const char *args_object(const char *p, const char *e, Row *row, Rec *rec)
{
    const char *k;
    Py_ssize_t kn;
    p = ws(p, e);
    if (p < e && *p == '}') return p + 1;
    for (;;) {
        if (p >= e || *p != '"' || !(p = str_tok(p, e, &k, &kn))) return NULL;
        p = ws(p, e);
        if (p >= e || *p != ':') return NULL;
        p = ws(p + 1, e);
        int f = arg_field(k, kn);
        rec_step(rec, p, f < 0 ? ACT_SKIP : f);
        p = f < 0 ? skip_fast(p, e) : field_value(p, e, f, row);
        if (!p) return NULL;
        rec->prev = p;
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        if (p < e && *p == '}') return p + 1;
        return NULL;
    }
}

/* Equality of the n (<= LAYOUT_LIT) bytes at p and lit: 8 bytes at a time, or two overlapping
 * 4-byte words, or up to 3 bytes (no byte outside either is read; no loop below 17 bytes). */
static inline int lit_eq(const char *p, const char *lit, int n)
{
    uint64_t x, y, d = 0;
    if (n >= 8) { /* 8 bytes at a time, the last 8 overlapping the ones before */
        for (int i = 0; i + 8 < n; i += 8) {
            memcpy(&x, p + i, 8);
            memcpy(&y, lit + i, 8);
            d |= x ^ y;
        }
        memcpy(&x, p + n - 8, 8);
        memcpy(&y, lit + n - 8, 8);
        return !(d | (x ^ y));
    }
    if (n >= 4) {
        uint32_t a, b, c, f;
        memcpy(&a, p, 4);
        memcpy(&b, lit, 4);
        memcpy(&c, p + n - 4, 4);
        memcpy(&f, lit + n - 4, 4);
        return !((a ^ b) | (c ^ f));
    }
    if (n > 0) return p[0] == lit[0] && p[n >> 1] == lit[n >> 1] && p[n - 1] == lit[n - 1];
    return 1;
}

/* Equality of two byte strings of length n (a string and the last one of its field, or a
 * dictionary entry): short ones (file hashes, names) as lit_eq, longer ones (paths) by memcmp. */
static inline int same_bytes(const char *a, const char *b, Py_ssize_t n)
{
    return n <= LAYOUT_LIT ? lit_eq(a, b, (int)n) : !memcmp(a, b, (size_t)n);
}

static inline int str_is(const Row *row, int f, const char *lit, Py_ssize_t n)
{
    return (row->smask >> f & 1) && row->sl[f] == n && !memcmp(row->sp[f], lit, (size_t)n);
}

/* 1 when the line [p, e) is an accepted event, 2 an accepted metadata record (row filled),
 * else 0. */
static inline int line_kind(const Row *row)
{
    int meta = str_is(row, S_PH, "4", 1) || str_is(row, S_PH, "M", 1);
    /* aggregated records (ph 3/"A"; 2/"C" before DFTracer 2.2, counters too): each is read
     * as its calls by the Python path, which splits their sums (reference.py) */
    if (str_is(row, S_PH, "3", 1) || str_is(row, S_PH, "A", 1) || str_is(row, S_PH, "2", 1) ||
        str_is(row, S_PH, "C", 1))
        return 0;
    if (!meta && !((row->imask >> I_TS & 1) && (row->imask >> I_PID & 1) && (row->smask >> S_NAME & 1)))
        return 0;
    return meta ? 2 : 1;
}

/* The general parser: recording the line's layout into rec (rec->ok when complete). */
static int parse_line(const char *p, const char *e, Row *row, Rec *rec)
{
    const char *k;
    Py_ssize_t kn;
    row->imask = 0;
    row->smask = 0;
    row->seen = 0;
    rec->lay.n = 0;
    rec->prev = p;
    rec->args = 0;
    rec->ok = 1;
    if (p >= e || *p != '{') return 0;
    p = ws(p + 1, e);
    if (p < e && *p == '}') return 0; /* {} is no record */
    for (;;) {
        if (p >= e || *p != '"' || !(p = str_tok(p, e, &k, &kn))) return 0;
        p = ws(p, e);
        if (p >= e || *p != ':') return 0;
        p = ws(p + 1, e);
        int f = top_field(k, kn);
        if (f == F_ARGS) {
            uint64_t bit = (uint64_t)1 << F_ARGS;
            if ((row->seen & bit) || p >= e || *p != '{') return 0;
            row->seen |= bit;
            rec->args = 1;
            p = args_object(p + 1, e, row, rec); /* the bytes up to the next value follow its last one */
        } else {
            rec_step(rec, p, f < 0 ? ACT_SKIP : f);
            p = f < 0 ? skip_fast(p, e) : field_value(p, e, f, row);
            rec->prev = p;
        }
        if (!p) return 0;
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        if (p < e && *p == '}') {
            p++;
            break;
        }
        return 0;
    }
    if (p < e && *p == ',') p++; /* DFTracer 1.x: elements of one JSON array */
    if (p != e) return 0;
    rec_step(rec, e, ACT_END);
    return line_kind(row);
}

typedef struct {
    Layout lay[NLAYOUTS];
    /* common[a][b]: the number of leading steps layouts a and b share */
    uint8_t common[NLAYOUTS][NLAYOUTS];
    int n;    /* layouts held */
    int last; /* the layout that parsed the last line */
    int next; /* the slot replaced next */
} Layouts;

static inline int same_step(const Step *a, const Step *b)
{
    return a->action == b->action && a->args == b->args && a->len == b->len && !memcmp(a->lit, b->lit, a->len);
}

static void layouts_add(Layouts *ls, const Layout *lay)
{
    int slot = ls->n < NLAYOUTS ? ls->n++ : ls->next;
    ls->next = (slot + 1) % NLAYOUTS;
    ls->lay[slot] = *lay;
    for (int b = 0; b < ls->n; b++) {
        const Layout *o = &ls->lay[b];
        int c = 0;
        while (c < lay->n && c < o->n && same_step(&lay->steps[c], &o->steps[c])) c++;
        ls->common[slot][b] = ls->common[b][slot] = (uint8_t)c;
    }
    ls->last = slot;
}

/* Parse the line at p with the layouts: as parse_line, or -1 when no layout fits the line.
 * e is the end of the text, not of the line: no token or layout byte is a newline, so the
 * parse cannot pass one, and the line must end where the layout ends (*le: its end). */
static int parse_layout(const char *p, const char *e, Row *row, Layouts *ls, const char **le)
{
    if (!ls->n) return -1;
    int a = ls->last;
    row->imask = 0;
    row->smask = 0;
    for (int i = 0;;) {
        const Step *st = &ls->lay[a].steps[i];
        int fits = e - p >= st->len && lit_eq(p, st->lit, st->len) &&
                   (st->action != ACT_END || p + st->len == e || p[st->len] == '\n');
        if (!fits) { /* another layout with the same steps so far whose bytes fit here */
            int b;
            for (b = 0; b < ls->n; b++) {
                if (b == a || ls->common[a][b] < i) continue;
                const Step *o = &ls->lay[b].steps[i];
                if (e - p >= o->len && lit_eq(p, o->lit, o->len) &&
                    (o->action != ACT_END || p + o->len == e || p[o->len] == '\n'))
                    break;
            }
            if (b == ls->n) return -1;
            a = b;
            st = &ls->lay[a].steps[i];
        }
        if (st->action == ACT_END) {
            ls->last = a;
            *le = p + st->len;
            return line_kind(row);
        }
        p += st->len;
        /* (no duplicate-key checks: a layout's keys are those of one accepted line, so distinct) */
        int act = st->action;
        p = act == ACT_SKIP ? skip_fast(p, e) : act < NI ? int_value(p, e, act, row) : str_value(p, e, act - NI, row);
        if (!p) return -1;
        i++;
    }
}

/* ------------------------------------------------------------------------- string codes */

typedef struct {
    const char *ptr; /* the string, inside one of the scanned texts */
    Py_ssize_t len;
    uint64_t hash;
    int32_t code; /* -1: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    size_t cap; /* power of two */
    int32_t n;
    const char **ptrs; /* per code: the string and its length */
    Py_ssize_t *lens;
    uint16_t *fields; /* per code: the string fields (bit S_*) it was a value of */
    size_t ncap;
} Dict;

static inline uint64_t hash_bytes(const char *s, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    h ^= h >> 32;
    return h * 0x9E3779B97F4A7C15ULL;
}

static int dict_init(Dict *d)
{
    d->cap = 1024;
    d->slots = malloc(d->cap * sizeof(Slot));
    d->ncap = 256;
    d->ptrs = malloc(d->ncap * sizeof(const char *));
    d->lens = malloc(d->ncap * sizeof(Py_ssize_t));
    d->fields = malloc(d->ncap * sizeof(uint16_t));
    d->n = 0;
    if (!d->slots || !d->ptrs || !d->lens || !d->fields) return -1;
    for (size_t i = 0; i < d->cap; i++) d->slots[i].code = -1;
    return 0;
}

static void dict_free(Dict *d)
{
    free(d->slots);
    free(d->ptrs);
    free(d->lens);
    free(d->fields);
}

static int dict_grow(Dict *d)
{
    size_t cap = d->cap * 2;
    Slot *slots = malloc(cap * sizeof(Slot));
    if (!slots) return -1;
    for (size_t i = 0; i < cap; i++) slots[i].code = -1;
    for (size_t i = 0; i < d->cap; i++) {
        if (d->slots[i].code < 0) continue;
        size_t j = d->slots[i].hash & (cap - 1);
        while (slots[j].code >= 0) j = (j + 1) & (cap - 1);
        slots[j] = d->slots[i];
    }
    free(d->slots);
    d->slots = slots;
    d->cap = cap;
    return 0;
}

/* The code of string [s, s + n) (s inside a scanned text); -2 on allocation failure. */
static int32_t dict_code(Dict *d, const char *s, Py_ssize_t n)
{
    uint64_t h = hash_bytes(s, n);
    size_t j = h & (d->cap - 1);
    for (;;) {
        Slot *sl = &d->slots[j];
        if (sl->code < 0) break;
        if (sl->hash == h && sl->len == n && same_bytes(sl->ptr, s, n)) return sl->code;
        j = (j + 1) & (d->cap - 1);
    }
    if ((size_t)d->n >= d->ncap) {
        size_t ncap = d->ncap * 2;
        const char **o = realloc(d->ptrs, ncap * sizeof(const char *));
        if (!o) return -2;
        d->ptrs = o;
        Py_ssize_t *l = realloc(d->lens, ncap * sizeof(Py_ssize_t));
        if (!l) return -2;
        d->lens = l;
        uint16_t *fl = realloc(d->fields, ncap * sizeof(uint16_t));
        if (!fl) return -2;
        d->fields = fl;
        d->ncap = ncap;
    }
    int32_t code = d->n++;
    d->ptrs[code] = s;
    d->fields[code] = 0;
    d->lens[code] = n;
    Slot *sl = &d->slots[j];
    sl->ptr = s;
    sl->len = n;
    sl->hash = h;
    sl->code = code;
    if ((size_t)d->n * 2 > d->cap && dict_grow(d) < 0) return -2;
    return code;
}

/* ---------------------------------------------------------------------------------- UTF-8 */

/* 1 when [s, s + n) is valid UTF-8 (no overlong forms, surrogates or code points > U+10FFFF). */
static int utf8_valid(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0) return 0;
            if (c == 0xED && s[i + 1] > 0x9F) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90) return 0;
            if (c == 0xF4 && s[i + 1] > 0x8F) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Newlines in [s, s + n) and whether it is valid UTF-8 (*valid), in one pass: newlines are
 * counted 64 bytes at a time (per-byte counters summed every 63 blocks) while the high bits
 * are ORed together; only text with a non-ASCII byte is then checked with utf8_valid. */
static Py_ssize_t text_info(const unsigned char *s, Py_ssize_t n, int *valid)
{
    Py_ssize_t count = 0, i = 0;
#if defined(__SSE2__)
    const __m128i nl = _mm_set1_epi8('\n');
    __m128i high = _mm_setzero_si128();
    while (n - i >= 64) {
        __m128i cnt = _mm_setzero_si128(); /* per byte lane: up to 4 * 63 newlines */
        for (int blocks = 0; blocks < 63 && n - i >= 64; blocks++, i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(s + i + 48));
            high = _mm_or_si128(high, _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)));
            /* a match is 0xFF (-1): subtracting counts it */
            cnt = _mm_sub_epi8(cnt, _mm_add_epi8(_mm_add_epi8(_mm_cmpeq_epi8(a, nl), _mm_cmpeq_epi8(b, nl)),
                                                 _mm_add_epi8(_mm_cmpeq_epi8(c, nl), _mm_cmpeq_epi8(d, nl))));
        }
        __m128i sums = _mm_sad_epu8(cnt, _mm_setzero_si128());
        count += _mm_cvtsi128_si32(sums) + _mm_cvtsi128_si32(_mm_srli_si128(sums, 8));
    }
    int ascii = _mm_movemask_epi8(high) == 0;
#else
    int ascii = 1;
#endif
    unsigned char hi = 0;
    for (; i < n; i++) {
        count += s[i] == '\n';
        hi |= s[i];
    }
    ascii = ascii && hi < 0x80;
    *valid = ascii || utf8_valid(s, n);
    return count;
}

/* ----------------------------------------------------------------------------------- scan */

typedef struct {
    /* inputs */
    const char **texts;
    const Py_ssize_t *lens;
    Py_ssize_t ntexts;
    int64_t *ints;
    uint32_t *imask;
    int32_t *strs;
    int64_t *rows;
    Py_ssize_t cap;
    /* outputs */
    Py_ssize_t nev, nmeta;
    int64_t *rej; /* triples */
    Py_ssize_t nrej, rejcap;
    uint32_t any_mask;
    Dict dict;
    Layouts *layouts;
    Rec *rec;
    int utf8_checked; /* the caller checked text with text_info: skip the check */
    int invalid_utf8;
    const char *error;
    int oom;
} Scan;

static int reject(Scan *sc, Py_ssize_t line, Py_ssize_t start, Py_ssize_t end)
{
    if (sc->nrej == sc->rejcap) {
        Py_ssize_t cap = sc->rejcap ? sc->rejcap * 2 : 64;
        int64_t *r = realloc(sc->rej, (size_t)cap * 3 * sizeof(int64_t));
        if (!r) return -1;
        sc->rej = r;
        sc->rejcap = cap;
    }
    sc->rej[3 * sc->nrej] = line;
    sc->rej[3 * sc->nrej + 1] = start;
    sc->rej[3 * sc->nrej + 2] = end;
    sc->nrej++;
    return 0;
}

static void run_scan(Scan *sc)
{
    if (!sc->utf8_checked) {
        for (Py_ssize_t t = 0; t < sc->ntexts; t++) {
            if (!utf8_valid((const unsigned char *)sc->texts[t], sc->lens[t])) {
                sc->invalid_utf8 = 1;
                return;
            }
        }
    }
    sc->layouts = malloc(sizeof(Layouts));
    sc->rec = malloc(sizeof(Rec));
    if (!sc->layouts || !sc->rec) {
        sc->oom = 1, sc->error = "out of memory while scanning a trace";
        return;
    }
    sc->layouts->n = sc->layouts->last = sc->layouts->next = 0;
    if (dict_init(&sc->dict) < 0) {
        sc->oom = 1, sc->error = "out of memory while scanning a trace";
        return;
    }
    /* the last string seen per layout and field: lines of one layout mostly repeat their
     * name, category and phase, and consecutive ones their hashes */
    const char *last_s[NLAYOUTS][NS];
    Py_ssize_t last_n[NLAYOUTS][NS];
    int32_t last_c[NLAYOUTS][NS];
    for (int l = 0; l < NLAYOUTS; l++)
        for (int f = 0; f < NS; f++) last_c[l][f] = -1;
    Row row;
    Py_ssize_t cap = sc->cap, line = 0, nev = 0, nmeta = 0;
    int kind;
    for (Py_ssize_t t = 0; t < sc->ntexts; t++) {
        const char *text = sc->texts[t], *end = text + sc->lens[t];
        const char *p = text;
        while (p < end) {
            const char *le;
            if (line >= cap) {
                sc->error = "text has more lines than the output capacity";
                return;
            }
            /* a layout of earlier lines finds the line's end as it parses; else the general
             * parser takes the line up to its newline (and a new layout from it) */
            kind = *p == '\n' ? -1 : parse_layout(p, end, &row, sc->layouts, &le);
            if (kind < 0) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                le = nl ? nl : end;
                Py_ssize_t n = le - p;
                if (n == 0 || (n == 1 && (*p == '[' || *p == ']'))) {
                    kind = -1; /* blank line, or the bare "[" / "]" of the 1.x array form: not a line */
                } else {
                    kind = parse_line(p, le, &row, sc->rec);
                    if (kind && sc->rec->ok) layouts_add(sc->layouts, &sc->rec->lay);
                }
            }
            if (kind > 0) {
                Py_ssize_t r = kind == 1 ? nev++ : cap - 1 - nmeta++;
                for (uint32_t m = row.imask; m; m &= m - 1) {
                    int f = __builtin_ctz(m);
                    sc->ints[(Py_ssize_t)f * cap + r] = row.iv[f];
                }
                sc->imask[r] = row.imask;
                sc->any_mask |= row.imask;
                int lay = sc->layouts->last;
                for (int f = 0; f < NS; f++) {
                    int32_t code = -1;
                    if (row.smask >> f & 1) {
                        const char *s = row.sp[f];
                        Py_ssize_t sn = row.sl[f];
                        if (last_c[lay][f] >= 0 && last_n[lay][f] == sn && same_bytes(last_s[lay][f], s, sn)) {
                            code = last_c[lay][f];
                        } else {
                            code = dict_code(&sc->dict, s, sn);
                            if (code == -2) {
                                sc->oom = 1, sc->error = "out of memory while scanning a trace";
                                return;
                            }
                            sc->dict.fields[code] |= (uint16_t)(1u << f);
                            last_s[lay][f] = s;
                            last_n[lay][f] = sn;
                            last_c[lay][f] = code;
                        }
                    }
                    sc->strs[(Py_ssize_t)f * cap + r] = code;
                }
                sc->rows[r] = line;
            } else if (kind == 0 && reject(sc, line, p - text, le - text) < 0) {
                sc->oom = 1, sc->error = "out of memory while scanning a trace";
                return;
            }
            line++;
            if (le == end) break;
            p = le + 1;
        }
    }
    sc->nev = nev;
    sc->nmeta = nmeta;
}

static PyObject *scan(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_text, *o_ints, *o_imask, *o_strs, *o_rows, *result = NULL;
    int checked = 0;
    if (!PyArg_ParseTuple(args, "OOOOO|p", &o_text, &o_ints, &o_imask, &o_strs, &o_rows, &checked)) return NULL;
    /* one text, or a list of texts scanned as one */
    PyObject *seq = PyList_Check(o_text) || PyTuple_Check(o_text)
        ? PySequence_Fast(o_text, "texts") : PyTuple_Pack(1, o_text);
    if (!seq) return NULL;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(seq), got = 0;
    Py_buffer *bt = PyMem_Calloc((size_t)(nt ? nt : 1), sizeof(Py_buffer));
    const char **texts = PyMem_Calloc((size_t)(nt ? nt : 1), sizeof(const char *));
    Py_ssize_t *lens = PyMem_Calloc((size_t)(nt ? nt : 1), sizeof(Py_ssize_t));
    Py_buffer bi, bm, bs, br;
    if (!bt || !texts || !lens) {
        PyErr_NoMemory();
        goto e1;
    }
    for (; got < nt; got++) {
        if (get_buf(PySequence_Fast_GET_ITEM(seq, got), &bt[got], 1, 0, "text") < 0) goto e1;
        texts[got] = bt[got].buf;
        lens[got] = bt[got].len;
    }
    if (get_buf(o_ints, &bi, 8, 1, "ints") < 0) goto e1;
    if (get_buf(o_imask, &bm, 4, 1, "imask") < 0) goto e2;
    if (get_buf(o_strs, &bs, 4, 1, "strs") < 0) goto e3;
    if (get_buf(o_rows, &br, 8, 1, "rows") < 0) goto e4;
    Scan sc;
    memset(&sc, 0, sizeof sc);
    sc.texts = texts;
    sc.lens = lens;
    sc.ntexts = nt;
    sc.cap = br.len / 8;
    sc.ints = bi.buf;
    sc.imask = bm.buf;
    sc.strs = bs.buf;
    sc.rows = br.buf;
    sc.utf8_checked = checked;
    if (bi.len / 8 < (Py_ssize_t)NI * sc.cap || bm.len / 4 < sc.cap || bs.len / 4 < (Py_ssize_t)NS * sc.cap) {
        PyErr_SetString(PyExc_ValueError, "output buffers are smaller than NI/1/NS times the capacity");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    run_scan(&sc);
    Py_END_ALLOW_THREADS
    if (sc.error) {
        PyErr_SetString(sc.oom ? PyExc_MemoryError : PyExc_ValueError, sc.error);
        goto done;
    }
    if (sc.invalid_utf8) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *uniques = PyList_New(sc.dict.n);
    if (!uniques) goto done;
    for (int32_t i = 0; i < sc.dict.n; i++) {
        PyObject *u = PyUnicode_DecodeUTF8(sc.dict.ptrs[i], sc.dict.lens[i], "strict");
        if (!u) {
            Py_DECREF(uniques);
            goto done;
        }
        PyList_SET_ITEM(uniques, i, u);
    }
    PyObject *rej = PyBytes_FromStringAndSize((const char *)sc.rej, sc.nrej * 3 * (Py_ssize_t)sizeof(int64_t));
    if (!rej) {
        Py_DECREF(uniques);
        goto done;
    }
    PyObject *fields = PyBytes_FromStringAndSize((const char *)sc.dict.fields, sc.dict.n * (Py_ssize_t)sizeof(uint16_t));
    if (!fields) {
        Py_DECREF(uniques);
        Py_DECREF(rej);
        goto done;
    }
    result = Py_BuildValue("(nnNNkN)", sc.nev, sc.nmeta, rej, uniques, (unsigned long)sc.any_mask, fields);
done:
    if (sc.dict.slots) dict_free(&sc.dict);
    free(sc.layouts);
    free(sc.rec);
    free(sc.rej);
    PyBuffer_Release(&br);
e4:
    PyBuffer_Release(&bs);
e3:
    PyBuffer_Release(&bm);
e2:
    PyBuffer_Release(&bi);
e1:
    for (Py_ssize_t t = 0; t < got; t++) PyBuffer_Release(&bt[t]);
    PyMem_Free(bt);
    PyMem_Free(texts);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return result;
}

static PyObject *py_text_info(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer b;
    int ok;
    Py_ssize_t lines;
    if (get_buf(arg, &b, 1, 0, "text_info") < 0) return NULL;
    if (b.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        lines = text_info(b.buf, b.len, &ok);
        Py_END_ALLOW_THREADS
    } else {
        lines = text_info(b.buf, b.len, &ok);
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(nO)", lines, ok ? Py_True : Py_False);
}

static PyObject *is_utf8(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer b;
    int ok;
    if (get_buf(arg, &b, 1, 0, "is_utf8") < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    ok = utf8_valid(b.buf, b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

/* ------------------------------------------------------------------------- file offsets */

typedef struct {
    int64_t key;
    uint64_t state;
    int known;
    int used;
    int64_t open;  /* descriptors of the stream's file open in its process (opens - closes, never below 0) */
    int opened;    /* the process opened the file before this row */
    int writable;  /* ... and once for writing (or with flags and mode unknown) */
} Stream;

/* The slot of stream key in the table (cap a power of two): its own, or the empty one to take. */
static inline size_t stream_slot(const Stream *t, size_t cap, int64_t key)
{
    size_t j = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
    while (t[j].used && t[j].key != key) j = (j + 1) & (cap - 1);
    return j;
}

/* The table rehashed into twice the slots (the old one freed); NULL when out of memory. */
static Stream *stream_grow(Stream *t, size_t cap)
{
    Stream *g = calloc(cap * 2, sizeof(Stream));
    if (!g) return NULL;
    for (size_t j = 0; j < cap; j++)
        if (t[j].used) g[stream_slot(g, cap * 2, t[j].key)] = t[j];
    free(t);
    return g;
}

/*
 * file_offsets(order, proc, fcode, op, pos, parg, values, valid[, stray])
 *
 * The whole file-position model of dlreplay.analyze.load._offsets in one pass over the n
 * resolved rows in output order. order (int64): row indices in output order (a permutation
 * of 0..n-1); per row: proc (uint32) its process index, fcode (uint32) the category code of
 * its file hash, op (int8) its operation class (the _OP_CODE values), pos (uint8) flags
 * (POS_* below: the call succeeded, whence SEEK_CUR / SEEK_SET, opened for appending, an
 * I/O call with a file hash, STDIO), parg (int64, INT64_MIN standing for null) the one
 * argument the class needs: lseek/ftell their ret, fseek/pread/pwrite their offset,
 * read/write/fread/fwrite their bytes. Output, by row i (the rows' own order, not the
 * output order): values[i] (int64) and valid[i] (uint8), the offset; a row that order
 * does not list is not valid.
 *
 * pread/pwrite (op PXFER) take their offset argument. For io rows, in output order per
 * stream (proc, STDIO or not, fcode): open/fopen (when it succeeded) start a segment at 0
 * (unknown when appending); lseek/ftell with ret >= 0 at ret; fseek (ok, whence not
 * SEEK_CUR) at its offset for SEEK_SET, else unknown; rewind at 0; close makes it unknown
 * (a reset without a base). A stream's first row that is no reset starts an unknown
 * segment. Stream transfers (read, write, fread, fwrite) in a known segment get the
 * position, then every row advances it: transfers by their bytes, fseek(SEEK_CUR) (ok)
 * by its offset. Every input is a plain array without nulls: the loader passes polars'
 * own buffers, uncopied.
 *
 * stray (uint8, optional output, by row): 1 for a transfer (read, write, fread, fwrite,
 * pread, pwrite) of a stream whose process had opened the file (a successful open/fopen
 * earlier in the stream) and has no descriptor of it open any more: every open since
 * closed (each close takes one open away; a close of a descriptor opened elsewhere, such
 * as one inherited across fork, takes none below 0). DFTracer's close() closes the
 * descriptor, logs the call, and only then forgets which file it named: a socket or pipe
 * that another thread opens in between gets the number, and its reads and writes are
 * logged with the closed file's hash (a DataLoader worker's handshake with the training
 * process, 48 bytes written to a dataset file). A write (pos POS_WRITE: write, pwrite,
 * fwrite) is also stray when every open of the file by its process was read-only (pos
 * POS_RDONLY on the open: flags & O_ACCMODE == O_RDONLY, or an fopen mode "r" without
 * "+"): no descriptor it had could write it, and this catches the handshake even when the
 * file has been opened again since. Other rows are 0.
 */
enum { OP_OPEN = 1, OP_LSEEK, OP_FSEEK, OP_FTELL, OP_REWIND, OP_CLOSE, OP_XFER, OP_SXFER, OP_PXFER };
enum { POS_OK = 1, POS_CUR = 2, POS_SET = 4, POS_APPEND = 8, POS_IO = 16, POS_STDIO = 32, POS_RDONLY = 64, POS_WRITE = 128 };
#define NUL INT64_MIN

static PyObject *file_offsets(PyObject *self, PyObject *args)
{
    (void)self;
    enum { NB = 9 };
    PyObject *o[NB] = {NULL};
    Py_buffer b[NB];
    static const Py_ssize_t isz[NB] = {8, 4, 4, 1, 1, 8, 8, 1, 1};
    PyObject *result = NULL;
    int got = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOO|O", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    int nb = (o[8] == NULL || o[8] == Py_None) ? NB - 1 : NB;
    for (; got < nb; got++)
        if (get_buf(o[got], &b[got], isz[got], got >= 6, "file_offsets") < 0) goto done;
    Py_ssize_t n = b[0].len / 8;
    for (int i = 1; i < nb; i++)
        if (b[i].len / isz[i] != n) {
            PyErr_SetString(PyExc_ValueError, "file_offsets: arrays differ in length");
            goto done;
        }
    const int64_t *order = b[0].buf, *parg = b[5].buf;
    const uint32_t *proc = b[1].buf, *fcode = b[2].buf;
    const int8_t *op = b[3].buf;
    const uint8_t *pos = b[4].buf;
    int64_t *values = b[6].buf;
    uint8_t *valid = b[7].buf, *stray = nb == NB ? b[8].buf : NULL;
    for (Py_ssize_t k = 0; k < n; k++)
        if (order[k] < 0 || order[k] >= n) {
            PyErr_SetString(PyExc_ValueError, "file_offsets: row index out of range");
            goto done;
        }
    size_t cap = 1024, used = 0;
    Stream *streams = calloc(cap, sizeof(Stream));
    int oom = !streams;
    Py_BEGIN_ALLOW_THREADS
    if (n > 0) memset(valid, 0, (size_t)n);
    if (n > 0 && stray) memset(stray, 0, (size_t)n);
    for (Py_ssize_t k = 0; k < n && !oom; k++) {
        int64_t i = order[k];
        int c = op[i], f = pos[i];
        int64_t a = parg[i];
        values[i] = 0;
        if (c == OP_PXFER && a != NUL) {
            values[i] = a;
            valid[i] = 1;
        }
        if (!(f & POS_IO)) continue;
        int ok = (f & POS_OK) != 0, is_cur = (f & POS_CUR) != 0;
        int reset = (c == OP_OPEN && ok) || ((c == OP_LSEEK || c == OP_FTELL) && a != NUL && a >= 0) ||
                    (c == OP_FSEEK && !is_cur && ok) || c == OP_REWIND || c == OP_CLOSE;
        int64_t base = -1, adv = 0;
        if (c == OP_OPEN) base = (f & POS_APPEND) ? -1 : 0;
        else if (c == OP_LSEEK || c == OP_FTELL) base = a == NUL ? -1 : a;
        else if (c == OP_FSEEK) base = ((f & POS_SET) && a != NUL) ? a : -1;
        else if (c == OP_REWIND) base = 0;
        int xfer = c == OP_XFER || c == OP_SXFER;
        if (xfer) adv = a == NUL ? 0 : a;
        else if (c == OP_FSEEK && is_cur && ok) adv = a == NUL ? 0 : a;
        int64_t key = (int64_t)((((uint64_t)proc[i] << 1) | ((f & POS_STDIO) ? 1u : 0u)) << 32 | fcode[i]);
        Stream *st = &streams[stream_slot(streams, cap, key)];
        if (!st->used) {
            if (2 * (used + 1) > cap) {
                Stream *grown = stream_grow(streams, cap);
                if (!grown) {
                    oom = 1;
                    break;
                }
                streams = grown;
                cap *= 2;
                st = &streams[stream_slot(streams, cap, key)];
            }
            used++;
        }
        int fresh = !st->used;
        if (fresh) {
            st->used = 1;
            st->key = key;
            st->open = 0;
            st->opened = 0;
            st->writable = 0;
        }
        if (fresh || reset) {
            st->known = reset && base >= 0;
            st->state = reset ? (uint64_t)base : 0;
        }
        if (xfer && st->known) {
            values[i] = (int64_t)st->state;
            valid[i] = 1;
        }
        st->state += (uint64_t)adv;
        if (stray && (xfer || c == OP_PXFER) && st->opened && (st->open == 0 || ((f & POS_WRITE) && !st->writable)))
            stray[i] = 1;
        if (c == OP_OPEN && ok) {
            st->open++;
            st->opened = 1;
            if (!(f & POS_RDONLY)) st->writable = 1;
        } else if (c == OP_CLOSE && st->open > 0) {
            st->open--;
        }
    }
    Py_END_ALLOW_THREADS
    free(streams);
    if (oom) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* ---------------------------------------------------------------------------- compact */

/*
 * compact(ints, imask, strs, lo, hi, op_of, sflag, srcs, outs)
 *     -> (valid_and, valid_or, beyond, odd, nstarts, nhosts)
 *
 * The event rows [lo, hi) of scan's buffers (ints, imask, strs) as the columns of a parsed
 * batch (dlreplay.analyze.trace.load.CHUNK_SCHEMA), computed as _compact_exprs defines them
 * (the same nulls, the same flags). op_of (int8) and sflag (uint8, SF_* bits) are per string
 * code of the scan; srcs (uint32) the trace file of each of the n = hi - lo rows, or empty
 * for one file. outs is a tuple of writable arrays of n values each, in the order of the
 * OUT_* enum below (its item sizes in out_size); the validity of the nullable outputs is the
 * bits V_* of outs[OUT_VALID]; outs[OUT_SPECIAL] (int64, 2n) gets the rows (0-based in the
 * range) of the processes' start records at [0, nstarts) and, at [n, n + nhosts), the first
 * row with a host hash of each (src, pid). beyond counts rows with a pid, ppid or tid that
 * does not fit 32 bits (read as null); odd counts rows with a byte count (size, size_requested,
 * a checkpoint's bytes) that is negative or beyond MAX_CALL_BYTES (read as null), and sets
 * V_ODDBYTES in their validity word. Runs without the GIL.
 */
enum {
    OUT_TS, OUT_DUR, OUT_RET, OUT_SIZEREQ, OUT_SIZE, OUT_PARG, OUT_BATCH, OUT_SAMPLE, OUT_PPID, /* int64 */
    OUT_PID, OUT_TID, OUT_EPOCH, OUT_STEP, OUT_CPUTIME, OUT_CPUTHREADS,                       /* int32 */
    OUT_TENSORS,                                                                               /* int16 */
    OUT_OP, OUT_POS,                                                                           /* int8, uint8 */
    OUT_CAT, OUT_NAME, OUT_FHASH, OUT_PATH,                                                    /* int32 codes */
    OUT_VALID,                                                                                 /* uint32 */
    OUT_SPECIAL,                                                                               /* int64, 2n */
    NOUT
};
static const Py_ssize_t out_size[NOUT] = {8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 2, 1, 1, 4, 4, 4, 4, 4, 8};
enum {
    V_TS = 1 << 0, V_DUR = 1 << 1, V_RET = 1 << 2, V_SIZEREQ = 1 << 3, V_SIZE = 1 << 4, V_BATCH = 1 << 5,
    V_SAMPLE = 1 << 6, V_PPID = 1 << 7, V_PID = 1 << 8, V_TID = 1 << 9, V_EPOCH = 1 << 10, V_STEP = 1 << 11,
    V_CPUTIME = 1 << 12, V_CPUTHREADS = 1 << 13, V_TENSORS = 1 << 14,
    V_ODDBYTES = 1 << 15 /* not a validity: the row had a byte count read as null */
};
/* The most bytes one call can move (load.py's _MAX_CALL_BYTES, 1 TiB): Linux moves at most
 * 2 GiB - 4 KiB in one read or write, and an fread/fwrite or a checkpoint's bytes beyond it
 * would need a buffer larger than a node's memory. A larger count is damage: its sums would
 * pass int64 after 8 M such events (one 2^63 - 1 already wraps a total). */
#define MAX_CALL_BYTES ((int64_t)1 << 40)

/* n items of item bytes each, when both are non-negative and the product is at most
 * MAX_CALL_BYTES (*out set, 1); else 0. */
static inline int call_bytes(int64_t n, int64_t item, int64_t *out)
{
    if (n < 0 || item < 0) return 0;
    if (item == 1 ? n > MAX_CALL_BYTES : item > 0 && n > MAX_CALL_BYTES / item) return 0; /* 1: no division */
    *out = n * item;
    return 1;
}
/* flags of a string code: the category "checkpoint", POSIX or STDIO, STDIO; a mode starting with "a";
 * the name "start"; the category "dftracer" */
enum { SF_CKPT = 1, SF_IOCAT = 2, SF_STDIO = 4, SF_MODE_A = 8, SF_START = 16, SF_DFT = 32, SF_MODE_R = 64, SF_WRITE = 128 };

static inline int fits32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

typedef struct {
    const int64_t *ints;
    const uint32_t *imask;
    const int32_t *strs;
    Py_ssize_t cap, lo, n, nuniq;
    const int8_t *op_of;
    const uint8_t *sflag;
    const uint32_t *srcs; /* NULL: one file */
    void *out[NOUT];
    uint32_t vand, vor;
    Py_ssize_t beyond, odd, nstarts, nhosts;
    int oom;
} Compact;

static void run_compact(Compact *c)
{
    const Py_ssize_t cap = c->cap, n = c->n;
    int64_t *o64[9];
    for (int k = 0; k < 9; k++) o64[k] = c->out[OUT_TS + k];
    int32_t *o32[6];
    for (int k = 0; k < 6; k++) o32[k] = c->out[OUT_PID + k];
    int16_t *tensors = c->out[OUT_TENSORS];
    int8_t *oop = c->out[OUT_OP];
    uint8_t *opos = c->out[OUT_POS];
    int32_t *ocode[4];
    for (int k = 0; k < 4; k++) ocode[k] = c->out[OUT_CAT + k];
    uint32_t *ovalid = c->out[OUT_VALID];
    int64_t *special = c->out[OUT_SPECIAL];
    /* (src, pid) keys seen with a host hash: open addressing, grown as needed */
    size_t hcap = 64, hused = 0;
    uint64_t *seen = calloc(hcap, sizeof(uint64_t)); /* key + 1; 0 empty */
    if (!seen) {
        c->oom = 1;
        return;
    }
    uint32_t vand = ~0u, vor = 0;
    Py_ssize_t beyond = 0, odd = 0, nst = 0, nh = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Py_ssize_t r = c->lo + i;
        const uint32_t m = c->imask[r];
#define HAS(f) ((m >> (f)) & 1u)
#define IV(f) (c->ints[(Py_ssize_t)(f) * cap + r])
#define SC(f) (c->strs[(Py_ssize_t)(f) * cap + r])
        const int32_t name = SC(S_NAME), cat = SC(S_CAT), mode = SC(S_MODE);
        const int op = name >= 0 && name < c->nuniq ? c->op_of[name] : 0;
        const unsigned cf = cat >= 0 && cat < c->nuniq ? c->sflag[cat] : 0;
        uint32_t v = 0;
        int64_t ret = HAS(I_RET) ? IV(I_RET) : 0;
        o64[OUT_TS][i] = HAS(I_TS) ? (v |= V_TS, IV(I_TS)) : 0;
        o64[OUT_DUR][i] = HAS(I_DUR) ? (v |= V_DUR, IV(I_DUR)) : 0;
        o64[OUT_RET][i] = HAS(I_RET) ? (v |= V_RET, ret) : 0;
        const int xfer = op >= OP_XFER;
        const int64_t item = op == OP_SXFER && HAS(I_ISIZE) ? IV(I_ISIZE) : 1;
        int64_t size = 0, sizereq = 0;
        int has_size = 0, odd_bytes = 0;
        if (xfer) {
            if (HAS(I_RET) && ret >= 0) { /* a negative ret is a failed call: no size, not damage */
                if (call_bytes(ret, item, &size)) has_size = 1;
                else odd_bytes = 1;
            }
            if (HAS(I_COUNT)) {
                if (call_bytes(IV(I_COUNT), item, &sizereq)) v |= V_SIZEREQ;
                else odd_bytes = 1;
            }
        } else if ((cf & SF_CKPT) && HAS(I_ABYTES)) {
            if (call_bytes(IV(I_ABYTES), 1, &size)) has_size = 1;
            else odd_bytes = 1;
        }
        if (has_size) v |= V_SIZE;
        if (odd_bytes) v |= V_ODDBYTES, odd++;
        o64[OUT_SIZE][i] = size;
        o64[OUT_SIZEREQ][i] = sizereq;
        int64_t parg = NUL;
        if (op == OP_LSEEK || op == OP_FTELL) parg = HAS(I_RET) ? ret : NUL;
        else if (op == OP_FSEEK || op == OP_PXFER) parg = HAS(I_AOFFSET) ? IV(I_AOFFSET) : NUL;
        else if (xfer) parg = has_size ? size : NUL;
        o64[OUT_PARG][i] = parg;
        o64[OUT_BATCH][i] = HAS(I_BATCH) ? (v |= V_BATCH, IV(I_BATCH)) : 0;
        o64[OUT_SAMPLE][i] = HAS(I_IMAGE) ? (v |= V_SAMPLE, IV(I_IMAGE)) : 0;
        o64[OUT_PPID][i] = HAS(I_PPID) ? (v |= V_PPID, IV(I_PPID)) : 0;
        int out = 0;
        int32_t pid = 0;
        if (HAS(I_PID)) {
            if (fits32(IV(I_PID))) pid = (int32_t)IV(I_PID), v |= V_PID;
            else out = 1;
        }
        o32[0][i] = pid;
        o32[1][i] = 0;
        if (HAS(I_TID)) {
            if (fits32(IV(I_TID))) o32[1][i] = (int32_t)IV(I_TID), v |= V_TID;
            else out = 1;
        }
        if (HAS(I_PPID) && !fits32(IV(I_PPID))) out = 1;
        beyond += out;
        o32[2][i] = HAS(I_EPOCH) && fits32(IV(I_EPOCH)) ? (v |= V_EPOCH, (int32_t)IV(I_EPOCH)) : 0;
        o32[3][i] = HAS(I_STEP) && fits32(IV(I_STEP)) ? (v |= V_STEP, (int32_t)IV(I_STEP)) : 0;
        o32[4][i] = HAS(I_CPUTIME) && IV(I_CPUTIME) >= 0 && IV(I_CPUTIME) <= INT32_MAX
                        ? (v |= V_CPUTIME, (int32_t)IV(I_CPUTIME)) : 0;
        o32[5][i] = HAS(I_CPUTHREADS) && IV(I_CPUTHREADS) >= 1 && IV(I_CPUTHREADS) <= INT32_MAX
                        ? (v |= V_CPUTHREADS, (int32_t)IV(I_CPUTHREADS)) : 0;
        tensors[i] = HAS(I_TENSORS) && IV(I_TENSORS) >= 0 && IV(I_TENSORS) <= INT16_MAX
                         ? (v |= V_TENSORS, (int16_t)IV(I_TENSORS)) : 0;
        unsigned pos = 0;
        if (!HAS(I_RET) || ret >= 0) pos |= POS_OK;
        if (HAS(I_WHENCE) && IV(I_WHENCE) == 1) pos |= POS_CUR;
        if (HAS(I_WHENCE) && IV(I_WHENCE) == 0) pos |= POS_SET;
        if ((HAS(I_FLAGS) && (IV(I_FLAGS) & 02000)) ||
            (mode >= 0 && mode < c->nuniq && (c->sflag[mode] & SF_MODE_A)))
            pos |= POS_APPEND;
        if ((HAS(I_FLAGS) && (IV(I_FLAGS) & 3) == 0) ||
            (mode >= 0 && mode < c->nuniq && (c->sflag[mode] & SF_MODE_R)))
            pos |= POS_RDONLY;
        if (name >= 0 && name < c->nuniq && (c->sflag[name] & SF_WRITE)) pos |= POS_WRITE;
        const int32_t fhash = SC(S_FHASH), path = SC(S_PATH) >= 0 ? SC(S_PATH) : SC(S_FNAME);
        if ((cf & SF_IOCAT) && (fhash >= 0 || path >= 0)) pos |= POS_IO;
        if (cf & SF_STDIO) pos |= POS_STDIO;
        oop[i] = (int8_t)op;
        opos[i] = (uint8_t)pos;
        ocode[0][i] = cat;
        ocode[1][i] = name;
        ocode[2][i] = fhash;
        ocode[3][i] = path;
        ovalid[i] = v;
        vand &= v;
        vor |= v;
        if (name >= 0 && name < c->nuniq && (c->sflag[name] & SF_START) && (cf & SF_DFT)) special[nst++] = i;
        if (SC(S_HHASH) >= 0) {
            uint64_t key = ((uint64_t)(c->srcs ? c->srcs[i] : 0) << 33) |
                           ((v & V_PID) ? (uint64_t)(uint32_t)pid : ((uint64_t)1 << 32));
            size_t j = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 24) & (hcap - 1);
            while (seen[j] && seen[j] != key + 1) j = (j + 1) & (hcap - 1);
            if (!seen[j]) {
                seen[j] = key + 1;
                special[n + nh++] = i;
                if (2 * ++hused > hcap) {
                    uint64_t *g = calloc(hcap * 2, sizeof(uint64_t));
                    if (!g) {
                        free(seen);
                        c->oom = 1;
                        return;
                    }
                    for (size_t a = 0; a < hcap; a++) {
                        if (!seen[a]) continue;
                        size_t b = (size_t)(((seen[a] - 1) * 0x9E3779B97F4A7C15ULL) >> 24) & (hcap * 2 - 1);
                        while (g[b]) b = (b + 1) & (hcap * 2 - 1);
                        g[b] = seen[a];
                    }
                    free(seen);
                    seen = g;
                    hcap *= 2;
                }
            }
        }
#undef HAS
#undef IV
#undef SC
    }
    free(seen);
    c->vand = n ? vand : 0;
    c->vor = vor;
    c->beyond = beyond;
    c->odd = odd;
    c->nstarts = nst;
    c->nhosts = nh;
}

static PyObject *compact(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_ints, *o_imask, *o_strs, *o_op, *o_sflag, *o_srcs, *o_outs, *result = NULL;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "OOOnnOOOO!", &o_ints, &o_imask, &o_strs, &lo, &hi, &o_op, &o_sflag, &o_srcs,
                          &PyTuple_Type, &o_outs))
        return NULL;
    if (PyTuple_GET_SIZE(o_outs) != NOUT) {
        PyErr_Format(PyExc_ValueError, "compact: %d output arrays expected", (int)NOUT);
        return NULL;
    }
    enum { NIN = 6 };
    PyObject *ins[NIN] = {o_ints, o_imask, o_strs, o_op, o_sflag, o_srcs};
    static const Py_ssize_t in_size[NIN] = {8, 4, 4, 1, 1, 4};
    Py_buffer bin[NIN], bout[NOUT];
    int gin = 0, gout = 0;
    for (; gin < NIN; gin++)
        if (get_buf(ins[gin], &bin[gin], in_size[gin], 0, "compact") < 0) goto done;
    for (; gout < NOUT; gout++)
        if (get_buf(PyTuple_GET_ITEM(o_outs, gout), &bout[gout], out_size[gout], 1, "compact") < 0) goto done;
    Compact c;
    memset(&c, 0, sizeof c);
    c.cap = bin[1].len / 4;
    c.lo = lo;
    c.n = hi - lo;
    c.nuniq = bin[3].len;
    if (lo < 0 || hi < lo || hi > c.cap || bin[0].len / 8 < (Py_ssize_t)NI * c.cap ||
        bin[2].len / 4 < (Py_ssize_t)NS * c.cap || bin[4].len != c.nuniq ||
        (bin[5].len && bin[5].len / 4 != c.n)) {
        PyErr_SetString(PyExc_ValueError, "compact: input buffers do not match the row range");
        goto done;
    }
    for (int k = 0; k < NOUT; k++) {
        if (bout[k].len / out_size[k] != (k == OUT_SPECIAL ? 2 * c.n : c.n)) {
            PyErr_SetString(PyExc_ValueError, "compact: an output array has the wrong length");
            goto done;
        }
        c.out[k] = bout[k].buf;
    }
    c.ints = bin[0].buf;
    c.imask = bin[1].buf;
    c.strs = bin[2].buf;
    c.op_of = bin[3].buf;
    c.sflag = bin[4].buf;
    c.srcs = bin[5].len ? bin[5].buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    run_compact(&c);
    Py_END_ALLOW_THREADS
    if (c.oom) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_BuildValue("(kknnnn)", (unsigned long)c.vand, (unsigned long)c.vor, c.beyond, c.odd, c.nstarts,
                           c.nhosts);
done:
    for (int k = 0; k < gout; k++) PyBuffer_Release(&bout[k]);
    for (int k = 0; k < gin; k++) PyBuffer_Release(&bin[k]);
    return result;
}

/*
 * merge_runs(ts_list, p_list, proc_src, out[, ord_list]) -> bool
 *
 * The run's row order by (ts, src) of k runs (the parts of dlreplay.analyze.trace.load's
 * merge), each in (ts, src, line) order: a k-way merge instead of a stable sort of the
 * concatenation (no packed key, no temporaries). ts_list: k int64 buffers (no nulls),
 * p_list: k uint32 buffers (each row's process index), proc_src: uint32 (the trace file
 * of each process), out: writable, n = the runs' total rows, items of 4 or 8 bytes: the
 * row indices into the runs' concatenation, in order. ord_list (None, or k items each
 * None or a buffer of 4- or 8-byte unsigned row indices, a permutation of the run's
 * rows): where given, the run's rows are in (ts, src, line) order as ord lists them
 * (ts[ord[0]], ts[ord[1]], ...; a part whose rows were never gathered into that order),
 * and out holds the rows' own indices (start of the run + ord[i]). Rows of equal
 * (ts, src) lie in one run (a file is in one part), so the result is the stable sort's.
 * Returns False, out undefined, when a run is not in (ts, src) order (the caller sorts
 * instead).
 *
 * part, parts (default 0, 1): write only the part-th of parts slices of the output, so that
 * parts calls (in threads: each runs without the GIL) merge one run set together. The
 * slices are cut at the (ts, src) keys of the largest run at j / parts of its rows; every
 * run's rows below a cut are found by binary search, and a slice starts where the rows
 * below its first cut end. Each call checks the order of its slice's rows (see run_cut for
 * the rows around a cut): all calls answering True is the whole merge's True.
 */
typedef struct {
    int64_t ts;
    uint32_t src;
    Py_ssize_t run;
} Head;

static inline int head_lt(const Head *a, const Head *b)
{
    if (a->ts != b->ts) return a->ts < b->ts;
    if (a->src != b->src) return a->src < b->src;
    return a->run < b->run;
}

static void heap_down(Head *h, Py_ssize_t n, Py_ssize_t i)
{
    Head x = h[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && head_lt(&h[c + 1], &h[c])) c++;
        if (!head_lt(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* Row i of run r in (ts, src) order: ord[r][i] where the run has an ord, else i. */
static inline Py_ssize_t run_row(const Py_buffer *bo, const char *have_o, Py_ssize_t r, Py_ssize_t i)
{
    if (!have_o[r]) return i;
    return bo[r].itemsize == 4 ? (Py_ssize_t)((const uint32_t *)bo[r].buf)[i]
                               : (Py_ssize_t)((const uint64_t *)bo[r].buf)[i];
}

/* The (ts, src) key of the row at position i of run r (in its (ts, src) order); a zero key
 * and *bad set where an index is out of range (1: the row beyond its run, 2: the row's
 * process beyond proc_src). */
static inline Head run_key(const Py_buffer *bt, const Py_buffer *bp, const Py_buffer *bo, const char *have_o,
                           const uint32_t *srcs, Py_ssize_t nsrc, Py_ssize_t r, Py_ssize_t i, int *bad)
{
    Head h = {0, 0, 0};
    Py_ssize_t row = run_row(bo, have_o, r, i);
    if ((size_t)row >= (size_t)(bt[r].len / 8)) {
        *bad = 1;
        return h;
    }
    uint32_t p = ((const uint32_t *)bp[r].buf)[row];
    if ((Py_ssize_t)p >= nsrc) {
        *bad = 2;
        return h;
    }
    h.ts = ((const int64_t *)bt[r].buf)[row];
    h.src = srcs[p];
    return h;
}

static inline int key_lt(const Head *a, const Head *b)
{
    return a->ts < b->ts || (a->ts == b->ts && a->src < b->src);
}

/* The first position of run r (m rows) whose key is not below cut, by binary search. Even
 * in a run out of order, the row before it is below cut and the row at it is not (the
 * search looked at both): so the rows on each side of a cut are in order, and each call's
 * own order checks cover the rest of the run. */
static Py_ssize_t run_cut(const Py_buffer *bt, const Py_buffer *bp, const Py_buffer *bo, const char *have_o,
                          const uint32_t *srcs, Py_ssize_t nsrc, Py_ssize_t r, Py_ssize_t m, const Head *cut, int *bad)
{
    Py_ssize_t lo = 0, hi = m;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        Head k = run_key(bt, bp, bo, have_o, srcs, nsrc, r, mid, bad);
        if (key_lt(&k, cut)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static PyObject *merge_runs(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_ts, *o_p, *o_src, *o_out, *o_ord = Py_None, *result = NULL, *oseq = NULL;
    Py_ssize_t part = 0, parts = 1;
    if (!PyArg_ParseTuple(args, "OOOO|Onn", &o_ts, &o_p, &o_src, &o_out, &o_ord, &part, &parts)) return NULL;
    if (parts < 1 || part < 0 || part >= parts) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: part must be in [0, parts)");
        return NULL;
    }
    PyObject *tseq = PySequence_Fast(o_ts, "ts_list");
    if (!tseq) return NULL;
    PyObject *pseq = PySequence_Fast(o_p, "p_list");
    if (!pseq) {
        Py_DECREF(tseq);
        return NULL;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(tseq), got_t = 0, got_p = 0, got_o = 0;
    Py_buffer bsrc, bout;
    int have_src = 0, have_out = 0;
    Py_buffer *bt = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
    Py_buffer *bp = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
    Py_ssize_t *pos = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_ssize_t));
    Py_ssize_t *start = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_ssize_t));
    Py_ssize_t *end = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_ssize_t));
    Head *heap = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Head));
    Py_buffer *bo = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_buffer));
    char *have_o = PyMem_Calloc((size_t)(k ? k : 1), 1);
    if (!bt || !bp || !pos || !start || !end || !heap || !bo || !have_o) {
        PyErr_NoMemory();
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(pseq) != k) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: ts_list and p_list differ in length");
        goto done;
    }
    if (o_ord != Py_None) {
        oseq = PySequence_Fast(o_ord, "ord_list");
        if (!oseq) goto done;
        if (PySequence_Fast_GET_SIZE(oseq) != k) {
            PyErr_SetString(PyExc_ValueError, "merge_runs: ord_list and ts_list differ in length");
            goto done;
        }
        for (; got_o < k; got_o++) {
            PyObject *item = PySequence_Fast_GET_ITEM(oseq, got_o);
            if (item == Py_None) continue;
            if (PyObject_GetBuffer(item, &bo[got_o], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
            have_o[got_o] = 1;
            if (bo[got_o].itemsize != 4 && bo[got_o].itemsize != 8) {
                PyErr_SetString(PyExc_ValueError, "merge_runs: a run's ord must hold 4- or 8-byte items");
                goto done;
            }
        }
    }
    for (; got_t < k; got_t++)
        if (get_buf(PySequence_Fast_GET_ITEM(tseq, got_t), &bt[got_t], 8, 0, "ts") < 0) goto done;
    for (; got_p < k; got_p++)
        if (get_buf(PySequence_Fast_GET_ITEM(pseq, got_p), &bp[got_p], 4, 0, "p") < 0) goto done;
    if (get_buf(o_src, &bsrc, 4, 0, "proc_src") < 0) goto done;
    have_src = 1;
    if (PyObject_GetBuffer(o_out, &bout, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    have_out = 1;
    Py_ssize_t n = 0, nsrc = bsrc.len / 4;
    for (Py_ssize_t r = 0; r < k; r++) {
        if (bt[r].len / 8 != bp[r].len / 4) {
            PyErr_SetString(PyExc_ValueError, "merge_runs: a run's ts and p differ in length");
            goto done;
        }
        start[r] = n;
        n += bt[r].len / 8;
    }
    Py_ssize_t isz = bout.itemsize;
    if ((isz != 4 && isz != 8) || bout.len != n * isz || (isz == 4 && n > (Py_ssize_t)UINT32_MAX)) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: out must hold the runs' rows as 4- or 8-byte items");
        goto done;
    }
    for (Py_ssize_t r = 0; r < k; r++) {
        if (have_o[r] && bo[r].len / bo[r].itemsize != bt[r].len / 8) {
            PyErr_SetString(PyExc_ValueError, "merge_runs: a run's ord and ts differ in length");
            goto done;
        }
    }
    const uint32_t *srcs = bsrc.buf;
    /* the row and process indices are checked where this call reads them (its cuts' searches,
     * then every row of its slice before the merge): each of parts calls checks its share */
    int sorted = 1, bad = 0;
    Py_BEGIN_ALLOW_THREADS
    /* this call's slice: per run, its rows [pos, end) between the cuts, written from w0 */
    Py_ssize_t big = 0, w0 = 0;
    for (Py_ssize_t r = 0; r < k; r++) {
        pos[r] = 0;
        end[r] = bt[r].len / 8;
        if (end[r] > end[big]) big = r;
    }
    if (parts > 1 && k > 0 && end[big] > 0) {
        Py_ssize_t mb = end[big];
        Head none = {0, 0, 0};
        Head lo_cut = part > 0 ? run_key(bt, bp, bo, have_o, srcs, nsrc, big, mb * part / parts, &bad) : none;
        Head hi_cut = part < parts - 1 ? run_key(bt, bp, bo, have_o, srcs, nsrc, big, mb * (part + 1) / parts, &bad)
                                       : none;
        for (Py_ssize_t r = 0; r < k && sorted && !bad; r++) {
            Py_ssize_t m = bt[r].len / 8;
            if (part > 0) pos[r] = run_cut(bt, bp, bo, have_o, srcs, nsrc, r, m, &lo_cut, &bad);
            if (part < parts - 1) end[r] = run_cut(bt, bp, bo, have_o, srcs, nsrc, r, m, &hi_cut, &bad);
            if (pos[r] > end[r]) sorted = 0; /* the cuts out of order: the largest run is */
            w0 += pos[r];
        }
    }
    for (Py_ssize_t r = 0; r < k && sorted && !bad; r++)
        for (Py_ssize_t i = pos[r]; i < end[r] && !bad; i++) run_key(bt, bp, bo, have_o, srcs, nsrc, r, i, &bad);
    if (bad) sorted = 0;
    Py_ssize_t h = 0;
    for (Py_ssize_t r = 0; r < k && sorted; r++) {
        if (pos[r] >= end[r]) continue;
        Py_ssize_t row = run_row(bo, have_o, r, pos[r]);
        heap[h].ts = ((const int64_t *)bt[r].buf)[row];
        heap[h].src = srcs[((const uint32_t *)bp[r].buf)[row]];
        heap[h].run = r;
        h++;
    }
    for (Py_ssize_t i = h / 2; i-- > 0;) heap_down(heap, h, i);
    uint32_t *o4 = bout.buf;
    int64_t *o8 = bout.buf;
    for (Py_ssize_t w = w0; h > 0; w++) {
        Py_ssize_t r = heap[0].run, i = pos[r];
        Py_ssize_t row = run_row(bo, have_o, r, i);
        if (isz == 4) o4[w] = (uint32_t)(start[r] + row);
        else o8[w] = (int64_t)(start[r] + row);
        Py_ssize_t m = end[r];
        if (i + 1 < m) {
            Py_ssize_t nrow = run_row(bo, have_o, r, i + 1);
            Head next = {((const int64_t *)bt[r].buf)[nrow], srcs[((const uint32_t *)bp[r].buf)[nrow]], r};
            if (head_lt(&next, &heap[0])) { /* (same run: compares (ts, src) only) */
                sorted = 0; /* the run goes back in (ts, src) */
                break;
            }
            pos[r] = i + 1;
            heap[0] = next;
        } else {
            heap[0] = heap[--h];
        }
        if (h > 1) heap_down(heap, h, 0);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad == 1 ? "merge_runs: a row index beyond its run"
                                                   : "merge_runs: a process index beyond proc_src");
        goto done;
    }
    result = PyBool_FromLong(sorted);
done:
    if (have_out) PyBuffer_Release(&bout);
    if (have_src) PyBuffer_Release(&bsrc);
    for (Py_ssize_t r = 0; r < got_t; r++) PyBuffer_Release(&bt[r]);
    for (Py_ssize_t r = 0; r < got_p; r++) PyBuffer_Release(&bp[r]);
    for (Py_ssize_t r = 0; have_o && r < k; r++)
        if (have_o[r]) PyBuffer_Release(&bo[r]);
    Py_XDECREF(oseq);
    PyMem_Free(bo);
    PyMem_Free(have_o);
    PyMem_Free(bt);
    PyMem_Free(bp);
    PyMem_Free(pos);
    PyMem_Free(start);
    PyMem_Free(end);
    PyMem_Free(heap);
    Py_DECREF(tseq);
    Py_DECREF(pseq);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Scan DFTracer JSON lines into column buffers (see the module source)."},
    {"is_utf8", is_utf8, METH_O, "True when the bytes are valid UTF-8 (the scanner's check)."},
    {"text_info", py_text_info, METH_O, "(newline count, is valid UTF-8) of a bytes-like object, in one pass."},
    {"file_offsets", file_offsets, METH_VARARGS, "File offsets of all rows, by row, walked in output order (see the module source)."},
    {"compact", compact, METH_VARARGS, "Scanned event rows as a parsed batch's columns (see the module source)."},
    {"merge_runs", merge_runs, METH_VARARGS, "Row order by (ts, src) of runs each in that order (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pfwscan", "Strict scanner of DFTracer JSON lines into columns.", -1, methods,
};

PyMODINIT_FUNC PyInit__pfwscan(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "NI", NI) < 0 || PyModule_AddIntConstant(m, "NS", NS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
