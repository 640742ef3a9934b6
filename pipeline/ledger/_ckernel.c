/* The audit's per-line kernel in one C call: validate a stored line as strict JSON
 * (RFC 8259, as orjson reads it) and read its envelope, without building Python
 * objects for the payload. The contract is pipeline/ledger/kernel.py's `scan`:
 *
 *     scan(body: bytes) -> (id, parent_id, kind, ts, prev_hash, at_turn, view) | None
 *
 * It only ever *accepts*: it answers None whenever it cannot vouch that orjson would
 * accept the line with the same envelope and view (docs/audit.md, "The per-line
 * kernel"), and the caller then reads the line with orjson, which decides and says why.
 * So everything unusual is deferred rather than decided here: integers past 64 bits,
 * numbers near the double range, nesting past MAX_DEPTH, escaped lone surrogates,
 * whitespace or a byte order mark around the object, repeated or escaped keys where
 * the kernel reads keys, escapes in a string it returns, too many keys.
 *
 * Plain C and the CPython C API only. SHA-256 is OpenSSL's, as hashlib's: called
 * directly where the libcrypto that hashlib loaded is found in the process (never
 * another copy of it), else hashlib's sha256 (see direct_sha256()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* PyMemberDef: a slot's offset (figures) */
#include <string.h>
#ifdef __linux__
#include <dlfcn.h>
#include <link.h>
#endif

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* Deeper than this is deferred (orjson's own limit is 1024). */
#define MAX_DEPTH 512
/* Keys compared for repeats, per object the kernel reads keys of: past it, defer. */
#define MAX_KEYS 64
/* A number literal longer than this is deferred (serde writes at most ~24 bytes). */
#define MAX_NUMBER 40

typedef unsigned char u8;

typedef struct {
    const u8 *p;
    const u8 *end;
    int depth;
} Cur;

enum { T_ABSENT = 0, T_STR, T_NULL, T_OBJ, T_ARR, T_OTHER };

/* A value as the kernel records it: its type, a string's content (between the quotes,
 * `esc` when it holds an escape), and the value's bytes. */
typedef struct {
    int type;
    int esc;
    const u8 *s;
    Py_ssize_t n;
    const u8 *start;
    const u8 *stop;
} Val;

typedef struct {
    const u8 *s;
    Py_ssize_t n;
} Key;

/* A content block of a message, as the view needs it. */
enum { B_NOTOBJ = 0, B_NOTYPE, B_TYPE, B_DUP };
typedef struct {
    int kind;
    const u8 *s;
    Py_ssize_t n;
} Block;

typedef struct {
    Block *blocks;
    Py_ssize_t nblocks;
    Py_ssize_t cap;
    Block small[16];
    int dup;        /* a key of the message repeated */
    int blocks_esc; /* a block's type or key holds an escape */
    Val role;
    Val content;
} Msg;

static PyObject *orjson_loads = NULL;
static PyObject *s_message = NULL, *s_role = NULL, *s_content = NULL, *s_type = NULL,
                *s_meta = NULL;

/* ------------------------------------------------------------------------------------ */
/* Grammar */

#define WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')

static inline void
skip_ws(Cur *c)
{
    while (c->p < c->end && WS(*c->p)) {
        c->p++;
    }
}

/* One UTF-8 sequence starting at p (a byte >= 0x80): its length, or 0 when invalid
 * (overlong, a surrogate code point, past U+10FFFF, cut, or a stray continuation). */
static inline int
utf8_seq(const u8 *p, const u8 *end)
{
    u8 b = p[0];
    Py_ssize_t left = end - p;
    if (b >= 0xC2 && b <= 0xDF) {
        return (left >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (b >= 0xE0 && b <= 0xEF) {
        if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) {
            return 0;
        }
        if (b == 0xE0 && p[1] < 0xA0) {
            return 0; /* overlong */
        }
        if (b == 0xED && p[1] > 0x9F) {
            return 0; /* U+D800..U+DFFF */
        }
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80
            || (p[3] & 0xC0) != 0x80) {
            return 0;
        }
        if (b == 0xF0 && p[1] < 0x90) {
            return 0; /* overlong */
        }
        if (b == 0xF4 && p[1] > 0x8F) {
            return 0; /* past U+10FFFF */
        }
        return 4;
    }
    return 0; /* 0x80..0xC1 (continuation, overlong lead), 0xF5..0xFF */
}

static inline int
hexval(u8 ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    ch |= 0x20;
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    return -1;
}

/* Four hex digits at p (p + 4 <= end checked by the caller): the code unit, or -1. */
static inline long
hex4(const u8 *p)
{
    int a = hexval(p[0]), b = hexval(p[1]), d = hexval(p[2]), e = hexval(p[3]);
    if ((a | b | d | e) < 0) {
        return -1;
    }
    return (a << 12) | (b << 8) | (d << 4) | e;
}

/* A string: c->p at its opening quote; on success c->p is past the closing quote and
 * v->s, v->n, v->esc describe its content. */
static int
parse_string(Cur *c, Val *v)
{
    const u8 *p = c->p + 1;
    const u8 *end = c->end;
    const u8 *start = p;
    int esc = 0;
    for (;;) {
#ifdef HAVE_SSE2
        /* 16 bytes at a time: stop at a quote, a backslash, a control character or a
         * byte >= 0x80 (negative as a signed byte, so below 0x20 too). */
        const __m128i quote = _mm_set1_epi8('"');
        const __m128i bslash = _mm_set1_epi8('\\');
        const __m128i space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i m = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                _mm_cmplt_epi8(x, space));
            int mask = _mm_movemask_epi8(m);
            if (mask) {
                p += __builtin_ctz((unsigned)mask);
                goto special;
            }
            p += 16;
        }
#endif
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') {
            p++;
        }
#ifdef HAVE_SSE2
    special:
#endif
        if (p >= end) {
            return -1; /* unterminated */
        }
        u8 ch = *p;
        if (ch == '"') {
            v->type = T_STR;
            v->s = start;
            v->n = p - start;
            v->esc = esc;
            c->p = p + 1;
            return 0;
        }
        if (ch == '\\') {
            esc = 1;
            if (end - p < 2) {
                return -1;
            }
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                continue;
            case 'u': {
                if (end - p < 6) {
                    return -1;
                }
                long u = hex4(p + 2);
                if (u < 0) {
                    return -1;
                }
                if (u >= 0xD800 && u <= 0xDBFF) {
                    /* a high surrogate: only as the first half of a pair */
                    if (end - p < 12 || p[6] != '\\' || p[7] != 'u') {
                        return -1;
                    }
                    long lo = hex4(p + 8);
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        return -1;
                    }
                    p += 12;
                    continue;
                }
                if (u >= 0xDC00 && u <= 0xDFFF) {
                    return -1; /* a lone low surrogate */
                }
                p += 6;
                continue;
            }
            default:
                return -1;
            }
        }
        if (ch < 0x20) {
            return -1; /* a control character (NUL included) must be escaped */
        }
        int len = utf8_seq(p, end);
        if (!len) {
            return -1;
        }
        p += len;
    }
}

/* A number (c->p at '-' or a digit). Deferred (-1) beyond what orjson surely reads the
 * same: integers of 19 digits or more (past 64 bits, orjson reads a float), values
 * that may overflow or underflow a double, literals longer than MAX_NUMBER. */
static int
parse_number(Cur *c)
{
    const u8 *p = c->p, *end = c->end, *start = p;
    if (p < end && *p == '-') {
        p++;
    }
    if (p >= end) {
        return -1;
    }
    const u8 *int_start = p;
    if (*p == '0') {
        p++;
    }
    else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
    }
    else {
        return -1;
    }
    Py_ssize_t int_digits = p - int_start;
    int is_float = 0;
    if (p < end && *p == '.') {
        p++;
        const u8 *f = p;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
        }
        if (p == f) {
            return -1;
        }
        is_float = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int neg = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            neg = *p == '-';
            p++;
        }
        const u8 *e = p;
        long exp = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (p - e < 6) {
                exp = exp * 10 + (*p - '0');
            }
            p++;
        }
        if (p == e || p - e > 4) {
            return -1;
        }
        if (neg) {
            exp = -exp;
        }
        if (exp < -300 || int_digits + exp > 300) {
            return -1;
        }
        is_float = 1;
    }
    if (p - start > MAX_NUMBER || (!is_float && int_digits > 18)) {
        return -1;
    }
    c->p = p;
    return 0;
}

static int parse_value(Cur *c, Val *v);

/* After a member of an object or an item of an array: 1 when a ',' follows (skipped,
   with the whitespace after it: the caller reads the next one), 0 when `close` ends the
   container (its depth given back), -1 for anything else (orjson refuses it too). */
static int
next_item(Cur *c, char close)
{
    skip_ws(c);
    if (c->p >= c->end) {
        return -1;
    }
    if (*c->p == ',') {
        c->p++;
        skip_ws(c);
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        c->depth--;
        return 0;
    }
    return -1;
}

static int
parse_object(Cur *c)
{
    if (++c->depth > MAX_DEPTH) {
        return -1;
    }
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        c->depth--;
        return 0;
    }
    Val k, v;
    for (;;) {
        if (c->p >= c->end || *c->p != '"' || parse_string(c, &k)) {
            return -1;
        }
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') {
            return -1;
        }
        c->p++;
        skip_ws(c);
        if (parse_value(c, &v)) {
            return -1;
        }
        int more = next_item(c, '}');
        if (more <= 0) {
            return more;
        }
    }
}

static int
parse_array(Cur *c)
{
    if (++c->depth > MAX_DEPTH) {
        return -1;
    }
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        c->depth--;
        return 0;
    }
    Val v;
    for (;;) {
        if (parse_value(c, &v)) {
            return -1;
        }
        int more = next_item(c, ']');
        if (more <= 0) {
            return more;
        }
    }
}

static inline int
literal(Cur *c, const char *word, Py_ssize_t n)
{
    if (c->end - c->p < n || memcmp(c->p, word, n) != 0) {
        return -1;
    }
    c->p += n;
    return 0;
}

/* Any value; records its type (and a string's content) in v. */
static int
parse_value(Cur *c, Val *v)
{
    if (c->p >= c->end) {
        return -1;
    }
    v->start = c->p;
    int rc;
    switch (*c->p) {
    case '"':
        rc = parse_string(c, v);
        break;
    case '{':
        v->type = T_OBJ;
        rc = parse_object(c);
        break;
    case '[':
        v->type = T_ARR;
        rc = parse_array(c);
        break;
    case 'n':
        v->type = T_NULL;
        rc = literal(c, "null", 4);
        break;
    case 't':
        v->type = T_OTHER;
        rc = literal(c, "true", 4);
        break;
    case 'f':
        v->type = T_OTHER;
        rc = literal(c, "false", 5);
        break;
    default:
        v->type = T_OTHER;
        rc = parse_number(c);
        break;
    }
    v->stop = c->p;
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* The objects whose keys the kernel reads: the line, its message, a message's blocks */

/* Whether key k repeats one of keys[0..n): keys are compared as stored (the callers
 * defer on escaped keys, so the stored bytes are the key). */
static inline int
repeated(const Key *keys, int n, const Val *k)
{
    for (int i = 0; i < n; i++) {
        if (keys[i].n == k->n && memcmp(keys[i].s, k->s, k->n) == 0) {
            return 1;
        }
    }
    return 0;
}

/* The members of an object whose keys are read: calls member() for each; *dup set when
 * a key repeats. Defers on an escaped key or more than MAX_KEYS keys. */
typedef int (*member_fn)(Cur *c, const Val *key, void *ctx);

static int
parse_keyed_object(Cur *c, member_fn member, void *ctx, int *dup)
{
    Key keys[MAX_KEYS];
    int nkeys = 0;
    if (++c->depth > MAX_DEPTH) {
        return -1;
    }
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        c->depth--;
        return 0;
    }
    Val k;
    for (;;) {
        if (c->p >= c->end || *c->p != '"' || parse_string(c, &k) || k.esc
            || nkeys == MAX_KEYS) {
            return -1;
        }
        if (repeated(keys, nkeys, &k)) {
            *dup = 1;
        }
        keys[nkeys].s = k.s;
        keys[nkeys].n = k.n;
        nkeys++;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') {
            return -1;
        }
        c->p++;
        skip_ws(c);
        if (member(c, &k, ctx)) {
            return -1;
        }
        int more = next_item(c, '}');
        if (more <= 0) {
            return more;
        }
    }
}

#define KEY_IS(k, lit) ((k)->n == (Py_ssize_t)(sizeof(lit) - 1) \
                        && memcmp((k)->s, lit, sizeof(lit) - 1) == 0)
/* Whether a value is the string `lit`, unescaped (so its stored bytes are the text). */
#define STR_IS(v, lit) ((v)->type == T_STR && !(v)->esc && KEY_IS(v, lit))

static int
block_member(Cur *c, const Val *key, void *ctx)
{
    Block *b = (Block *)ctx;
    Val v;
    if (parse_value(c, &v)) {
        return -1;
    }
    if (KEY_IS(key, "type")) {
        if (v.type == T_STR) {
            b->kind = B_TYPE;
            b->s = v.s;
            b->n = v.n;
            if (v.esc) {
                return -1; /* a returned string with an escape: orjson reads it */
            }
        }
        else {
            b->kind = B_NOTYPE;
        }
    }
    return 0;
}

static inline void
msg_init(Msg *m)
{
    memset(m, 0, sizeof(*m));
    m->blocks = m->small;
    m->cap = (Py_ssize_t)(sizeof(m->small) / sizeof(m->small[0]));
}

static inline void
msg_free(Msg *m)
{
    if (m->blocks != m->small) {
        PyMem_Free(m->blocks);
    }
}

/* Whether a stored line is an object alone: orjson also takes whitespace around it
 * (never written by vak or Claude Code), and refuses a byte order mark; both go to
 * orjson. */
static inline int
object_alone(const u8 *buf, Py_ssize_t size)
{
    return size >= 2 && buf[0] == '{' && buf[size - 1] == '}';
}

static int
push_block(Msg *m, const Block *b)
{
    if (m->nblocks == m->cap) {
        Py_ssize_t cap = m->cap * 2;
        Block *grown;
        if (m->blocks == m->small) {
            grown = PyMem_Malloc(cap * sizeof(Block));
            if (grown) {
                memcpy(grown, m->small, sizeof(m->small));
            }
        }
        else {
            grown = PyMem_Realloc(m->blocks, cap * sizeof(Block));
        }
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        m->blocks = grown;
        m->cap = cap;
    }
    m->blocks[m->nblocks++] = *b;
    return 0;
}

/* An array whose elements item() reads, one call each (c->p at the element; it
 * consumes it): 0, or -1 where the grammar refuses or defers. */
typedef int (*item_fn)(Cur *c, void *ctx);

static int
parse_items(Cur *c, item_fn item, void *ctx)
{
    if (++c->depth > MAX_DEPTH) {
        return -1;
    }
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        c->depth--;
        return 0;
    }
    for (;;) {
        if (item(c, ctx)) {
            return -1;
        }
        int more = next_item(c, ']');
        if (more <= 0) {
            return more;
        }
    }
}

/* A content block: an object (its keys read) or any value. */
static int
content_item(Cur *c, void *ctx)
{
    Msg *m = (Msg *)ctx;
    Block b = {B_NOTOBJ, NULL, 0};
    if (c->p < c->end && *c->p == '{') {
        int dup = 0;
        b.kind = B_NOTYPE;
        if (parse_keyed_object(c, block_member, &b, &dup)) {
            return -1;
        }
        if (dup) {
            b.kind = B_DUP;
        }
    }
    else {
        Val v;
        if (parse_value(c, &v)) {
            return -1;
        }
    }
    return push_block(m, &b);
}

/* A message's content array. */
static int
parse_content(Cur *c, Msg *m)
{
    m->nblocks = 0; /* a repeated content key: the view is dropped anyway */
    return parse_items(c, content_item, m);
}

static int
message_member(Cur *c, const Val *key, void *ctx)
{
    Msg *m = (Msg *)ctx;
    if (KEY_IS(key, "content")) {
        m->content.type = T_OTHER;
        if (c->p < c->end && *c->p == '[') {
            m->content.type = T_ARR;
            return parse_content(c, m);
        }
        Val v;
        return parse_value(c, &v);
    }
    if (KEY_IS(key, "role")) {
        return parse_value(c, &m->role);
    }
    Val v;
    return parse_value(c, &v);
}

/* The line's envelope and the values the view reads. */
typedef struct {
    Val id, parent, kind, ts, prev, at_turn, message, meta;
    Msg *msg;
    int msg_dup;
} Line;

static int
line_member(Cur *c, const Val *key, void *ctx)
{
    Line *l = (Line *)ctx;
    Val *slot = NULL;
    switch (key->n) {
    case 2:
        if (KEY_IS(key, "id")) {
            slot = &l->id;
        }
        else if (KEY_IS(key, "ts")) {
            slot = &l->ts;
        }
        break;
    case 4:
        if (KEY_IS(key, "kind")) {
            slot = &l->kind;
        }
        else if (KEY_IS(key, "meta")) {
            slot = &l->meta;
        }
        break;
    case 7:
        if (KEY_IS(key, "at_turn")) {
            slot = &l->at_turn;
        }
        else if (KEY_IS(key, "message")) {
            slot = &l->message;
            if (c->p < c->end && *c->p == '{') {
                Msg *m = l->msg;
                m->nblocks = 0;
                m->role.type = m->content.type = T_ABSENT;
                slot->type = T_OBJ;
                slot->start = c->p;
                int rc = parse_keyed_object(c, message_member, m, &m->dup);
                slot->stop = c->p;
                return rc;
            }
        }
        break;
    case 9:
        if (KEY_IS(key, "parent_id")) {
            slot = &l->parent;
        }
        else if (KEY_IS(key, "prev_hash")) {
            slot = &l->prev;
        }
        break;
    }
    if (slot) {
        return parse_value(c, slot);
    }
    Val v;
    return parse_value(c, &v);
}

/* ------------------------------------------------------------------------------------ */
/* The result */

static inline PyObject *
str_of(const Val *v)
{
    return PyUnicode_DecodeUTF8((const char *)v->s, v->n, NULL);
}

/* orjson.loads of a value's bytes (a span the grammar validated): a new reference, or
 * NULL, with an error set (no memory) or with *defer set (orjson refused the span:
 * cannot happen on a validated span; if it does, orjson decides on the whole line). */
static PyObject *
loads_span(const Val *v, int *defer)
{
    PyObject *span = PyBytes_FromStringAndSize((const char *)v->start, v->stop - v->start);
    if (!span) {
        return NULL;
    }
    PyObject *value = PyObject_CallOneArg(orjson_loads, span);
    Py_DECREF(span);
    if (!value) {
        PyErr_Clear();
        *defer = 1;
    }
    return value;
}

/* A content block (an object) cut to its type: {"type": ...}, or {} when its type is
 * absent or not a string; a new reference, NULL on an error. */
static PyObject *
block_dict(const Block *b)
{
    PyObject *item = PyDict_New();
    if (item && b->kind == B_TYPE) {
        Val t = {T_STR, 0, b->s, b->n, NULL, NULL};
        PyObject *s = str_of(&t);
        if (!s || PyDict_SetItem(item, s_type, s)) {
            Py_CLEAR(item);
        }
        Py_XDECREF(s);
    }
    return item;
}

/* The view of a message line (kernel.py's _message_view): a new reference, Py_None
 * (new reference) when the line is not the common shape, NULL with *defer set (and no
 * error) when the line must go to orjson, NULL with an error on a failure. */
static PyObject *
message_view(Line *l, int *defer)
{
    Msg *m = l->msg;
    if (l->message.type != T_OBJ || m->dup || m->role.type != T_STR
        || m->content.type != T_ARR) {
        Py_RETURN_NONE;
    }
    if (m->role.esc) {
        *defer = 1;
        return NULL;
    }
    int user = m->role.n == 4 && memcmp(m->role.s, "user", 4) == 0;
    PyObject *meta = NULL;
    if (l->meta.type == T_OBJ) {
        meta = loads_span(&l->meta, defer);
        if (!meta) {
            return NULL;
        }
    }
    else if (l->meta.type == T_NULL) {
        meta = Py_NewRef(Py_None);
    }
    else if (l->meta.type != T_ABSENT) {
        Py_RETURN_NONE;
    }
    PyObject *blocks = PyList_New(user ? m->nblocks : 0);
    if (!blocks) {
        goto fail;
    }
    if (user) {
        for (Py_ssize_t i = 0; i < m->nblocks; i++) {
            Block *b = &m->blocks[i];
            PyObject *item;
            if (b->kind == B_DUP) {
                Py_DECREF(blocks);
                Py_XDECREF(meta);
                Py_RETURN_NONE;
            }
            item = b->kind == B_NOTOBJ ? Py_NewRef(Py_None) : block_dict(b);
            if (!item) {
                Py_DECREF(blocks);
                goto fail;
            }
            PyList_SET_ITEM(blocks, i, item);
        }
    }
    PyObject *role = str_of(&m->role);
    PyObject *inner = role ? PyDict_New() : NULL;
    PyObject *view = inner ? PyDict_New() : NULL;
    if (!view || PyDict_SetItem(inner, s_role, role) || PyDict_SetItem(inner, s_content, blocks)
        || PyDict_SetItem(view, s_message, inner)
        || (meta && PyDict_SetItem(view, s_meta, meta))) {
        Py_XDECREF(role);
        Py_XDECREF(inner);
        Py_XDECREF(view);
        Py_DECREF(blocks);
        goto fail;
    }
    Py_DECREF(role);
    Py_DECREF(inner);
    Py_DECREF(blocks);
    Py_XDECREF(meta);
    return view;
fail:
    Py_XDECREF(meta);
    return NULL;
}

/* Whether a line's envelope is the shape scan() takes: id and kind non-empty strings,
 * parent_id a string or null, ts a string, prev_hash and at_turn strings or absent
 * (optional fields are omitted when absent, never null: spec section 2; a null one is
 * refused by the orjson reader's checks, which then say why), none of them escaped. */
static int
envelope_shape_ok(const Line *l)
{
    return l->id.type == T_STR && l->id.n > 0 && !l->id.esc
        && (l->parent.type == T_NULL || (l->parent.type == T_STR && !l->parent.esc))
        && l->kind.type == T_STR && l->kind.n > 0 && !l->kind.esc
        && l->ts.type == T_STR && !l->ts.esc
        && (l->prev.type == T_ABSENT || (l->prev.type == T_STR && !l->prev.esc))
        && (l->at_turn.type == T_ABSENT || (l->at_turn.type == T_STR && !l->at_turn.esc));
}

/* A returned envelope string (T_STR, no escape), Py_None for null/absent handled by
 * the caller. */
static PyObject *
scan_impl(const u8 *buf, Py_ssize_t size)
{
    if (!object_alone(buf, size)) {
        Py_RETURN_NONE;
    }
    Msg msg;
    msg_init(&msg);
    Line l;
    memset(&l, 0, sizeof(l));
    l.msg = &msg;
    Cur c = {buf, buf + size, 0};
    int dup = 0;
    PyObject *result = NULL;
    int ok = parse_keyed_object(&c, line_member, &l, &dup) == 0 && c.p == c.end && !dup;
    if (PyErr_Occurred()) { /* the blocks' allocation failed */
        goto done;
    }
    if (!ok || !envelope_shape_ok(&l)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *view;
    if (l.kind.n == 7 && memcmp(l.kind.s, "message", 7) == 0) {
        int defer = 0;
        view = message_view(&l, &defer);
        if (!view) {
            if (defer) {
                result = Py_NewRef(Py_None);
            }
            goto done;
        }
    }
    else {
        view = Py_NewRef(Py_None);
    }
    PyObject *id = str_of(&l.id);
    PyObject *parent = l.parent.type == T_STR ? str_of(&l.parent) : Py_NewRef(Py_None);
    PyObject *kind = str_of(&l.kind);
    PyObject *ts = str_of(&l.ts);
    PyObject *prev = l.prev.type == T_STR ? str_of(&l.prev) : Py_NewRef(Py_None);
    PyObject *at_turn = l.at_turn.type == T_STR ? str_of(&l.at_turn) : Py_NewRef(Py_None);
    if (id && parent && kind && ts && prev && at_turn) {
        result = PyTuple_Pack(7, id, parent, kind, ts, prev, at_turn, view);
    }
    Py_XDECREF(id);
    Py_XDECREF(parent);
    Py_XDECREF(kind);
    Py_XDECREF(ts);
    Py_XDECREF(prev);
    Py_XDECREF(at_turn);
    Py_DECREF(view);
done:
    msg_free(&msg);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* Claude Code transcript lines: pipeline/formats/claude_code.py's `scan`, in C.
 *
 *     scan_transcript(result_type, body: bytes) -> result_type | None
 *
 * The same contract as the simdjson scan there: validate the whole line, and return
 * (an instance of result_type, a dict subclass) the top-level fields the adapter reads
 * as plain values (an object or array there reads as the empty tuple, the adapter's
 * opaque value), the message cut to model, id, usage (whole, parsed by orjson from its
 * span) and content (a user's blocks cut to their type, [] for anyone else's), and
 * data cut to its type; a subagent's copied line (data.type "agent_progress") keeps
 * what the adapter reads of the copy too: data.agentId, and data.message cut to its
 * type, requestId and message, that cut to model, id and usage (whole). Deferred (None)
 * besides what scan() defers: a number or an escaped string where a plain value is
 * returned, a repeated key in an object read, a user's content that is neither a string
 * nor an array of objects, a toolUseResult naming a subagent (agentId). */

#define CC_NSCALARS 13
static const char *const cc_scalar_names[CC_NSCALARS] = {
    "uuid", "parentUuid", "logicalParentUuid", "isSidechain", "sessionId", "cwd", "version",
    "timestamp", "type", "requestId", "isMeta", "isCompactSummary", "subtype"};
static Py_ssize_t cc_scalar_lens[CC_NSCALARS];
static PyObject *cc_scalar_keys[CC_NSCALARS];
static PyObject *empty_args = NULL;
static PyObject *s_model = NULL, *s_id = NULL, *s_usage = NULL, *s_data = NULL,
                *s_agent_id = NULL;
enum { CC_UUID = 0, CC_PARENT = 1, CC_TIMESTAMP = 7, CC_TYPE = 8, CC_REQUEST_ID = 9,
       CC_IS_META = 10, CC_IS_COMPACT_SUMMARY = 11 };

/* A message's model, id and usage, and its content's blocks into msg (NULL: the
 * content is not read). */
typedef struct {
    Msg *msg;
    Val model, id, usage;
} CcMessage;

/* A subagent's line as its parent's agent_progress line copies it (data.message): its
 * type, requestId and message, and that message's model, id and usage (m; its content
 * is not read: m.msg stays NULL). */
typedef struct {
    Val type, request, message;
    CcMessage m;
    int dup, message_dup; /* a key of the copy, of its message, repeated */
} CcCopy;

typedef struct {
    Val scalars[CC_NSCALARS];
    int order[CC_NSCALARS]; /* the scalars present, in the line's order */
    int nscalars;
    unsigned seen; /* bit i: scalar i was read (a repeat defers the line) */
    Val message, data, data_type, agent_id, copy;
    CcMessage m;
    CcCopy cp;
    int data_dup, message_dup, agent;
} CcLine;

static int
cc_message_member(Cur *c, const Val *key, void *ctx)
{
    CcMessage *cm = (CcMessage *)ctx;
    if (cm->msg && KEY_IS(key, "content")) {
        if (c->p < c->end && *c->p == '[') {
            cm->msg->content.type = T_ARR;
            return parse_content(c, cm->msg);
        }
        return parse_value(c, &cm->msg->content);
    }
    Val *slot = KEY_IS(key, "model") ? &cm->model : KEY_IS(key, "id") ? &cm->id
                : KEY_IS(key, "usage") ? &cm->usage : NULL;
    if (slot) {
        return parse_value(c, slot);
    }
    Val v;
    return parse_value(c, &v);
}

static int
cc_copy_member(Cur *c, const Val *key, void *ctx)
{
    CcCopy *cp = (CcCopy *)ctx;
    if (KEY_IS(key, "message")) {
        if (c->p < c->end && *c->p == '{') {
            cp->message.type = T_OBJ;
            return parse_keyed_object(c, cc_message_member, &cp->m, &cp->message_dup);
        }
        return parse_value(c, &cp->message);
    }
    Val *slot = KEY_IS(key, "type") ? &cp->type : KEY_IS(key, "requestId") ? &cp->request
                : NULL;
    if (slot) {
        return parse_value(c, slot);
    }
    Val v;
    return parse_value(c, &v);
}

static int
cc_data_member(Cur *c, const Val *key, void *ctx)
{
    CcLine *l = (CcLine *)ctx;
    if (KEY_IS(key, "type")) {
        return parse_value(c, &l->data_type);
    }
    if (KEY_IS(key, "agentId")) {
        return parse_value(c, &l->agent_id);
    }
    if (KEY_IS(key, "message")) {
        /* Before data.type in Claude Code's lines: read as a copy whatever the type
         * turns out to be (only an agent_progress line's is returned). */
        if (c->p < c->end && *c->p == '{') {
            l->copy.type = T_OBJ;
            return parse_keyed_object(c, cc_copy_member, &l->cp, &l->cp.dup);
        }
        return parse_value(c, &l->copy);
    }
    Val v;
    return parse_value(c, &v);
}

static int
cc_result_member(Cur *c, const Val *key, void *ctx)
{
    if (KEY_IS(key, "agentId")) {
        *(int *)ctx = 1;
    }
    Val v;
    return parse_value(c, &v);
}

static int
cc_line_member(Cur *c, const Val *key, void *ctx)
{
    CcLine *l = (CcLine *)ctx;
    int open = c->p < c->end && *c->p == '{';
    if (KEY_IS(key, "message")) {
        l->message.type = T_OTHER;
        if (open) {
            l->message.type = T_OBJ;
            return parse_keyed_object(c, cc_message_member, &l->m, &l->message_dup);
        }
        return parse_value(c, &l->message);
    }
    if (KEY_IS(key, "data")) {
        l->data.type = T_OTHER;
        if (open) {
            l->data.type = T_OBJ;
            return parse_keyed_object(c, cc_data_member, l, &l->data_dup);
        }
        return parse_value(c, &l->data);
    }
    if (KEY_IS(key, "toolUseResult") && open) {
        int dup = 0; /* a repeated key does not change whether agentId is there */
        return parse_keyed_object(c, cc_result_member, &l->agent, &dup);
    }
    for (int i = 0; i < CC_NSCALARS; i++) {
        if (key->n == cc_scalar_lens[i] && memcmp(key->s, cc_scalar_names[i], key->n) == 0) {
            if (!(l->seen & (1u << i))) { /* a repeat defers the line (dup) */
                l->seen |= 1u << i;
                l->order[l->nscalars++] = i;
            }
            return parse_value(c, &l->scalars[i]);
        }
    }
    Val v;
    return parse_value(c, &v);
}

/* Whether a value is plain: one cc_plain() reads rather than leaves to orjson (a number,
 * an escaped string). */
static inline int
plain_ok(const Val *v)
{
    switch (v->type) {
    case T_STR:
        return !v->esc;
    case T_NULL:
    case T_OBJ:
    case T_ARR:
        return 1;
    case T_OTHER:
        return *v->start == 't' || *v->start == 'f';
    }
    return 0;
}

/* A plain value as orjson gives it (a new reference), the opaque () for an object or
 * an array, NULL with *defer set for what is left to orjson (a number, an escape). */
static PyObject *
cc_plain(const Val *v, int *defer)
{
    if (!plain_ok(v)) {
        *defer = 1;
        return NULL;
    }
    switch (v->type) {
    case T_STR:
        return str_of(v);
    case T_OBJ:
    case T_ARR:
        return PyTuple_New(0);
    case T_OTHER:
        return Py_NewRef(*v->start == 't' ? Py_True : Py_False);
    }
    return Py_NewRef(Py_None); /* T_NULL */
}

/* Set out[key] = value, stealing value; -1 on an error or a deferral (value NULL). */
static int
cc_set(PyObject *out, PyObject *key, PyObject *value)
{
    if (!value) {
        return -1;
    }
    int rc = PyDict_SetItem(out, key, value);
    Py_DECREF(value);
    return rc;
}

/* A user's content blocks cut to their type: a new list, or NULL (*defer set when an
 * item is not an object or repeats a key). */
static PyObject *
cc_blocks(const Msg *m, int *defer)
{
    PyObject *blocks = PyList_New(m->nblocks);
    if (!blocks) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < m->nblocks; i++) {
        const Block *b = &m->blocks[i];
        if (b->kind == B_NOTOBJ || b->kind == B_DUP) {
            *defer = 1;
            Py_DECREF(blocks);
            return NULL;
        }
        PyObject *item = block_dict(b);
        if (!item) {
            Py_DECREF(blocks);
            return NULL;
        }
        PyList_SET_ITEM(blocks, i, item);
    }
    return blocks;
}

/* A model, id and usage, as they are, into `cut` (cc_message()'s, a copy's): 0, or -1
 * on an error or a deferral. */
static int
cc_request_fields(PyObject *cut, const Val *model, const Val *id, const Val *usage,
                  int *defer)
{
    if ((model->type != T_ABSENT && cc_set(cut, s_model, cc_plain(model, defer)))
        || (id->type != T_ABSENT && cc_set(cut, s_id, cc_plain(id, defer)))) {
        return -1;
    }
    if (usage->type == T_OBJ) {
        return cc_set(cut, s_usage, loads_span(usage, defer));
    }
    return usage->type != T_ABSENT ? cc_set(cut, s_usage, cc_plain(usage, defer)) : 0;
}

static PyObject *
cc_message(const CcLine *l, int user, int *defer)
{
    const CcMessage *cm = &l->m;
    PyObject *cut = PyDict_New();
    if (!cut) {
        return NULL;
    }
    if (cc_request_fields(cut, &cm->model, &cm->id, &cm->usage, defer)) {
        goto fail;
    }
    const Msg *m = cm->msg;
    if (m->content.type != T_ABSENT) {
        PyObject *content;
        if (!user) {
            content = PyList_New(0); /* only a user's blocks are read */
        }
        else if (m->content.type == T_STR) {
            content = PyUnicode_New(0, 0); /* a text block, whatever it says */
        }
        else if (m->content.type == T_ARR) {
            content = cc_blocks(m, defer);
        }
        else if (m->content.type == T_NULL) {
            content = Py_NewRef(Py_None);
        }
        else {
            *defer = 1; /* an object or a scalar: orjson reads the line */
            content = NULL;
        }
        if (cc_set(cut, s_content, content)) {
            goto fail;
        }
    }
    return cut;
fail:
    Py_DECREF(cut);
    return NULL;
}

/* An agent_progress line's copy into its data's cut: agentId, and message cut to its
 * type, requestId and message (model, id, usage). 0, or -1 on an error or a deferral. */
static int
cc_copy(PyObject *cut, const CcLine *l, int *defer)
{
    const CcCopy *cp = &l->cp;
    if (cp->dup || cp->message_dup) {
        *defer = 1; /* a repeated key in the copy: orjson keeps the last */
        return -1;
    }
    if (l->agent_id.type != T_ABSENT
        && cc_set(cut, s_agent_id, cc_plain(&l->agent_id, defer))) {
        return -1;
    }
    if (l->copy.type != T_OBJ) {
        return l->copy.type != T_ABSENT ? cc_set(cut, s_message, cc_plain(&l->copy, defer)) : 0;
    }
    PyObject *line = PyDict_New();
    if (!line) {
        return -1;
    }
    if ((cp->type.type != T_ABSENT && cc_set(line, s_type, cc_plain(&cp->type, defer)))
        || (cp->request.type != T_ABSENT
            && cc_set(line, cc_scalar_keys[CC_REQUEST_ID], cc_plain(&cp->request, defer)))) {
        goto fail;
    }
    if (cp->message.type == T_OBJ) {
        PyObject *message = PyDict_New();
        if (!message) {
            goto fail;
        }
        if (cc_request_fields(message, &cp->m.model, &cp->m.id, &cp->m.usage, defer)) {
            Py_DECREF(message);
            goto fail;
        }
        if (cc_set(line, s_message, message)) {
            goto fail;
        }
    }
    else if (cp->message.type != T_ABSENT
             && cc_set(line, s_message, cc_plain(&cp->message, defer))) {
        goto fail;
    }
    return cc_set(cut, s_message, line);
fail:
    Py_DECREF(line);
    return -1;
}

/* Read a line (an object alone) into `l`, its message's blocks into `msg` (initialised
 * by the caller, who frees it): 1 when the scan reads the line (valid, no repeated key
 * where keys are read, no subagent named by a toolUseResult), 0 when it is left to
 * orjson, -1 with an error set (the blocks' allocation failed). */
static int
cc_parse(const u8 *buf, Py_ssize_t size, CcLine *l, Msg *msg)
{
    memset(l, 0, sizeof(*l));
    l->m.msg = msg;
    Cur c = {buf, buf + size, 0};
    int dup = 0;
    int ok = parse_keyed_object(&c, cc_line_member, l, &dup) == 0 && c.p == c.end && !dup
             && !l->message_dup && !l->data_dup && !l->agent;
    return PyErr_Occurred() ? -1 : ok;
}

static PyObject *
scan_transcript_impl(PyObject *result_type, const u8 *buf, Py_ssize_t size)
{
    if (!object_alone(buf, size)) {
        Py_RETURN_NONE;
    }
    Msg msg;
    msg_init(&msg);
    CcLine l;
    int defer = 0;
    PyObject *out = NULL;
    int ok = cc_parse(buf, size, &l, &msg);
    if (ok < 0) {
        goto done;
    }
    if (!ok) {
        goto defer;
    }
    PyObject *data_type = NULL;
    int copied = 0; /* a subagent's copied line (agent_progress) */
    if (l.data.type == T_OBJ) {
        if (l.data_type.type == T_ABSENT) {
            data_type = Py_NewRef(Py_None);
        }
        else {
            data_type = cc_plain(&l.data_type, &defer);
            if (!data_type) {
                goto done_or_defer;
            }
            copied = STR_IS(&l.data_type, "agent_progress");
        }
    }
    /* A new, empty instance of the dict subclass, without the Python-level call. */
    out = ((PyTypeObject *)result_type)->tp_new((PyTypeObject *)result_type, empty_args, NULL);
    if (!out) {
        Py_XDECREF(data_type);
        goto done;
    }
    for (int i = 0; i < l.nscalars; i++) {
        int at = l.order[i];
        if (cc_set(out, cc_scalar_keys[at], cc_plain(&l.scalars[at], &defer))) {
            Py_XDECREF(data_type);
            goto done_or_defer;
        }
    }
    if (l.message.type == T_OBJ) {
        const Val *t = &l.scalars[CC_TYPE];
        int user = STR_IS(t, "user");
        if (cc_set(out, s_message, cc_message(&l, user, &defer))) {
            Py_XDECREF(data_type);
            goto done_or_defer;
        }
    }
    else if (l.message.type != T_ABSENT
             && cc_set(out, s_message, cc_plain(&l.message, &defer))) {
        Py_XDECREF(data_type);
        goto done_or_defer;
    }
    if (l.data.type == T_OBJ) {
        PyObject *cut = PyDict_New();
        int rc = cut ? PyDict_SetItem(cut, s_type, data_type) : -1;
        Py_DECREF(data_type);
        if (!rc && copied) {
            rc = cc_copy(cut, &l, &defer);
        }
        if (rc) {
            Py_XDECREF(cut);
            goto done_or_defer;
        }
        if (cc_set(out, s_data, cut)) {
            goto done_or_defer;
        }
    }
    else if (l.data.type != T_ABSENT && cc_set(out, s_data, cc_plain(&l.data, &defer))) {
        goto done_or_defer;
    }
    goto done;
done_or_defer:
    Py_CLEAR(out);
    if (!defer) {
        goto done; /* an error is set */
    }
defer:
    out = Py_NewRef(Py_None);
done:
    msg_free(&msg);
    return out;
}

static PyObject *
ckernel_scan_transcript(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "scan_transcript() wants a result type and bytes");
        return NULL;
    }
    return scan_transcript_impl(args[0], (const u8 *)PyBytes_AS_STRING(args[1]),
                                PyBytes_GET_SIZE(args[1]));
}

static PyObject *
ckernel_scan(PyObject *Py_UNUSED(module), PyObject *body)
{
    if (!PyBytes_Check(body)) {
        PyErr_Format(PyExc_TypeError, "scan() wants bytes, not %.100s",
                     Py_TYPE(body)->tp_name);
        return NULL;
    }
    return scan_impl((const u8 *)PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
}

/* What the line seems to hold, judged (like kernel.py's worth_it) by the first
 * `"kind":"` within its first 512 bytes: a receipt, a header, or anything else. A guess
 * only: every reader gives the same result. */
enum { GUESS_OTHER = 0, GUESS_RECEIPT, GUESS_HEADER };

static int
guess_kind(const char *buf, Py_ssize_t size)
{
    static const char needle[] = "\"kind\":\"";
    const Py_ssize_t nlen = sizeof(needle) - 1;
    Py_ssize_t within = size < 512 ? size : 512;
    const char *at = NULL;
    for (const char *p = buf; p + nlen <= buf + within;) {
        const char *q = memchr(p, '"', (buf + within) - p);
        if (!q || q + nlen > buf + within) {
            break;
        }
        if (memcmp(q, needle, nlen) == 0) {
            at = q + nlen;
            break;
        }
        p = q + 1;
    }
    if (at) {
        Py_ssize_t left = (buf + size) - at;
        if (left >= 8 && memcmp(at, "receipt\"", 8) == 0) {
            return GUESS_RECEIPT;
        }
        if (left >= 7 && memcmp(at, "header\"", 7) == 0) {
            return GUESS_HEADER;
        }
    }
    return GUESS_OTHER;
}

/* Whether scan() is worth calling on `body`: not when it holds a receipt or a header
 * (guess_kind), of which the audit reads more than scan() keeps (entry() reads them
 * its own way: receipt_entry(), header_entry()); every other line, any size (the C
 * kernel is faster than orjson at every size measured: docs/audit.md). */
static int
worth_it_impl(const char *buf, Py_ssize_t size)
{
    return guess_kind(buf, size) == GUESS_OTHER;
}

static PyObject *
ckernel_worth_it(PyObject *Py_UNUSED(module), PyObject *body)
{
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "worth_it() wants bytes");
        return NULL;
    }
    return PyBool_FromLong(worth_it_impl(PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body)));
}

/* ------------------------------------------------------------------------------------ */
/* A whole entry in one call: reader.py's parse_entry for a line the C kernel reads.
 *
 *     entry(body: bytes, line: int) -> LazyEntry | Entry | None
 *
 * worth_it, scan, the timestamp's check (reader.valid_ts: its shape and a real
 * calendar date), SHA-256 (hashlib's, so the same OpenSSL digest), the payload and the
 * entry tuple, without a Python frame between them. A line not worth scanning (a
 * receipt, a header: the audit reads all of it) takes parse_entry_orjson's common path
 * in C instead (eager_entry). None where parse_entry would go on to another path (not
 * vouched for, a timestamp it refuses, an unusual envelope): the caller then reads the
 * line with orjson, and the verdict, envelope and payload are the same either way. The
 * types and hashlib's sha256 are given once by configure(). */

static PyTypeObject *entry_type = NULL, *eager_type = NULL;
static PyObject *payload_type = NULL, *sha256_func = NULL, *s_hexdigest = NULL;
static PyObject *s_parent_id = NULL, *s_kind = NULL, *s_ts = NULL, *s_prev_hash = NULL,
                *s_at_turn = NULL;

static inline int
digits(const Py_UCS1 *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* reader.valid_ts on an ASCII text: `YYYY-MM-DDTHH:MM:SS[.fff|.ffffff|.fffffffff]Z`,
 * hours 00-23, minutes and seconds 00-59 (no leap second), and a date
 * datetime.date.fromisoformat takes (year 1-9999, a day of that month). */
static int
valid_ts_ascii(const Py_UCS1 *s, Py_ssize_t n)
{
    int year, month, day, hour, minute, second, fraction;
    if (n != 20 && n != 24 && n != 27 && n != 30) {
        return 0;
    }
    if (!digits(s, 4, &year) || s[4] != '-' || !digits(s + 5, 2, &month) || s[7] != '-'
        || !digits(s + 8, 2, &day) || s[10] != 'T' || !digits(s + 11, 2, &hour)
        || s[13] != ':' || !digits(s + 14, 2, &minute) || s[16] != ':'
        || !digits(s + 17, 2, &second) || s[n - 1] != 'Z') {
        return 0;
    }
    if (n > 20 && (s[19] != '.' || !digits(s + 20, (int)n - 21, &fraction))) {
        return 0;
    }
    if (hour > 23 || minute > 59 || second > 59 || year < 1 || month < 1 || month > 12
        || day < 1) {
        return 0;
    }
    static const int days_in[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return day <= days_in[month - 1] + (month == 2 && leap);
}

/* Objects made in C without their type's __init__ (payloads, nodes, the audit's infos:
 * that __init__ only stores its fields, and a test holds the two alike): the member
 * descriptors of `type`'s slots `names`, into `out` (new references), 0; or -1 with an
 * error naming the missing one and `out` unchanged. */
static int
slot_descriptors(const char *caller, PyObject *type, const char *const *names, int n,
                 PyObject **out)
{
    PyObject *found[16];
    if (n > 16) {
        PyErr_Format(PyExc_SystemError, "%s(): too many slots", caller);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *slot = PyObject_GetAttrString(type, names[i]);
        if (!slot || !Py_IS_TYPE(slot, &PyMemberDescr_Type)) {
            Py_XDECREF(slot);
            for (int j = 0; j < i; j++) {
                Py_DECREF(found[j]);
            }
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s(): %s has no slot %s", caller,
                         ((PyTypeObject *)type)->tp_name, names[i]);
            return -1;
        }
        found[i] = slot;
    }
    for (int i = 0; i < n; i++) {
        Py_XSETREF(out[i], found[i]);
    }
    return 0;
}

/* An instance of `type` whose slots (descriptors `slots`) hold `values`, made without
 * its __init__; a new reference or NULL. */
static PyObject *
slotted(PyTypeObject *type, PyObject *const *slots, PyObject *const *values, int n)
{
    PyObject *obj = type->tp_alloc(type, 0);
    if (!obj) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (Py_TYPE(slots[i])->tp_descr_set(slots[i], obj, values[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* OpenSSL's SHA-256 of (data, n) into md, the functions under hashlib's sha256, taken
 * from the libcrypto this process already loaded for hashlib, or NULL (not found, or
 * turned off by direct_sha256(False)): then hashlib's sha256 is called. Called directly,
 * a line's digest skips hashlib's two digest contexts, its hash object and its method
 * call (~0.35 us of the ~1.4 us a 1.6 KB line's digest takes through hashlib).
 *
 * Where libcrypto exports SHA256_Init/Update/Final (OpenSSL 1.1 and 3.x: deprecated in
 * 3.0, still exported) those are called, on a context on the stack: OpenSSL 3's one-shot
 * SHA256() goes through EVP_Q_digest, which fetches the algorithm from the provider
 * (under a lock), allocates a context and frees it for every call, ~55% on top of the
 * hashing itself for the fleet's lines (docs/scaling.md). Else the one-shot SHA256(). */
typedef unsigned char *(*sha256_fn)(const unsigned char *, size_t, unsigned char *);
static sha256_fn openssl_sha256 = NULL, found_sha256 = NULL;

/* SHA256_CTX is 112 bytes in every OpenSSL since 0.9.8 (eight words of state, two of
 * length, sixteen of block, two counts); the room here is kept well above that, as its
 * layout is OpenSSL's and the kernel is built without its headers. */
typedef union {
    unsigned char room[512];
    unsigned long long align;
} sha256_ctx;
static int (*sha256_init)(sha256_ctx *) = NULL;
static int (*sha256_update)(sha256_ctx *, const void *, size_t) = NULL;
static int (*sha256_final)(unsigned char *, sha256_ctx *) = NULL;

/* SHA256() over the low-level calls (found with them: see find_openssl_sha256). */
static unsigned char *
low_level_sha256(const unsigned char *data, size_t n, unsigned char *md)
{
    sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, data, n);
    sha256_final(md, &ctx);
    return md;
}

#ifdef __linux__
static int
libcrypto_path(struct dl_phdr_info *info, size_t Py_UNUSED(size), void *out)
{
    if (info->dlpi_name && strstr(info->dlpi_name, "/libcrypto.so")) {
        *(const char **)out = info->dlpi_name;
        return 1;
    }
    return 0;
}
#endif

/* Look for SHA-256 in the libcrypto loaded already (RTLD_NOLOAD: never load one): the
 * low-level calls where all three are there, else SHA256(), else NULL. */
static sha256_fn
find_openssl_sha256(void)
{
#ifdef __linux__
    const char *path = NULL;
    dl_iterate_phdr(libcrypto_path, &path);
    if (!path) {
        return NULL;
    }
    void *lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) {
        return NULL;
    }
    /* lib stays open: the process holds it for hashlib anyway */
    *(void **)(&sha256_init) = dlsym(lib, "SHA256_Init");
    *(void **)(&sha256_update) = dlsym(lib, "SHA256_Update");
    *(void **)(&sha256_final) = dlsym(lib, "SHA256_Final");
    if (sha256_init && sha256_update && sha256_final) {
        return low_level_sha256;
    }
    sha256_fn fn;
    *(void **)(&fn) = dlsym(lib, "SHA256");
    return fn;
#else
    return NULL;
#endif
}

/* The payload's four slots (body, data, view, mapper), as their member descriptors: a
 * payload is made by the type's allocator and these, without the Python frame of its
 * __init__ (which only stores the four), once a line. */
#define PAYLOAD_SLOTS 4
static const char *payload_slot_names[PAYLOAD_SLOTS] = {"body", "data", "view", "mapper"};
static PyObject *payload_slots[PAYLOAD_SLOTS];

static PyObject *
ckernel_configure(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0])
        || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)
        || !PyType_Check(args[1]) || !PyCallable_Check(args[2]) || !PyType_Check(args[3])
        || !PyType_IsSubtype((PyTypeObject *)args[3], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "configure() wants the lazy entry type (a tuple subclass), the "
                        "payload type, hashlib.sha256 and the entry type (a tuple subclass)");
        return NULL;
    }
    if (slot_descriptors("configure", args[1], payload_slot_names, PAYLOAD_SLOTS,
                         payload_slots) < 0) {
        return NULL;
    }
    Py_XSETREF(entry_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(payload_type, Py_NewRef(args[1]));
    Py_XSETREF(sha256_func, Py_NewRef(args[2]));
    Py_XSETREF(eager_type, (PyTypeObject *)Py_NewRef(args[3]));
    if (!found_sha256) {
        /* After hashlib's import (the caller's), so its libcrypto is there to find. */
        found_sha256 = openssl_sha256 = find_openssl_sha256();
    }
    Py_RETURN_NONE;
}

/* payload_type(body, data, view, mapper) */
static PyObject *
new_payload(PyObject *body, PyObject *data, PyObject *view, PyObject *mapper)
{
    PyObject *values[PAYLOAD_SLOTS] = {body, data, view, mapper};
    return slotted((PyTypeObject *)payload_type, payload_slots, values, PAYLOAD_SLOTS);
}

#define ENTRY_FIELDS 9

/* The hex SHA-256 of the first `size` bytes of body (all of them, or all but a raw
 * line's newline when the digest is direct: see chained_impl), as hashlib's
 * hexdigest() spells it. */
static PyObject *
hex_digest(PyObject *body, Py_ssize_t size)
{
    if (openssl_sha256) {
        static const char hexdigits[] = "0123456789abcdef";
        unsigned char md[32];
        openssl_sha256((const unsigned char *)PyBytes_AS_STRING(body), (size_t)size, md);
        PyObject *hex = PyUnicode_New(64, 127);
        if (!hex) {
            return NULL;
        }
        Py_UCS1 *out = PyUnicode_1BYTE_DATA(hex);
        for (int i = 0; i < 32; i++) {
            out[2 * i] = (Py_UCS1)hexdigits[md[i] >> 4];
            out[2 * i + 1] = (Py_UCS1)hexdigits[md[i] & 15];
        }
        return hex;
    }
    assert(size == PyBytes_GET_SIZE(body));
    PyObject *hash = PyObject_CallOneArg(sha256_func, body);
    if (!hash) {
        return NULL;
    }
    PyObject *digest = PyObject_CallMethodNoArgs(hash, s_hexdigest);
    Py_DECREF(hash);
    return digest;
}

/* direct_sha256(on=None) -> bool */
static PyObject *
ckernel_direct_sha256(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1 || (nargs == 1 && args[0] != Py_None && !PyBool_Check(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "direct_sha256() wants True, False or nothing");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        openssl_sha256 = args[0] == Py_True ? found_sha256 : NULL;
    }
    return PyBool_FromLong(openssl_sha256 != NULL);
}

/* sha256_calls() -> str */
static PyObject *
ckernel_sha256_calls(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    if (!openssl_sha256) {
        return PyUnicode_FromString("hashlib");
    }
    return PyUnicode_FromString(openssl_sha256 == low_level_sha256 ? "SHA256_Init/Update/Final"
                                                                   : "SHA256");
}

/* sha256_hex(body: bytes) -> str */
static PyObject *
ckernel_sha256_hex(PyObject *Py_UNUSED(module), PyObject *body)
{
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "sha256_hex() wants bytes");
        return NULL;
    }
    if (!sha256_func) {
        PyErr_SetString(PyExc_RuntimeError, "sha256_hex() before configure()");
        return NULL;
    }
    return hex_digest(body, PyBytes_GET_SIZE(body));
}

/* An optional envelope field of a parsed line, as reader.parse_entry_orjson accepts it:
 * a str, or absent (never null): 1 with *out borrowed (NULL when absent), 0 refused. */
static inline int
optional_str(PyObject *obj, PyObject *key, PyObject **out)
{
    PyObject *v = PyDict_GetItemWithError(obj, key);
    *out = v;
    return v ? PyUnicode_CheckExact(v) : !PyErr_Occurred();
}

/* reader.parse_entry_orjson's common case in one call, for a line the audit reads
 * whole (a receipt, a header: worth_it is false): orjson parses it, the envelope is
 * read from the dict with the same checks (id and kind non-empty strings, parent_id a
 * string or null, prev_hash and at_turn strings or absent, the timestamp valid), and the
 * entry is an eager one (its data the parsed dict). None where that function would take
 * another path (the line is not JSON, not an object, an envelope field is unusual): it
 * then reads the line again, decides and says why, so the verdict cannot differ. */
static PyObject *
eager_entry(PyObject *body, Py_ssize_t size, PyObject *line)
{
    PyObject *obj = PyObject_CallOneArg(orjson_loads, body);
    if (!obj) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* orjson.JSONDecodeError */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    PyObject *entry = NULL, *digest = NULL;
    PyObject *ident, *parent, *kind, *ts, *prev, *at_turn;
    if (!PyDict_CheckExact(obj)) {
        goto defer;
    }
    ident = PyDict_GetItemWithError(obj, s_id);
    parent = ident ? PyDict_GetItemWithError(obj, s_parent_id) : NULL;
    kind = parent ? PyDict_GetItemWithError(obj, s_kind) : NULL;
    ts = kind ? PyDict_GetItemWithError(obj, s_ts) : NULL;
    if (!ts || PyErr_Occurred()) {
        goto defer;
    }
    if (!PyUnicode_CheckExact(ident) || PyUnicode_GET_LENGTH(ident) == 0
        || !(parent == Py_None || PyUnicode_CheckExact(parent))
        || !PyUnicode_CheckExact(kind) || PyUnicode_GET_LENGTH(kind) == 0
        || !optional_str(obj, s_prev_hash, &prev) || !optional_str(obj, s_at_turn, &at_turn)
        || !PyUnicode_CheckExact(ts) || !PyUnicode_IS_ASCII(ts)
        || !valid_ts_ascii(PyUnicode_1BYTE_DATA(ts), PyUnicode_GET_LENGTH(ts))) {
        goto defer;
    }
    digest = hex_digest(body, size);
    if (!digest) {
        goto done;
    }
    entry = eager_type->tp_alloc(eager_type, ENTRY_FIELDS);
    if (!entry) {
        goto done;
    }
    PyObject *items[ENTRY_FIELDS] = {line, ident, parent, kind, ts, prev ? prev : Py_None,
                                     at_turn ? at_turn : Py_None, digest, obj};
    for (int i = 0; i < ENTRY_FIELDS; i++) {
        PyTuple_SET_ITEM(entry, i, Py_NewRef(items[i]));
    }
    goto done;
defer:
    if (PyErr_Occurred()) { /* a key's hash or compare failed: orjson's keys are str */
        goto done;
    }
    entry = Py_NewRef(Py_None);
done:
    Py_XDECREF(digest);
    Py_DECREF(obj);
    return entry;
}

static PyObject *receipt_entry(PyObject *body, Py_ssize_t size, PyObject *line);
static PyObject *header_entry(PyObject *body, Py_ssize_t size, PyObject *line);

/* entry()'s work on a checked body: the entry or None (or NULL, an error). The entry
 * is body's first `size` bytes: all of them, or (chained_impl, with a direct digest) a
 * raw line but its newline, which the payload then keeps (JSON whitespace to orjson). */
static PyObject *
entry_impl(PyObject *body, Py_ssize_t size, PyObject *line)
{
    const char *buf = PyBytes_AS_STRING(body);
    int guess = guess_kind(buf, size);
    if (guess == GUESS_RECEIPT) {
        return receipt_entry(body, size, line);
    }
    if (guess == GUESS_HEADER) {
        return header_entry(body, size, line);
    }
    PyObject *found = scan_impl((const u8 *)buf, size);
    if (!found || found == Py_None) {
        return found;
    }
    /* (id, parent_id, kind, ts, prev_hash, at_turn, view); ts a str */
    PyObject *ts = PyTuple_GET_ITEM(found, 3);
    if (!PyUnicode_IS_ASCII(ts)
        || !valid_ts_ascii(PyUnicode_1BYTE_DATA(ts), PyUnicode_GET_LENGTH(ts))) {
        Py_DECREF(found);
        Py_RETURN_NONE;
    }
    PyObject *entry = NULL, *payload = NULL;
    PyObject *digest = hex_digest(body, size);
    if (!digest) {
        goto done;
    }
    payload = new_payload(body, Py_None, PyTuple_GET_ITEM(found, 6), Py_None);
    if (!payload) {
        goto done;
    }
    /* tuple.__new__(LazyEntry, items) without the intermediate tuple (what
     * tuple_subtype_new does) */
    entry = entry_type->tp_alloc(entry_type, ENTRY_FIELDS);
    if (!entry) {
        goto done;
    }
    PyTuple_SET_ITEM(entry, 0, Py_NewRef(line));
    for (int i = 0; i < 6; i++) {
        PyTuple_SET_ITEM(entry, i + 1, Py_NewRef(PyTuple_GET_ITEM(found, i)));
    }
    PyTuple_SET_ITEM(entry, 7, Py_NewRef(digest));
    PyTuple_SET_ITEM(entry, 8, Py_NewRef(payload));
done:
    Py_XDECREF(digest);
    Py_XDECREF(payload);
    Py_DECREF(found);
    return entry;
}

static PyObject *
ckernel_entry(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "entry() wants bytes and a line number");
        return NULL;
    }
    if (!entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "entry() before configure()");
        return NULL;
    }
    return entry_impl(args[0], PyBytes_GET_SIZE(args[0]), args[1]);
}

/* A payload's view slot (a new reference, NULL on an error). */
static inline PyObject *
payload_view(PyObject *payload)
{
    PyObject *slot = payload_slots[2];
    return Py_TYPE(slot)->tp_descr_get(slot, payload, NULL);
}

/* reader._role_in_doubt's first test on an entry entry() made: whether it is other
 * than a message, or a message with the scan's view (only such a message is known to
 * hold no repeated key); a message read whole (an eager entry) has no view. 1, 0, or
 * -1 with an error. */
static int
no_role_in_doubt(PyObject *entry)
{
    if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(entry, 3), "message") != 0) {
        return 1;
    }
    if (!Py_IS_TYPE(entry, entry_type)) {
        return 0;
    }
    PyObject *view = payload_view(PyTuple_GET_ITEM(entry, 8));
    if (!view) {
        return -1;
    }
    int plain = view != Py_None;
    Py_DECREF(view);
    return plain;
}

/* chained()'s answer: raw any bytes, line an int. */
static PyObject *
chained_impl(PyObject *raw, PyObject *line, PyObject *prev)
{
    Py_ssize_t size = PyBytes_GET_SIZE(raw);
    if (!PyBytes_CheckExact(raw) || !PyUnicode_CheckExact(prev) || size < 2
        || PyBytes_AS_STRING(raw)[size - 1] != '\n') {
        Py_RETURN_NONE;
    }
    PyObject *entry;
    if (openssl_sha256) {
        /* The line as read: no copy of it without its newline (the digest reads a prefix) */
        entry = entry_impl(raw, size - 1, line);
    }
    else {
        PyObject *body = PyBytes_FromStringAndSize(PyBytes_AS_STRING(raw), size - 1);
        if (!body) {
            return NULL;
        }
        entry = entry_impl(body, size - 1, line);
        Py_DECREF(body);
    }
    if (!entry || entry == Py_None) {
        return entry;
    }
    PyObject *prev_hash = PyTuple_GET_ITEM(entry, 5);
    int plain = no_role_in_doubt(entry);
    if (plain < 0) {
        Py_DECREF(entry);
        return NULL;
    }
    int chained = plain && PyUnicode_CheckExact(prev_hash)
        ? PyUnicode_Compare(prev_hash, prev) == 0 : 0;
    if (!chained) {
        Py_DECREF(entry);
        Py_RETURN_NONE;
    }
    return entry;
}

/* reader.read_ledger's common line in one call:
 *
 *     chained(raw: bytes, line: int, prev: str) -> LazyEntry | Entry | None
 *
 * `raw` as the file yields it (its newline, if any, not part of the entry), `prev` the
 * previous valid entry's digest. The entry when the line is one entry() reads, chained
 * to `prev` (its prev_hash equal to it) and, if a message, with the scan's view (so no
 * repeated role to look for); else None, and read_ledger takes the line through its
 * general path, which reads it again and decides: the same verdict, entry and findings
 * either way. A blank line, a skipped over-long one (a bytes subclass) and a line
 * without its newline (a torn tail, which read_ledger's own path reports) go there too. */
static PyObject *
ckernel_chained(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "chained() wants bytes, a line number and a digest");
        return NULL;
    }
    if (!entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "chained() before configure()");
        return NULL;
    }
    return chained_impl(args[0], args[1], args[2]);
}

/* reader.lazy_entry(line, id, parent, kind, ts, digest, body, view[, mapper]): the
 * entry a transcript adapter makes of a line its scan read, its payload the stored
 * bytes until a stage reads them. */
static PyObject *
ckernel_lazy(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "lazy() wants line, id, parent, kind, ts, digest, body, view "
                        "and a mapper or not");
        return NULL;
    }
    if (!entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "lazy() before configure()");
        return NULL;
    }
    PyObject *payload = new_payload(args[6], Py_None, args[7], nargs == 9 ? args[8] : Py_None);
    if (!payload) {
        return NULL;
    }
    PyObject *entry = entry_type->tp_alloc(entry_type, ENTRY_FIELDS);
    if (!entry) {
        Py_DECREF(payload);
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        PyTuple_SET_ITEM(entry, i, Py_NewRef(args[i]));
    }
    PyTuple_SET_ITEM(entry, 5, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(entry, 6, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(entry, 7, Py_NewRef(args[5]));
    PyTuple_SET_ITEM(entry, 8, payload);
    return entry;
}

/* ------------------------------------------------------------------------------------ */
/* tree.TreeIndex.add's common case in one call (pipeline/ledger/tree.py, `adder`):
 *
 *     tree_add(by_id, nodes, slow, entry, info=None) -> ()
 *
 * An entry of a known kind other than a header, whose parent came earlier and whose id
 * is new, becomes a Node (made with the type's allocator and its slots' descriptors,
 * as the payloads above) put in `by_id` and at the end of `nodes`, and the answer is
 * add's own `()`; any other entry is `slow(entry, info)`'s, the Python add, which
 * decides and says why. The Node type and the known kinds are given once by
 * configure_tree(). */

#define NODE_SLOTS 6
static const char *node_slot_names[NODE_SLOTS] = {"line", "id", "parent_id", "kind", "info",
                                                  "on_active_chain"};
static PyObject *node_slots[NODE_SLOTS];
static PyTypeObject *node_type = NULL;
static PyObject *known_kinds = NULL;

static PyObject *
ckernel_configure_tree(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyFrozenSet_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure_tree() wants the Node type and the known kinds (a frozenset)");
        return NULL;
    }
    if (slot_descriptors("configure_tree", args[0], node_slot_names, NODE_SLOTS,
                         node_slots) < 0) {
        return NULL;
    }
    Py_XSETREF(node_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(known_kinds, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* tree_add()'s answer: `info` given (with_info) or None. */
static PyObject *
tree_add_impl(PyObject *by_id, PyObject *nodes, PyObject *slow, PyObject *entry,
              PyObject *info, int with_info)
{
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 4) {
        goto slow;
    }
    PyObject *ident = PyTuple_GET_ITEM(entry, 1), *parent = PyTuple_GET_ITEM(entry, 2),
             *kind = PyTuple_GET_ITEM(entry, 3);
    if (!PyUnicode_CheckExact(ident) || !PyUnicode_CheckExact(parent)
        || !PyUnicode_CheckExact(kind) || PyUnicode_CompareWithASCIIString(kind, "header") == 0) {
        goto slow;
    }
    int found = PySet_Contains(known_kinds, kind);
    if (found <= 0) {
        if (found < 0) {
            return NULL;
        }
        goto slow;
    }
    found = PyDict_Contains(by_id, parent);
    if (found <= 0) {
        if (found < 0) {
            return NULL;
        }
        goto slow;
    }
    found = PyDict_Contains(by_id, ident);
    if (found != 0) {
        if (found < 0) {
            return NULL;
        }
        goto slow;
    }
    PyObject *values[NODE_SLOTS] = {PyTuple_GET_ITEM(entry, 0), ident, parent, kind, info,
                                    Py_False};
    PyObject *node = slotted(node_type, node_slots, values, NODE_SLOTS);
    if (!node) {
        return NULL;
    }
    int failed = PyDict_SetItem(by_id, ident, node) < 0 || PyList_Append(nodes, node) < 0;
    Py_DECREF(node);
    if (failed) {
        return NULL;
    }
    return Py_NewRef(empty_args); /* add's `()` */
slow: {
        PyObject *call[2] = {entry, info};
        return PyObject_Vectorcall(slow, call, with_info ? 2 : 1, NULL);
    }
}

static PyObject *
ckernel_tree_add(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 4 && nargs != 5) || !PyDict_CheckExact(args[0])
        || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "tree_add() wants by_id (a dict), nodes (a list), the slow add, an "
                        "entry and its info or not");
        return NULL;
    }
    if (!node_type) {
        PyErr_SetString(PyExc_RuntimeError, "tree_add() before configure_tree()");
        return NULL;
    }
    return tree_add_impl(args[0], args[1], args[2], args[3], nargs == 5 ? args[4] : Py_None,
                         nargs == 5);
}

/* ------------------------------------------------------------------------------------ */
/* The audit's node info of a vak entry: pipeline/audit/session.py's _node_info, in C.
 *
 *     node_info(entry, bad) -> info
 *
 * What the audit keeps of the common entries, made here: a message with the scan's
 * view whose role is "user" (the directive marker or None, as starts_turn says) or
 * "assistant" without meta, or with a meta object whose usage is absent, null or four
 * in-range counts (a Request of its usage, ts and interned model); a receipt read whole
 * whose attempts are objects with readable usages (a Receipt, as _receipt_info makes
 * it); any other kind (None). Everything else (a message read whole or without its
 * view, a lazy receipt, a field of another type, a count out of range: whatever makes a
 * finding) is slow(entry, bad)'s, the Python function, which decides and says why. The
 * Request and Receipt types (made with their allocators and slots' descriptors, as the
 * nodes above), the directive marker, the zero usage and the slow function are given
 * once by configure_info(). */

#define REQUEST_SLOTS 9
static const char *request_slot_names[REQUEST_SLOTS] = {"usage", "ts", "model", "receipt",
                                                        "key", "part", "write_1h", "mirror",
                                                        "speed"};
static PyObject *request_slots[REQUEST_SLOTS];
static PyTypeObject *request_type = NULL;
static PyObject *directive_marker = NULL, *info_slow = NULL, *transcript_slow = NULL;
/* Defined with the Claude Code kernel below; node_info() reads them for transcripts. */
static PyObject *s_request_key, *s_write_1h, *s_mirror, *s_speed;
static PyObject *usage_keys[4], *zero_count = NULL, *zero_usage = NULL;
static PyObject *s_control = NULL, *s_attempts = NULL, *s_winning_attempt = NULL,
                *s_ordinal = NULL, *s_settlement = NULL, *s_provider = NULL,
                *s_purpose = NULL, *s_receipt = NULL;

#define RECEIPT_SLOTS 9
static const char *receipt_slot_names[RECEIPT_SLOTS] = {
    "winning", "billed", "attempts", "failed", "ts", "provider", "model", "purpose",
    "metered"};
static PyObject *receipt_slots[RECEIPT_SLOTS];
static PyTypeObject *receipt_type = NULL;

static PyObject *
ckernel_configure_info(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyType_Check(args[0]) || !PyType_Check(args[1])
        || !PyTuple_CheckExact(args[3]) || !PyCallable_Check(args[4])
        || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "configure_info() wants the Request and Receipt "
                                         "types, the directive marker, the zero usage and "
                                         "the Python node info of a vak entry and of a "
                                         "transcript's");
        return NULL;
    }
    if (slot_descriptors("configure_info", args[0], request_slot_names, REQUEST_SLOTS,
                         request_slots) < 0
        || slot_descriptors("configure_info", args[1], receipt_slot_names, RECEIPT_SLOTS,
                            receipt_slots) < 0) {
        return NULL;
    }
    Py_XSETREF(request_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(receipt_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(directive_marker, Py_NewRef(args[2]));
    Py_XSETREF(zero_usage, Py_NewRef(args[3]));
    Py_XSETREF(info_slow, Py_NewRef(args[4]));
    Py_XSETREF(transcript_slow, Py_NewRef(args[5]));
    Py_RETURN_NONE;
}

/* A token count as usage_of takes it: an int (not a bool) from 0 to 2^63 - 1, or null
 * (read as 0); 1 when it is one, 0 when not (usage_of refuses it: a finding). */
static inline int
count_ok(PyObject *v)
{
    if (v == Py_None) {
        return 1;
    }
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && n >= 0; /* n == -1 with an error cannot happen on an exact int */
}

/* usage_of(raw) of a usage object whose counts all pass: a new tuple; Py_None (new) for
 * an absent or null usage; NULL without an error when usage_of would refuse it (the
 * slow path then says why), NULL with one on a failure. */
static PyObject *
usage_tuple(PyObject *raw)
{
    if (!raw || raw == Py_None) {
        Py_RETURN_NONE;
    }
    if (!PyDict_Check(raw)) {
        return NULL;
    }
    PyObject *t = PyTuple_New(4);
    if (!t) {
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyDict_GetItemWithError(raw, usage_keys[i]);
        if (!v) {
            if (PyErr_Occurred()) {
                Py_DECREF(t);
                return NULL;
            }
            v = zero_count;
        }
        if (!count_ok(v)) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, Py_NewRef(v == Py_None ? zero_count : v));
    }
    return t;
}

/* A slot's value at the offset its member descriptor gives (figures, usage_rows: what
 * the audit made, read without a call; NULL when unset). */
#define SLOT_AT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static inline Py_ssize_t
slot_offset(PyObject *descr)
{
    return ((PyMemberDescrObject *)descr)->d_member->offset;
}

/* Whether u is a usage as usage_of makes it: a tuple of four ints. */
static inline int
is_usage(PyObject *u)
{
    return PyTuple_CheckExact(u) && PyTuple_GET_SIZE(u) == 4
        && PyLong_CheckExact(PyTuple_GET_ITEM(u, 0)) && PyLong_CheckExact(PyTuple_GET_ITEM(u, 1))
        && PyLong_CheckExact(PyTuple_GET_ITEM(u, 2)) && PyLong_CheckExact(PyTuple_GET_ITEM(u, 3));
}

/* *acc = add_usage(*acc, u) (both usages): 0, or -1 with an error. */
static int
add_usage_to(PyObject **acc, PyObject *u)
{
    PyObject *sum = PyTuple_New(4);
    if (!sum) {
        return -1;
    }
    for (int k = 0; k < 4; k++) {
        PyObject *v = PyNumber_Add(PyTuple_GET_ITEM(*acc, k), PyTuple_GET_ITEM(u, k));
        if (!v) {
            Py_DECREF(sum);
            return -1;
        }
        PyTuple_SET_ITEM(sum, k, v);
    }
    Py_SETREF(*acc, sum);
    return 0;
}

static PyObject *
new_request(PyObject *usage, PyObject *ts, PyObject *model, PyObject *key, PyObject *write_1h,
            PyObject *mirror)
{
    PyObject *values[REQUEST_SLOTS] = {usage, ts, model, Py_None, key, Py_False, write_1h,
                                       mirror, Py_None};
    return slotted(request_type, request_slots, values, REQUEST_SLOTS);
}

/* _name(v): an exact string, interned (a new reference); anything else None. */
static PyObject *
interned_name(PyObject *v)
{
    if (v && PyUnicode_CheckExact(v)) {
        Py_INCREF(v);
        PyUnicode_InternInPlace(&v);
        return v;
    }
    return Py_NewRef(Py_None);
}

/* A dict's value at `key`, borrowed, or NULL: absent, or with an error set. */
#define GET(d, key) PyDict_GetItemWithError((d), (key))

/* An attempt with a usage u, into the receipt being made: u added to *billed and its row
 * (ordinal, settlement, u, provider, model, is_win) appended to metered. The four
 * objects given are new references, taken (NULL: one could not be made); 0, or -1. */
static int
meter(PyObject *metered, PyObject **billed, PyObject *u, int is_win, PyObject *ordinal,
      PyObject *settlement, PyObject *provider, PyObject *model)
{
    PyObject *row = ordinal && settlement && provider && model ? PyTuple_New(6) : NULL;
    if (!row) {
        Py_XDECREF(ordinal);
        Py_XDECREF(settlement);
        Py_XDECREF(provider);
        Py_XDECREF(model);
        return -1;
    }
    PyTuple_SET_ITEM(row, 0, ordinal);
    PyTuple_SET_ITEM(row, 1, settlement);
    PyTuple_SET_ITEM(row, 2, Py_NewRef(u));
    PyTuple_SET_ITEM(row, 3, provider);
    PyTuple_SET_ITEM(row, 4, model);
    PyTuple_SET_ITEM(row, 5, PyBool_FromLong(is_win));
    int failed = PyList_Append(metered, row);
    Py_DECREF(row);
    if (failed) {
        return -1;
    }
    if (*billed == zero_usage) {
        Py_SETREF(*billed, Py_NewRef(u));
        return 0;
    }
    return add_usage_to(billed, u);
}

/* The Receipt of its parts: the names (provider, model, purpose) new references, taken
 * (NULL: one could not be made); the rest borrowed. A new reference, NULL on a failure. */
static PyObject *
new_receipt(PyObject *winning, PyObject *billed, Py_ssize_t n, long failed, PyObject *ts,
            PyObject *provider, PyObject *model, PyObject *purpose, PyObject *metered)
{
    PyObject *result = NULL;
    PyObject *count = provider && model && purpose ? PyLong_FromSsize_t(n) : NULL;
    PyObject *nfailed = count ? PyLong_FromLong(failed) : NULL;
    if (nfailed) {
        PyObject *values[RECEIPT_SLOTS] = {winning, billed, count, nfailed, ts, provider, model,
                                           purpose, metered};
        result = slotted(receipt_type, receipt_slots, values, RECEIPT_SLOTS);
    }
    Py_XDECREF(count);
    Py_XDECREF(nfailed);
    Py_XDECREF(provider);
    Py_XDECREF(model);
    Py_XDECREF(purpose);
    return result;
}

/* _receipt_info of a receipt read whole (its data the parsed dict): a new Receipt; NULL
 * without an error where the Python function would make a finding (it then decides),
 * NULL with one on a failure. */
static PyObject *
receipt_info(PyObject *data, PyObject *ts)
{
    PyObject *attempts = GET(data, s_attempts);
    if (PyErr_Occurred() || (attempts && attempts != Py_None && !PyList_CheckExact(attempts))) {
        return NULL;
    }
    PyObject *win = GET(data, s_winning_attempt);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (win == Py_None) {
        win = NULL;
    }
    Py_ssize_t n = attempts && attempts != Py_None ? PyList_GET_SIZE(attempts) : 0;
    PyObject *metered = PyList_New(0);
    if (!metered) {
        return NULL;
    }
    PyObject *billed = Py_NewRef(zero_usage), *winning = Py_NewRef(Py_None), *result = NULL;
    long failed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *att = PyList_GET_ITEM(attempts, i);
        if (!PyDict_CheckExact(att)) {
            goto done;
        }
        PyObject *raw = GET(att, s_usage);
        PyObject *ordinal = raw || !PyErr_Occurred() ? GET(att, s_ordinal) : NULL;
        PyObject *settlement = !PyErr_Occurred() ? GET(att, s_settlement) : NULL;
        if (PyErr_Occurred()) {
            goto done;
        }
        PyObject *u = usage_tuple(raw);
        if (!u) {
            goto done;
        }
        int is_win = 0;
        if (win) {
            is_win = PyObject_RichCompareBool(ordinal ? ordinal : Py_None, win, Py_EQ);
            if (is_win < 0) {
                Py_DECREF(u);
                goto done;
            }
        }
        if (is_win) {
            Py_SETREF(winning, Py_NewRef(u));
            win = NULL;
        }
        if (u != Py_None) {
            PyObject *provider = GET(att, s_provider);
            PyObject *model = !PyErr_Occurred() ? GET(att, s_model) : NULL;
            if (PyErr_Occurred()
                || meter(metered, &billed, u, is_win, Py_NewRef(ordinal ? ordinal : Py_None),
                         interned_name(settlement), interned_name(provider),
                         interned_name(model)) < 0) {
                Py_DECREF(u);
                goto done;
            }
        }
        Py_DECREF(u);
        if (!settlement || !PyUnicode_CheckExact(settlement)
            || PyUnicode_CompareWithASCIIString(settlement, "ok") != 0) {
            failed++;
        }
    }
    {
        PyObject *provider = GET(data, s_provider);
        PyObject *model = !PyErr_Occurred() ? GET(data, s_model) : NULL;
        PyObject *purpose = !PyErr_Occurred() ? GET(data, s_purpose) : NULL;
        if (!PyErr_Occurred()) {
            result = new_receipt(winning, billed, n, failed, ts, interned_name(provider),
                                 interned_name(model), interned_name(purpose), metered);
        }
    }
done:
    Py_DECREF(metered);
    Py_DECREF(billed);
    Py_DECREF(winning);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* A receipt read by the kernel into its node info (docs/audit.md, "Receipts"):
 *
 * entry() reads a receipt line itself, without orjson, where the audit's info is
 * configured (configure_info): the grammar validates the whole line as it validates any
 * other, keeps the envelope and what receipt_info() reads (winning_attempt, provider,
 * model, purpose, and of each attempt its ordinal, settlement, provider, model and the
 * four token counts of its usage), and makes the Receipt receipt_info() would make of
 * the parsed line. The entry is a lazy one (its data parsed by orjson when a later
 * stage reads it); its payload's view is that Receipt, which node_info() returns.
 * Everything else goes to eager_entry(), as before: a line the grammar does not take
 * (orjson decides), a repeated key in the line, an attempt or a usage, more than
 * RECEIPT_ATTEMPTS attempts, an escaped string where a name is read, and every value
 * receipt_info() would not take as it is (attempts other than an array of objects, a
 * usage other than an object of token counts, an ordinal or a winning_attempt other
 * than an integer or null): that function then reads the parsed line, and the Python
 * one says what is wrong. */

#define RECEIPT_ATTEMPTS 16

typedef struct {
    Val usage, ordinal, settlement, provider, model;
    Val counts[4]; /* usage_keys' order */
    int dup;
} Attempt;

typedef struct {
    Line line;
    Val attempts, winning, provider, model, purpose;
    int natt;
    int odd; /* an attempt that is not an object, one too many, a repeated key */
    Attempt att[RECEIPT_ATTEMPTS]; /* set as read: never cleared as a whole */
} ReceiptLine;

static int
usage_member(Cur *c, const Val *key, void *ctx)
{
    Attempt *a = (Attempt *)ctx;
    Val *slot = NULL;
    if (KEY_IS(key, "input_tokens")) {
        slot = &a->counts[0];
    }
    else if (KEY_IS(key, "output_tokens")) {
        slot = &a->counts[1];
    }
    else if (KEY_IS(key, "cache_read_input_tokens")) {
        slot = &a->counts[2];
    }
    else if (KEY_IS(key, "cache_creation_input_tokens")) {
        slot = &a->counts[3];
    }
    Val v;
    return parse_value(c, slot ? slot : &v);
}

static int
attempt_member(Cur *c, const Val *key, void *ctx)
{
    Attempt *a = (Attempt *)ctx;
    Val *slot = NULL;
    switch (key->n) {
    case 5:
        if (KEY_IS(key, "usage")) {
            if (c->p < c->end && *c->p == '{') {
                a->usage.type = T_OBJ; /* its counts start absent (attempt_item) */
                return parse_keyed_object(c, usage_member, a, &a->dup);
            }
            slot = &a->usage;
        }
        else if (KEY_IS(key, "model")) {
            slot = &a->model;
        }
        break;
    case 7:
        if (KEY_IS(key, "ordinal")) {
            slot = &a->ordinal;
        }
        break;
    case 8:
        if (KEY_IS(key, "provider")) {
            slot = &a->provider;
        }
        break;
    case 10:
        if (KEY_IS(key, "settlement")) {
            slot = &a->settlement;
        }
        break;
    }
    Val v;
    return parse_value(c, slot ? slot : &v);
}

/* An attempt: an object (its keys read), or any value (odd: a finding). */
static int
attempt_item(Cur *c, void *ctx)
{
    ReceiptLine *r = (ReceiptLine *)ctx;
    if (c->p < c->end && *c->p == '{' && r->natt < RECEIPT_ATTEMPTS) {
        Attempt *a = &r->att[r->natt++];
        memset(a, 0, sizeof(*a));
        if (parse_keyed_object(c, attempt_member, a, &a->dup)) {
            return -1;
        }
        r->odd |= a->dup;
        return 0;
    }
    r->odd = 1;
    Val v;
    return parse_value(c, &v);
}

static int
receipt_member(Cur *c, const Val *key, void *ctx)
{
    ReceiptLine *r = (ReceiptLine *)ctx;
    Val *slot = NULL;
    switch (key->n) {
    case 5:
        if (KEY_IS(key, "model")) {
            slot = &r->model;
        }
        break;
    case 7:
        if (KEY_IS(key, "purpose")) {
            slot = &r->purpose;
        }
        break;
    case 8:
        if (KEY_IS(key, "attempts")) {
            if (c->p < c->end && *c->p == '[') {
                r->attempts.type = T_ARR;
                r->natt = 0; /* a repeated attempts key: the line's dup anyway */
                return parse_items(c, attempt_item, r);
            }
            slot = &r->attempts;
        }
        else if (KEY_IS(key, "provider")) {
            slot = &r->provider;
        }
        break;
    case 15:
        if (KEY_IS(key, "winning_attempt")) {
            slot = &r->winning;
        }
        break;
    }
    if (slot) {
        return parse_value(c, slot);
    }
    return line_member(c, key, &r->line);
}

/* An integer as JSON writes it (a Val of the grammar, which took at most 18 digits):
 * 1 with *out set, 0 for any other value. */
static int
int_literal(const Val *v, long long *out)
{
    if (v->type != T_OTHER) {
        return 0;
    }
    const u8 *p = v->start, *end = v->stop;
    int neg = p < end && *p == '-';
    p += neg;
    if (p == end) {
        return 0;
    }
    long long n = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') {
            return 0; /* a fraction, an exponent, true, false */
        }
        n = n * 10 + (*p - '0');
    }
    *out = neg ? -n : n;
    return 1;
}

/* _name() of a value: an interned str for an unescaped string, None for any other
 * type (a new reference); NULL with *odd set for an escaped string, NULL alone on an
 * error. */
static PyObject *
name_of(const Val *v, int *odd)
{
    if (v->type != T_STR) {
        return Py_NewRef(Py_None);
    }
    if (v->esc) {
        *odd = 1;
        return NULL;
    }
    PyObject *s = str_of(v);
    if (s) {
        PyUnicode_InternInPlace(&s);
    }
    return s;
}

/* usage_tuple() of an attempt's usage: a new tuple, Py_None (new) when absent or
 * null, NULL with *odd set where usage_of would refuse it (or a count is not an
 * integer literal), NULL alone on an error. */
static PyObject *
usage_of_attempt(const Attempt *a, int *odd)
{
    if (a->usage.type == T_ABSENT || a->usage.type == T_NULL) {
        return Py_NewRef(Py_None);
    }
    if (a->usage.type != T_OBJ) {
        *odd = 1;
        return NULL;
    }
    long long n[4];
    for (int i = 0; i < 4; i++) {
        const Val *v = &a->counts[i];
        if (v->type == T_ABSENT || v->type == T_NULL) {
            n[i] = 0;
        }
        else if (!int_literal(v, &n[i]) || n[i] < 0) {
            *odd = 1;
            return NULL;
        }
    }
    PyObject *t = PyTuple_New(4);
    for (int i = 0; t && i < 4; i++) {
        PyObject *count = PyLong_FromLongLong(n[i]);
        if (!count) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, count);
    }
    return t;
}

/* receipt_info() of a scanned receipt: a new Receipt, NULL with *odd set where it
 * must read the parsed line, NULL alone on an error. */
static PyObject *
receipt_of(const ReceiptLine *r, PyObject *ts, int *odd)
{
    long long win = 0;
    int has_win = 0;
    if (r->winning.type != T_ABSENT && r->winning.type != T_NULL) {
        if (!int_literal(&r->winning, &win)) {
            *odd = 1;
            return NULL;
        }
        has_win = 1;
    }
    if (r->odd || (r->attempts.type != T_ABSENT && r->attempts.type != T_NULL
                   && r->attempts.type != T_ARR)) {
        *odd = 1;
        return NULL;
    }
    Py_ssize_t n = r->attempts.type == T_ARR ? r->natt : 0;
    PyObject *metered = PyList_New(0);
    if (!metered) {
        return NULL;
    }
    PyObject *billed = Py_NewRef(zero_usage), *winning = Py_NewRef(Py_None), *result = NULL;
    long failed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Attempt *a = &r->att[i];
        long long ordinal = 0;
        int has_ordinal = 0;
        if (a->ordinal.type != T_ABSENT && a->ordinal.type != T_NULL) {
            if (!int_literal(&a->ordinal, &ordinal)) {
                *odd = 1;
                goto done;
            }
            has_ordinal = 1;
        }
        if (a->settlement.type == T_STR && a->settlement.esc) {
            *odd = 1;
            goto done;
        }
        PyObject *u = usage_of_attempt(a, odd);
        if (!u) {
            goto done;
        }
        int is_win = has_win && has_ordinal && ordinal == win;
        if (is_win) {
            Py_SETREF(winning, Py_NewRef(u));
            has_win = 0;
        }
        if (u != Py_None
            && meter(metered, &billed, u, is_win,
                     has_ordinal ? PyLong_FromLongLong(ordinal) : Py_NewRef(Py_None),
                     name_of(&a->settlement, odd), name_of(&a->provider, odd),
                     name_of(&a->model, odd)) < 0) {
            Py_DECREF(u);
            goto done;
        }
        Py_DECREF(u);
        if (!STR_IS(&a->settlement, "ok")) {
            failed++;
        }
    }
    {
        PyObject *p = name_of(&r->provider, odd);
        PyObject *m = p ? name_of(&r->model, odd) : NULL;
        PyObject *why = m ? name_of(&r->purpose, odd) : NULL;
        result = new_receipt(winning, billed, n, failed, ts, p, m, why, metered);
    }
done:
    Py_DECREF(metered);
    Py_DECREF(billed);
    Py_DECREF(winning);
    return result;
}

/* Whether a line the grammar took has the envelope scan() takes (envelope_shape_ok),
 * its kind `kind` and a valid timestamp. */
static int
envelope_ok(const Line *l, const char *kind, Py_ssize_t n)
{
    return envelope_shape_ok(l) && l->kind.n == n && memcmp(l->kind.s, kind, n) == 0
        && valid_ts_ascii((const Py_UCS1 *)l->ts.s, l->ts.n);
}

/* The lazy entry of a line read by receipt_entry() or header_entry(): its envelope from
 * l, kind and ts given (borrowed), its payload's view `view` (borrowed). */
static PyObject *
lazy_of_line(PyObject *body, Py_ssize_t size, PyObject *line, const Line *l, PyObject *kind,
             PyObject *ts, PyObject *view)
{
    PyObject *digest = hex_digest(body, size);
    PyObject *payload = digest ? new_payload(body, Py_None, view, Py_None) : NULL;
    if (!payload) {
        Py_XDECREF(digest);
        return NULL;
    }
    PyObject *items[ENTRY_FIELDS] = {
        Py_NewRef(line), str_of(&l->id),
        l->parent.type == T_STR ? str_of(&l->parent) : Py_NewRef(Py_None), Py_NewRef(kind),
        Py_NewRef(ts), l->prev.type == T_STR ? str_of(&l->prev) : Py_NewRef(Py_None),
        l->at_turn.type == T_STR ? str_of(&l->at_turn) : Py_NewRef(Py_None), digest, payload};
    int made = 1;
    for (int i = 0; i < ENTRY_FIELDS; i++) {
        made = made && items[i];
    }
    PyObject *entry = made ? entry_type->tp_alloc(entry_type, ENTRY_FIELDS) : NULL;
    for (int i = 0; i < ENTRY_FIELDS; i++) {
        if (entry) {
            PyTuple_SET_ITEM(entry, i, items[i]); /* each a new reference, stolen */
        }
        else {
            Py_XDECREF(items[i]);
        }
    }
    return entry;
}

/* entry()'s work on a receipt line (see above): the lazy entry with its Receipt, or
 * eager_entry()'s answer. */
static PyObject *
receipt_entry(PyObject *body, Py_ssize_t size, PyObject *line)
{
    const u8 *buf = (const u8 *)PyBytes_AS_STRING(body);
    if (!receipt_type || !object_alone(buf, size)) {
        return eager_entry(body, size, line);
    }
    Msg msg;
    msg_init(&msg);
    ReceiptLine receipt;
    ReceiptLine *r = &receipt;
    memset(r, 0, offsetof(ReceiptLine, att));
    r->line.msg = &msg;
    Cur c = {buf, buf + size, 0};
    int dup = 0, odd = 0;
    PyObject *entry = NULL, *ts = NULL, *info = NULL;
    int ok = parse_keyed_object(&c, receipt_member, r, &dup) == 0 && c.p == c.end && !dup;
    if (PyErr_Occurred()) {
        goto done;
    }
    if (!ok || !envelope_ok(&r->line, "receipt", 7)) {
        goto eager;
    }
    ts = str_of(&r->line.ts);
    info = ts ? receipt_of(r, ts, &odd) : NULL;
    if (!info) {
        if (odd && !PyErr_Occurred()) {
            goto eager;
        }
        goto done;
    }
    entry = lazy_of_line(body, size, line, &r->line, s_receipt, ts, info);
    goto done;
eager:
    Py_XDECREF(ts);
    msg_free(&msg);
    return eager_entry(body, size, line);
done:
    Py_XDECREF(ts);
    Py_XDECREF(info);
    msg_free(&msg);
    return entry;
}

/* ------------------------------------------------------------------------------------ */
/* A header read by the kernel into what the audit reads of it (docs/audit.md,
 * "Headers"): header_entry() validates the whole line with the grammar and keeps the
 * envelope, session_id, cwd, and contract.model, contract.provider and
 * contract.app_version; the entry is a lazy one whose payload's view is the tuple
 * (session_id, cwd, model, provider, app_version), each an exact str or None, as
 * session.py's _header_fields reads them (a value of another type: None). Everything
 * else goes to eager_entry(), as before: a line the grammar does not take, a repeated
 * key in the line or its contract, an escaped string among the five, a contract other
 * than an object or null (a bad_field finding there). */

typedef struct {
    Line line;
    Val session_id, cwd, contract, model, provider, app_version;
    int contract_dup;
} HeaderLine;

static int
contract_member(Cur *c, const Val *key, void *ctx)
{
    HeaderLine *h = (HeaderLine *)ctx;
    Val *slot = NULL;
    if (KEY_IS(key, "model")) {
        slot = &h->model;
    }
    else if (KEY_IS(key, "provider")) {
        slot = &h->provider;
    }
    else if (KEY_IS(key, "app_version")) {
        slot = &h->app_version;
    }
    Val v;
    return parse_value(c, slot ? slot : &v);
}

static int
header_member(Cur *c, const Val *key, void *ctx)
{
    HeaderLine *h = (HeaderLine *)ctx;
    if (KEY_IS(key, "session_id")) {
        return parse_value(c, &h->session_id);
    }
    if (KEY_IS(key, "cwd")) {
        return parse_value(c, &h->cwd);
    }
    if (KEY_IS(key, "contract")) {
        if (c->p < c->end && *c->p == '{') {
            h->contract.type = T_OBJ; /* its fields start absent (header_entry) */
            return parse_keyed_object(c, contract_member, h, &h->contract_dup);
        }
        return parse_value(c, &h->contract);
    }
    return line_member(c, key, &h->line);
}

/* A field as _header_fields reads it (its text()): an exact str, else None (a new reference);
 * NULL with *odd set for an escaped string, NULL alone on an error. */
static PyObject *
header_text(const Val *v, int *odd)
{
    if (v->type != T_STR) {
        return Py_NewRef(Py_None);
    }
    if (v->esc) {
        *odd = 1;
        return NULL;
    }
    return str_of(v);
}

/* entry()'s work on a header line (see above): the lazy entry with its fields, or
 * eager_entry()'s answer. */
static PyObject *
header_entry(PyObject *body, Py_ssize_t size, PyObject *line)
{
    const u8 *buf = (const u8 *)PyBytes_AS_STRING(body);
    if (!object_alone(buf, size)) {
        return eager_entry(body, size, line);
    }
    Msg msg;
    msg_init(&msg);
    HeaderLine h;
    memset(&h, 0, sizeof(h));
    h.line.msg = &msg;
    Cur c = {buf, buf + size, 0};
    int dup = 0, odd = 0;
    PyObject *entry = NULL, *ts = NULL, *kind = NULL, *view = NULL;
    int ok = parse_keyed_object(&c, header_member, &h, &dup) == 0 && c.p == c.end && !dup;
    if (PyErr_Occurred()) {
        goto done;
    }
    if (!ok || h.contract_dup || !envelope_ok(&h.line, "header", 6)
        || (h.contract.type != T_ABSENT && h.contract.type != T_NULL
            && h.contract.type != T_OBJ)) {
        goto eager;
    }
    int in_contract = h.contract.type == T_OBJ;
    PyObject *fields[5] = {
        header_text(&h.session_id, &odd), header_text(&h.cwd, &odd),
        in_contract ? header_text(&h.model, &odd) : Py_NewRef(Py_None),
        in_contract ? header_text(&h.provider, &odd) : Py_NewRef(Py_None),
        in_contract ? header_text(&h.app_version, &odd) : Py_NewRef(Py_None)};
    if (fields[0] && fields[1] && fields[2] && fields[3] && fields[4]) {
        view = PyTuple_Pack(5, fields[0], fields[1], fields[2], fields[3], fields[4]);
    }
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(fields[i]);
    }
    if (!view) {
        if (odd && !PyErr_Occurred()) {
            goto eager;
        }
        goto done;
    }
    ts = str_of(&h.line.ts);
    kind = ts ? str_of(&h.line.kind) : NULL;
    if (kind) {
        entry = lazy_of_line(body, size, line, &h.line, kind, ts, view);
    }
    goto done;
eager:
    msg_free(&msg);
    return eager_entry(body, size, line);
done:
    Py_XDECREF(ts);
    Py_XDECREF(kind);
    Py_XDECREF(view);
    msg_free(&msg);
    return entry;
}

/* starts_turn(message, meta) of a user message's view: 1, 0, or -1 on an error. */
static int
view_starts_turn(PyObject *message, PyObject *meta)
{
    if (meta && PyDict_Check(meta)) {
        PyObject *control = PyDict_GetItemWithError(meta, s_control);
        if (control) {
            int truth = PyObject_IsTrue(control);
            if (truth != 0) {
                return truth < 0 ? -1 : 0;
            }
        }
        else if (PyErr_Occurred()) {
            return -1;
        }
    }
    PyObject *blocks = PyDict_GetItemWithError(message, s_content);
    if (!blocks || !PyList_Check(blocks)) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int text = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        PyObject *block = PyList_GET_ITEM(blocks, i);
        if (!PyDict_Check(block)) {
            continue;
        }
        PyObject *kind = PyDict_GetItemWithError(block, s_type);
        if (!kind) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        if (PyUnicode_CheckExact(kind)) {
            if (PyUnicode_CompareWithASCIIString(kind, "tool_result") == 0) {
                return 0;
            }
            text = text || PyUnicode_CompareWithASCIIString(kind, "text") == 0;
        }
    }
    return text;
}

/* A transcript request's key (an exact string, else None), a new reference: the previous
 * request's own string when the two are equal. A request streamed over several lines
 * (docs/formats.md) has them one after another: they share one string, as interning
 * would make them share, without a look-up and an insertion in the interpreter's table
 * of interned strings for every key (each new, and dropped with its session): 1.4% of a
 * Claude Code task. Holds one string between calls. */
static PyObject *
request_key(PyObject *key)
{
    static PyObject *previous = NULL;
    if (!key || !PyUnicode_CheckExact(key)) {
        return Py_NewRef(Py_None);
    }
    if (previous && PyUnicode_Compare(previous, key) == 0) {
        return Py_NewRef(previous);
    }
    Py_XSETREF(previous, Py_NewRef(key));
    return Py_NewRef(key);
}

/* node_info(entry, bad), or with `transcript` transcript_info(entry, bad): the same, and
 * a request's meta.request_key, meta.write_1h and meta.mirror as _transcript_info_py reads
 * them (the key as request_key() shares it, the mirror interned, a token count; else
 * None); every other entry (a request's meta with a speed among them) is the slow
 * function's. */
static PyObject *
node_info_impl(PyObject *const *args, Py_ssize_t nargs, int transcript)
{
    const char *name = transcript ? "transcript_info" : "node_info";
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() wants an entry and the findings list", name);
        return NULL;
    }
    if (!request_type || !payload_type) {
        PyErr_Format(PyExc_RuntimeError, "%s() before configure() and configure_info()", name);
        return NULL;
    }
    PyObject *entry = args[0];
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 9) {
        goto slow;
    }
    PyObject *kind = PyTuple_GET_ITEM(entry, 3);
    if (!PyUnicode_CheckExact(kind)) {
        goto slow;
    }
    if (PyUnicode_CompareWithASCIIString(kind, "message") != 0) {
        if (PyUnicode_CompareWithASCIIString(kind, "receipt") != 0) {
            Py_RETURN_NONE;
        }
        PyObject *data = PyTuple_GET_ITEM(entry, 8);
        if (Py_IS_TYPE(data, (PyTypeObject *)payload_type)) {
            /* a receipt entry() read: its Receipt (receipt_entry), else parsed there */
            PyObject *view = payload_view(data);
            if (!view || Py_IS_TYPE(view, receipt_type)) {
                return view;
            }
            Py_DECREF(view);
            goto slow;
        }
        if (!PyDict_CheckExact(data)) {
            goto slow;
        }
        PyObject *info = receipt_info(data, PyTuple_GET_ITEM(entry, 4));
        if (info || PyErr_Occurred()) {
            return info;
        }
        goto slow;
    }
    PyObject *payload = PyTuple_GET_ITEM(entry, 8);
    if (!Py_IS_TYPE(payload, (PyTypeObject *)payload_type)) {
        goto slow; /* read whole: no view */
    }
    PyObject *view = payload_view(payload);
    if (!view) {
        return NULL;
    }
    PyObject *result = NULL;
    if (!PyDict_CheckExact(view)) {
        goto slow_view;
    }
    PyObject *message = PyDict_GetItemWithError(view, s_message);
    PyObject *meta = message ? PyDict_GetItemWithError(view, s_meta) : NULL;
    if (PyErr_Occurred()) {
        goto done;
    }
    if (!message || !PyDict_CheckExact(message)
        || (meta && meta != Py_None && !PyDict_CheckExact(meta))) {
        goto slow_view;
    }
    if (meta == Py_None) {
        meta = NULL;
    }
    PyObject *content = PyDict_GetItemWithError(message, s_content);
    PyObject *role = content ? PyDict_GetItemWithError(message, s_role) : NULL;
    if (PyErr_Occurred()) {
        goto done;
    }
    if (!content || !PyList_CheckExact(content) || !role || !PyUnicode_CheckExact(role)) {
        goto slow_view;
    }
    if (PyUnicode_CompareWithASCIIString(role, "user") == 0) {
        int starts = view_starts_turn(message, meta);
        if (starts >= 0) {
            result = Py_NewRef(starts ? directive_marker : Py_None);
        }
        goto done;
    }
    if (PyUnicode_CompareWithASCIIString(role, "assistant") != 0) {
        goto slow_view;
    }
    PyObject *ts = PyTuple_GET_ITEM(entry, 4);
    if (!meta) {
        result = new_request(Py_None, ts, Py_None, Py_None, Py_None, Py_None);
        goto done;
    }
    PyObject *raw = PyDict_GetItemWithError(meta, s_usage);
    PyObject *model = raw || !PyErr_Occurred() ? PyDict_GetItemWithError(meta, s_model) : NULL;
    PyObject *key = NULL, *hour = NULL, *mirror = NULL;
    if (transcript && !PyErr_Occurred()) {
        key = GET(meta, s_request_key);
        hour = key || !PyErr_Occurred() ? GET(meta, s_write_1h) : NULL;
        mirror = hour || !PyErr_Occurred() ? GET(meta, s_mirror) : NULL;
        /* a speed other than the standard (rare): the Python function reads it */
        if (!PyErr_Occurred() && GET(meta, s_speed)) {
            goto slow_view;
        }
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    PyObject *usage = usage_tuple(raw);
    if (!usage) {
        if (PyErr_Occurred()) {
            goto done;
        }
        goto slow_view;
    }
    model = interned_name(model);
    key = request_key(key);
    mirror = interned_name(mirror);
    /* token_count(): an int from 0 to 2^63 - 1 (not a bool), else None */
    hour = hour && hour != Py_None && count_ok(hour) ? hour : Py_None;
    result = new_request(usage, ts, model, key, hour, mirror);
    Py_DECREF(usage);
    Py_DECREF(model);
    Py_DECREF(key);
    Py_DECREF(mirror);
done:
    Py_DECREF(view);
    return result;
slow_view:
    Py_DECREF(view);
slow:
    return PyObject_Vectorcall(transcript ? transcript_slow : info_slow, args, nargs, NULL);
}

static PyObject *
ckernel_node_info(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return node_info_impl(args, nargs, 0);
}

static PyObject *
ckernel_transcript_info(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return node_info_impl(args, nargs, 1);
}

/* ------------------------------------------------------------------------------------ */
/* A session's figures and active chain in one call: pipeline/audit/session.py's
 * _figures and the active chain's lines and ids, over the tree's nodes.
 *
 *     figures(nodes, by_id) -> (turns, requests, requests_abandoned, attempts, failed,
 *                               usage, usage_abandoned, billed, chain_lines, chain_ids)
 *                              | None
 *
 * Two passes, as _figures makes them: the receipts first (their billed usage, attempts
 * and failures summed; each receipt with a winning usage tied to the request it
 * follows, when that request has none yet: _owner), then the requests (counted on the
 * active chain or off it, but a streamed request's parts and a subagent's mirrored
 * requests; their usage, else their receipt's winning one, summed) and the active
 * chain's prompts (turns); the active chain's nodes' lines and ids in node order on the
 * way. None whenever a node, an info or a usage is not what the audit makes (a node of
 * another type, a chain mark or a part flag that is not a bool, a usage that is not
 * four ints: so no Python code runs while the nodes are walked): the
 * caller then runs _figures, which decides (a receipt tied here is tied there the same
 * way, so that is the same either way). The slots are read at the offsets their
 * descriptors give (configure_tree, configure_info). */

static PyObject *s_empty = NULL; /* "" */

/* _owner(tree, node) of a receipt's node: the node by_id holds under its parent_id
 * (by_id.get(parent_id or "")), in *owner (borrowed) when that node's info is a Request
 * (exactly), else NULL. 0; 1 where a value is not what the audit makes (the caller
 * defers); -1 with an error. */
static int
receipt_owner(PyObject *node, PyObject *by_id, PyObject **owner)
{
    Py_ssize_t n_parent = slot_offset(node_slots[2]), n_info = slot_offset(node_slots[4]);
    PyObject *parent_id = SLOT_AT(node, n_parent);
    *owner = NULL;
    if (!parent_id || (parent_id != Py_None && !PyUnicode_CheckExact(parent_id))) {
        return 1;
    }
    PyObject *found = PyDict_GetItemWithError(by_id, parent_id == Py_None ? s_empty : parent_id);
    if (!found) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!Py_IS_TYPE(found, node_type) || !SLOT_AT(found, n_info)) {
        return 1;
    }
    if (Py_IS_TYPE(SLOT_AT(found, n_info), request_type)) {
        *owner = found;
    }
    return 0;
}

static PyObject *
ckernel_figures(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "figures() wants the nodes (a list) and by_id (a dict)");
        return NULL;
    }
    if (!node_type || !request_type || !receipt_type) {
        PyErr_SetString(PyExc_RuntimeError, "figures() before configure_tree() and "
                                            "configure_info()");
        return NULL;
    }
    PyObject *nodes = args[0], *by_id = args[1];
    /* node: line, id, parent_id, kind, info, on_active_chain */
    Py_ssize_t n_line = slot_offset(node_slots[0]), n_id = slot_offset(node_slots[1]),
               n_info = slot_offset(node_slots[4]), n_active = slot_offset(node_slots[5]);
    /* request: usage, ts, model, receipt, key, part, write_1h, mirror */
    Py_ssize_t q_usage = slot_offset(request_slots[0]), q_receipt = slot_offset(request_slots[3]),
               q_part = slot_offset(request_slots[5]), q_mirror = slot_offset(request_slots[7]);
    /* receipt: winning, billed, attempts, failed, ... */
    Py_ssize_t r_winning = slot_offset(receipt_slots[0]), r_billed = slot_offset(receipt_slots[1]),
               r_attempts = slot_offset(receipt_slots[2]), r_failed = slot_offset(receipt_slots[3]);
    PyObject *billed = Py_NewRef(zero_usage), *usage[2] = {Py_NewRef(zero_usage),
                                                           Py_NewRef(zero_usage)};
    PyObject *chain_lines = PyList_New(0), *chain_ids = PyList_New(0), *result = NULL;
    long long attempts = 0, failed = 0, turns = 0, requests[2] = {0, 0};
    if (!chain_lines || !chain_ids) {
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    for (Py_ssize_t i = 0; i < count; i++) { /* the receipts */
        PyObject *node = PyList_GET_ITEM(nodes, i);
        if (!Py_IS_TYPE(node, node_type)) {
            goto defer;
        }
        PyObject *info = SLOT_AT(node, n_info);
        if (!info || !PyObject_TypeCheck(info, receipt_type)) {
            continue;
        }
        PyObject *winning = SLOT_AT(info, r_winning), *paid = SLOT_AT(info, r_billed),
                 *tries = SLOT_AT(info, r_attempts), *lost = SLOT_AT(info, r_failed);
        if (!winning || !paid || !tries || !lost || !is_usage(paid)
            || !PyLong_CheckExact(tries) || !PyLong_CheckExact(lost)) {
            goto defer;
        }
        int o1 = 0, o2 = 0;
        long long t = PyLong_AsLongLongAndOverflow(tries, &o1);
        long long f = PyLong_AsLongLongAndOverflow(lost, &o2);
        if (o1 || o2 || t < 0 || f < 0 || t > (1LL << 40) || f > (1LL << 40)) {
            goto defer;
        }
        if (add_usage_to(&billed, paid) < 0) {
            goto done;
        }
        attempts += t;
        failed += f;
        if (winning == Py_None) {
            continue;
        }
        /* its owner (a Request) takes its first receipt with a winning usage */
        PyObject *owner;
        int odd = receipt_owner(node, by_id, &owner);
        if (odd) {
            if (odd < 0) {
                goto done;
            }
            goto defer;
        }
        if (owner) {
            PyObject **slot = &SLOT_AT(SLOT_AT(owner, n_info), q_receipt);
            if (*slot == Py_None) {
                Py_SETREF(*slot, Py_NewRef(info));
            }
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) { /* the requests, the prompts, the chain */
        PyObject *node = PyList_GET_ITEM(nodes, i);
        PyObject *info = SLOT_AT(node, n_info), *mark = SLOT_AT(node, n_active);
        if (!info || (mark != Py_True && mark != Py_False)) {
            goto defer;
        }
        int active = mark == Py_True;
        if (active) {
            PyObject *line = SLOT_AT(node, n_line), *ident = SLOT_AT(node, n_id);
            if (!line || !ident || PyList_Append(chain_lines, line) < 0
                || PyList_Append(chain_ids, ident) < 0) {
                if (!PyErr_Occurred()) {
                    goto defer;
                }
                goto done;
            }
        }
        if (PyObject_TypeCheck(info, request_type)) {
            PyObject *part = SLOT_AT(info, q_part), *mirror = SLOT_AT(info, q_mirror),
                     *u = SLOT_AT(info, q_usage), *receipt = SLOT_AT(info, q_receipt);
            /* part a bool, as the audit makes it: no Python code runs in this walk */
            if (!mirror || !u || !receipt || (part != Py_True && part != Py_False)) {
                goto defer;
            }
            if (part == Py_True || mirror != Py_None) {
                continue;
            }
            requests[active]++;
            if (u == Py_None && receipt != Py_None) {
                if (!PyObject_TypeCheck(receipt, receipt_type)) {
                    goto defer;
                }
                u = SLOT_AT(receipt, r_winning);
                if (!u) {
                    goto defer;
                }
            }
            if (u != Py_None) {
                if (!is_usage(u)) {
                    goto defer;
                }
                if (add_usage_to(&usage[active], u) < 0) {
                    goto done;
                }
            }
        }
        else if (info == directive_marker && active) {
            turns++;
        }
    }
    PyObject *lines_t = PyList_AsTuple(chain_lines), *ids_t = lines_t ? PyList_AsTuple(chain_ids)
                                                                      : NULL;
    if (lines_t && ids_t) {
        result = Py_BuildValue("(LLLLLOOONN)", turns, requests[1], requests[0], attempts,
                               failed, usage[1], usage[0], billed, lines_t, ids_t);
    }
    else {
        Py_XDECREF(lines_t);
    }
    goto done;
defer:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(chain_lines);
    Py_XDECREF(chain_ids);
    Py_DECREF(billed);
    Py_DECREF(usage[0]);
    Py_DECREF(usage[1]);
    return result;
}

/* A session's usage rows in one call: pipeline/audit/session.py's _usage_rows.
 *
 *     usage_rows(nodes, by_id, provider, model, subagent) -> list | None
 *
 * One row (USAGE_FIELDS' 21 values) per request with a usage and per metered attempt
 * of a receipt, the same tuples of the same objects as the Python's, after figures()
 * (or _figures) tied the receipts; provider and model the header's (None for none).
 * None whenever a value is not what the audit makes (an info's text that is not a str,
 * a flag that is not a bool, an attempt that is not its six-tuple with a usage of four
 * ints): the caller then runs _usage_rows, which decides. No Python code runs on the
 * way (only exact types are read). */

static PyObject *s_mirror = NULL, *s_attempt = NULL, *s_abandoned = NULL, *s_retry = NULL;

/* `a or b` of two values that are each None or a str: no Python code. */
static inline PyObject *
or_text(PyObject *a, PyObject *b)
{
    return a != Py_None && PyUnicode_GET_LENGTH(a) > 0 ? a : b;
}

static inline int
text_or_none(PyObject *v)
{
    return v && (v == Py_None || PyUnicode_CheckExact(v));
}

static PyObject *
ckernel_usage_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "usage_rows() wants the nodes (a list), by_id (a "
                                         "dict), the provider, the model and the subagent");
        return NULL;
    }
    if (!node_type || !request_type || !receipt_type) {
        PyErr_SetString(PyExc_RuntimeError, "usage_rows() before configure_tree() and "
                                            "configure_info()");
        return NULL;
    }
    PyObject *nodes = args[0], *by_id = args[1], *provider = args[2], *model = args[3],
             *subagent = args[4];
    if (!text_or_none(provider) || !text_or_none(model) || !text_or_none(subagent)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n_id = slot_offset(node_slots[1]), n_info = slot_offset(node_slots[4]),
               n_active = slot_offset(node_slots[5]);
    /* request: usage, ts, model, receipt, key, part, write_1h, mirror, speed */
    Py_ssize_t q_usage = slot_offset(request_slots[0]), q_ts = slot_offset(request_slots[1]),
               q_model = slot_offset(request_slots[2]), q_receipt = slot_offset(request_slots[3]),
               q_key = slot_offset(request_slots[4]), q_write_1h = slot_offset(request_slots[6]),
               q_mirror = slot_offset(request_slots[7]), q_speed = slot_offset(request_slots[8]);
    /* receipt: winning, billed, attempts, failed, ts, provider, model, purpose, metered */
    Py_ssize_t r_ts = slot_offset(receipt_slots[4]), r_provider = slot_offset(receipt_slots[5]),
               r_model = slot_offset(receipt_slots[6]), r_purpose = slot_offset(receipt_slots[7]),
               r_metered = slot_offset(receipt_slots[8]);
    PyObject *rows = PyList_New(0);
    if (!rows) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        if (!Py_IS_TYPE(node, node_type)) {
            goto defer;
        }
        PyObject *info = SLOT_AT(node, n_info), *ident = SLOT_AT(node, n_id),
                 *mark = SLOT_AT(node, n_active);
        if (!info || !ident || (mark != Py_True && mark != Py_False)) {
            goto defer;
        }
        if (Py_IS_TYPE(info, request_type)) {
            PyObject *u = SLOT_AT(info, q_usage);
            if (u == Py_None) {
                continue;
            }
            PyObject *ts = SLOT_AT(info, q_ts), *own_model = SLOT_AT(info, q_model),
                     *receipt = SLOT_AT(info, q_receipt), *key = SLOT_AT(info, q_key),
                     *write_1h = SLOT_AT(info, q_write_1h), *mirror = SLOT_AT(info, q_mirror),
                     *speed = SLOT_AT(info, q_speed);
            if (!u || !is_usage(u) || !ts || !receipt || !write_1h || !text_or_none(key)
                || !text_or_none(own_model) || !text_or_none(mirror) || !text_or_none(speed)) {
                goto defer;
            }
            PyObject *active = mark == Py_True || mirror != Py_None ? Py_True : Py_False;
            int billed = receipt == Py_None;
            PyObject *row = PyTuple_Pack(
                21, ident, or_text(key, ident), mirror == Py_None ? s_message : s_mirror,
                Py_None, Py_None, Py_None, Py_None, ts, provider, or_text(own_model, model),
                active, PyTuple_GET_ITEM(u, 0), PyTuple_GET_ITEM(u, 1), PyTuple_GET_ITEM(u, 2),
                PyTuple_GET_ITEM(u, 3), billed ? Py_True : Py_False,
                billed ? active : Py_False,
                billed && active == Py_False ? s_abandoned : Py_None, write_1h,
                or_text(mirror, subagent), speed);
            if (!row || PyList_Append(rows, row) < 0) {
                Py_XDECREF(row);
                goto fail;
            }
            Py_DECREF(row);
        }
        else if (Py_IS_TYPE(info, receipt_type)) {
            PyObject *metered = SLOT_AT(info, r_metered);
            if (!metered || !PyList_CheckExact(metered)) {
                goto defer;
            }
            if (PyList_GET_SIZE(metered) == 0) {
                continue;
            }
            PyObject *ts = SLOT_AT(info, r_ts), *own_provider = SLOT_AT(info, r_provider),
                     *own_model = SLOT_AT(info, r_model), *purpose = SLOT_AT(info, r_purpose);
            if (!ts || !purpose || !text_or_none(own_provider) || !text_or_none(own_model)) {
                goto defer;
            }
            PyObject *owner;
            int odd = receipt_owner(node, by_id, &owner);
            if (odd) {
                if (odd < 0) {
                    goto fail;
                }
                goto defer;
            }
            PyObject *active = owner ? SLOT_AT(owner, n_active) : mark, *owner_id = Py_None;
            int counts = 1;
            if (owner) {
                owner_id = SLOT_AT(owner, n_id);
                counts = SLOT_AT(SLOT_AT(owner, n_info), q_receipt) == info;
            }
            if (!owner_id || (active != Py_True && active != Py_False)) {
                goto defer;
            }
            PyObject *p = or_text(own_provider, provider), *m = or_text(own_model, model);
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(metered); k++) {
                PyObject *att = PyList_GET_ITEM(metered, k);
                if (!PyTuple_CheckExact(att) || PyTuple_GET_SIZE(att) != 6) {
                    goto defer;
                }
                PyObject *ordinal = PyTuple_GET_ITEM(att, 0), *settlement = PyTuple_GET_ITEM(att, 1),
                         *u = PyTuple_GET_ITEM(att, 2), *a_p = PyTuple_GET_ITEM(att, 3),
                         *a_m = PyTuple_GET_ITEM(att, 4), *win = PyTuple_GET_ITEM(att, 5);
                if (!is_usage(u) || !text_or_none(a_p) || !text_or_none(a_m)
                    || (win != Py_True && win != Py_False)) {
                    goto defer;
                }
                PyObject *shown = Py_None;
                if (PyLong_CheckExact(ordinal)) {
                    int overflow = 0;
                    long long v = PyLong_AsLongLongAndOverflow(ordinal, &overflow);
                    if (!overflow && v >= 0 && v < (1LL << 31)) {
                        shown = ordinal;
                    }
                }
                /* win and counts and active; None if effective, else abandoned or retry */
                PyObject *effective = win == Py_False ? Py_False
                                      : !counts       ? Py_False : active;
                PyObject *waste = effective == Py_True ? Py_None
                                  : win == Py_True && counts ? s_abandoned : s_retry;
                PyObject *row = PyTuple_Pack(
                    21, ident, owner ? owner_id : Py_None, s_attempt, purpose, shown, settlement,
                    win, ts, or_text(a_p, p), or_text(a_m, m), active, PyTuple_GET_ITEM(u, 0),
                    PyTuple_GET_ITEM(u, 1), PyTuple_GET_ITEM(u, 2), PyTuple_GET_ITEM(u, 3),
                    Py_True, effective, waste, Py_None, subagent, Py_None);
                if (!row || PyList_Append(rows, row) < 0) {
                    Py_XDECREF(row);
                    goto fail;
                }
                Py_DECREF(row);
            }
        }
    }
    return rows;
defer:
    Py_DECREF(rows);
    Py_RETURN_NONE;
fail:
    Py_DECREF(rows);
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* The audit's common lines in one loop: read_ledger's common line, the node's info and
 * the tree's add, for as many lines as follow one another that way.
 *
 *     pushback(lines) -> Lines
 *     run(by_id, nodes, slow_add, info, findings, last, lines, number, prev)
 *         -> (taken, nbytes, prev)
 *
 * Lines iterates `lines` and gives back first a line pushed back into it. run() takes
 * the lines that follow line `number` from it while each is a common line (chained()'s
 * entry, chained to the one before, starting from `prev`) of a kind other than a
 * header: each entry's info is info(entry, findings), its node tree_add()'s (slow_add
 * the Python add, whose findings are appended to `findings`), and last[0] the last
 * entry taken. The first line it does not take is pushed back, for read_ledger's own
 * loop, which reads it as before. The answer counts the lines taken and their bytes,
 * and gives the last digest. */

typedef struct {
    PyObject_HEAD
    PyObject *it;
    PyObject *pushed;
} LinesObject;

static int
lines_traverse(LinesObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->it);
    Py_VISIT(self->pushed);
    return 0;
}

static int
lines_clear(LinesObject *self)
{
    Py_CLEAR(self->it);
    Py_CLEAR(self->pushed);
    return 0;
}

static void
lines_dealloc(LinesObject *self)
{
    PyObject_GC_UnTrack(self);
    lines_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
lines_next(LinesObject *self)
{
    if (self->pushed) {
        PyObject *line = self->pushed;
        self->pushed = NULL;
        return line;
    }
    return PyIter_Next(self->it);
}

static PyTypeObject LinesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.ledger._ckernel.Lines",
    .tp_basicsize = sizeof(LinesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A file's lines with one line pushed back (run()'s first line not taken).",
    .tp_traverse = (traverseproc)lines_traverse,
    .tp_clear = (inquiry)lines_clear,
    .tp_dealloc = (destructor)lines_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)lines_next,
};

static PyObject *
ckernel_pushback(PyObject *Py_UNUSED(module), PyObject *lines)
{
    PyObject *it = PyObject_GetIter(lines);
    if (!it) {
        return NULL;
    }
    LinesObject *self = PyObject_GC_New(LinesObject, &LinesType);
    if (!self) {
        Py_DECREF(it);
        return NULL;
    }
    self->it = it;
    self->pushed = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ------------------------------------------------------------------------------------ */
/* A binary file's physical lines under the line limit (pipeline/io/storage.py,
 * guarded_lines; docs/scaling.md, "Receipts and headers without orjson, the line
 * guard in C"):
 *
 *     guarded(readline, limit, tap, oversize) -> Guarded
 *
 * iterates readline(limit + 1) until it gives b"": a line of at most `limit` bytes, or
 * with its newline within limit + 1, is given to tap (unless tap is None) and yielded;
 * a longer one is handed to oversize(line), whose answer (the marker that stands for
 * the line, once it has read and tapped the rest) is yielded in its place. The same
 * lines, the same bytes tapped in the same order, as the generator it stands for, with
 * no Python frame per line. */

typedef struct {
    PyObject_HEAD
    PyObject *readline;
    PyObject *request; /* limit + 1, an int */
    PyObject *tap;     /* NULL: none */
    PyObject *oversize;
    Py_ssize_t limit;
    int done;
} GuardedObject;

static int
guarded_traverse(GuardedObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->readline);
    Py_VISIT(self->request);
    Py_VISIT(self->tap);
    Py_VISIT(self->oversize);
    return 0;
}

static int
guarded_clear(GuardedObject *self)
{
    Py_CLEAR(self->readline);
    Py_CLEAR(self->request);
    Py_CLEAR(self->tap);
    Py_CLEAR(self->oversize);
    return 0;
}

static void
guarded_dealloc(GuardedObject *self)
{
    PyObject_GC_UnTrack(self);
    guarded_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
guarded_next(GuardedObject *self)
{
    if (self->done) {
        return NULL;
    }
    PyObject *line = PyObject_CallOneArg(self->readline, self->request);
    if (!line) {
        return NULL;
    }
    if (!PyBytes_Check(line)) {
        PyErr_Format(PyExc_TypeError, "readline() gave %.100s, not bytes",
                     Py_TYPE(line)->tp_name);
        Py_DECREF(line);
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(line);
    if (n == 0) {
        Py_DECREF(line);
        self->done = 1;
        return NULL;
    }
    if (n > self->limit && PyBytes_AS_STRING(line)[n - 1] != '\n') {
        PyObject *marker = PyObject_CallOneArg(self->oversize, line);
        Py_DECREF(line);
        return marker;
    }
    if (self->tap) {
        PyObject *seen = PyObject_CallOneArg(self->tap, line);
        if (!seen) {
            Py_DECREF(line);
            return NULL;
        }
        Py_DECREF(seen);
    }
    return line;
}

static PyTypeObject GuardedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline.ledger._ckernel.Guarded",
    .tp_basicsize = sizeof(GuardedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A binary file's physical lines under the line limit (guarded()).",
    .tp_traverse = (traverseproc)guarded_traverse,
    .tp_clear = (inquiry)guarded_clear,
    .tp_dealloc = (destructor)guarded_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)guarded_next,
};

static PyObject *
ckernel_guarded(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t limit = nargs == 4 && PyLong_CheckExact(args[1])
                           ? PyLong_AsSsize_t(args[1]) : -1;
    if (limit < 0 || limit == PY_SSIZE_T_MAX || !PyCallable_Check(args[0])
        || !(args[2] == Py_None || PyCallable_Check(args[2])) || !PyCallable_Check(args[3])) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "guarded() wants readline, a limit (an int from "
                                             "0), tap (or None) and oversize");
        }
        return NULL;
    }
    PyObject *request = PyLong_FromSsize_t(limit + 1);
    if (!request) {
        return NULL;
    }
    GuardedObject *self = PyObject_GC_New(GuardedObject, &GuardedType);
    if (!self) {
        Py_DECREF(request);
        return NULL;
    }
    self->readline = Py_NewRef(args[0]);
    self->request = request;
    self->tap = args[2] == Py_None ? NULL : Py_NewRef(args[2]);
    self->oversize = Py_NewRef(args[3]);
    self->limit = limit;
    self->done = 0;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
ckernel_run(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || !PyList_CheckExact(args[4]) || !PyList_CheckExact(args[5])
        || PyList_GET_SIZE(args[5]) != 1 || !Py_IS_TYPE(args[6], &LinesType)
        || !PyLong_Check(args[7]) || !PyUnicode_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "run() wants by_id, nodes, the slow add, the info, the findings, "
                        "[last], pushback lines, a line number and a digest");
        return NULL;
    }
    if (!entry_type || !node_type) {
        PyErr_SetString(PyExc_RuntimeError, "run() before configure() and configure_tree()");
        return NULL;
    }
    PyObject *by_id = args[0], *nodes = args[1], *slow = args[2], *info_fn = args[3];
    PyObject *findings = args[4], *last = args[5];
    LinesObject *lines = (LinesObject *)args[6];
    long long number = PyLong_AsLongLong(args[7]);
    if (number == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *prev = Py_NewRef(args[8]);
    long long taken = 0, nbytes = 0;
    for (;;) {
        PyObject *raw = lines_next(lines);
        if (!raw) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            break;
        }
        PyObject *line = PyLong_FromLongLong(number + taken + 1);
        PyObject *entry = line ? chained_impl(raw, line, prev) : NULL;
        Py_XDECREF(line);
        if (!entry) {
            Py_DECREF(raw);
            goto fail;
        }
        if (entry == Py_None
            || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(entry, 3), "header") == 0) {
            Py_DECREF(entry);
            lines->pushed = raw; /* read_ledger's loop reads it next */
            break;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(raw);
        Py_DECREF(raw);
        PyObject *call[2] = {entry, findings};
        PyObject *info = PyObject_Vectorcall(info_fn, call, 2, NULL);
        PyObject *found = info ? tree_add_impl(by_id, nodes, slow, entry, info, 1) : NULL;
        Py_XDECREF(info);
        if (!found) {
            Py_DECREF(entry);
            goto fail;
        }
        int failed = PyObject_IsTrue(found);
        if (failed > 0) { /* the slow add's findings, appended */
            failed = PyList_SetSlice(findings, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, found);
        }
        Py_DECREF(found);
        if (failed) {
            Py_DECREF(entry);
            goto fail;
        }
        Py_SETREF(prev, Py_NewRef(PyTuple_GET_ITEM(entry, 7)));
        PyList_SetItem(last, 0, entry); /* steals the reference */
        taken++;
        nbytes += size;
    }
    PyObject *answer = Py_BuildValue("(LLN)", taken, nbytes, prev);
    return answer;
fail:
    Py_DECREF(prev);
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* A Claude Code transcript's activity lines in one loop (pipeline/formats/claude_code.py,
 * ClaudeCode.read; docs/formats.md, "Activity lines in one loop"):
 *
 *     activity_run(seen, batch, lines, number) -> (taken, nbytes)
 *
 * takes the lines that follow line `number` from `lines` (pushback()'s) while each is
 * one the adapter would read through scan_transcript() into an activity entry without
 * looking at anything but its uuid, parentUuid and timestamp: a whole line (with its
 * newline; not an OversizeLine) that scan_transcript() reads (none of its plain values
 * deferred), of type "progress", with no message, data that is not a subagent's copy
 * (agent_progress), a non-empty uuid and a parentUuid already in `seen` (so neither the
 * logical parent nor the sidechain rule applies), all three unescaped strings (the
 * timestamp may be absent, or any plain value: ""). Each becomes
 * lazy(number, uuid, parentUuid, "activity", timestamp, "", body, None), appended to
 * `batch`, its uuid added to `seen`; the first line not taken is pushed back. Before
 * the adapter has read its first entry (`seen` holds the root alone) nothing is taken:
 * that entry names the session. */

static PyObject *s_activity = NULL;

/* How far into a line activity_run() looks for a progress line's type. */
#define PROGRESS_WITHIN 1024

/* Whether `needle` occurs in buf[0..n): a line without `"type":"progress"` in it is
 * no progress line, told without parsing it (a line written otherwise, with spaces,
 * is only left to the adapter's own loop). */
static inline int
holds(const u8 *buf, Py_ssize_t n, const char *needle, Py_ssize_t m)
{
#ifdef _GNU_SOURCE
    return memmem(buf, (size_t)n, needle, (size_t)m) != NULL;
#else
    for (const u8 *p = buf; n - (p - buf) >= m; p++) {
        p = memchr(p, needle[0], (size_t)(n - (p - buf) - m + 1));
        if (!p) {
            return 0;
        }
        if (memcmp(p, needle, (size_t)m) == 0) {
            return 1;
        }
    }
    return 0;
#endif
}

/* The activity entry of one line (`buf`: without its newline), Py_None when the line is
 * not one activity_run() takes, NULL with an error set. */
static PyObject *
cc_activity(PyObject *seen, const u8 *buf, Py_ssize_t size, long long number)
{
    static const char progress[] = "\"type\":\"progress\"";
    /* Looked for where Claude Code writes it: after the envelope's fields, before `data`
     * (189-303 bytes in on the real transcripts). A user's or an assistant's line, which
     * ends the run, has its type after a message of any length: the look stops here
     * rather than read all of it (2% of a Claude Code task). A progress line whose type
     * is further in (a long cwd) is left to the adapter's loop, which reads it alike. */
    const Py_ssize_t within = size < PROGRESS_WITHIN ? size : PROGRESS_WITHIN;
    if (!object_alone(buf, size) || !holds(buf, within, progress, sizeof(progress) - 1)) {
        Py_RETURN_NONE;
    }
    Msg msg;
    msg_init(&msg);
    CcLine l;
    PyObject *result = NULL, *uuid = NULL, *parent = NULL, *ts = NULL, *body = NULL,
             *line = NULL;
    int ok = cc_parse(buf, size, &l, &msg);
    if (ok < 0) {
        goto done;
    }
    const unsigned needed = (1u << CC_UUID) | (1u << CC_PARENT) | (1u << CC_TYPE);
    const Val *id = &l.scalars[CC_UUID], *up = &l.scalars[CC_PARENT];
    if (!ok || (l.seen & needed) != needed || l.message.type != T_ABSENT
        || !STR_IS(&l.scalars[CC_TYPE], "progress")
        || id->type != T_STR || id->esc || id->n == 0 || up->type != T_STR || up->esc) {
        goto not_taken;
    }
    for (int i = 0; i < l.nscalars; i++) {
        if (!plain_ok(&l.scalars[l.order[i]])) {
            goto not_taken; /* the scan would leave the line to orjson */
        }
    }
    if (l.data.type == T_OBJ
        ? l.data_type.type != T_ABSENT
              && (!plain_ok(&l.data_type) || STR_IS(&l.data_type, "agent_progress"))
        : l.data.type != T_ABSENT && !plain_ok(&l.data)) {
        goto not_taken;
    }
    parent = str_of(up);
    if (!parent) {
        goto done;
    }
    int known = PySet_Contains(seen, parent);
    if (known < 0) {
        goto done;
    }
    if (!known) {
        goto not_taken;
    }
    const Val *t = &l.scalars[CC_TIMESTAMP];
    uuid = str_of(id);
    ts = (l.seen & (1u << CC_TIMESTAMP)) && t->type == T_STR ? str_of(t) : Py_NewRef(s_empty);
    body = PyBytes_FromStringAndSize((const char *)buf, size);
    line = PyLong_FromLongLong(number);
    if (!uuid || !ts || !body || !line) {
        goto done;
    }
    PyObject *args[8] = {line, uuid, parent, s_activity, ts, s_empty, body, Py_None};
    result = ckernel_lazy(NULL, args, 8);
    if (result && PySet_Add(seen, uuid) < 0) {
        Py_CLEAR(result);
    }
    goto done;
not_taken:
    result = Py_NewRef(Py_None);
done:
    msg_free(&msg);
    Py_XDECREF(uuid);
    Py_XDECREF(parent);
    Py_XDECREF(ts);
    Py_XDECREF(body);
    Py_XDECREF(line);
    return result;
}

static PyObject *
ckernel_activity_run(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PySet_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || !Py_IS_TYPE(args[2], &LinesType) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "activity_run() wants seen (a set), batch (a list), pushback lines "
                        "and a line number");
        return NULL;
    }
    if (!entry_type) {
        PyErr_SetString(PyExc_RuntimeError, "activity_run() before configure()");
        return NULL;
    }
    PyObject *seen = args[0], *batch = args[1];
    LinesObject *lines = (LinesObject *)args[2];
    long long number = PyLong_AsLongLong(args[3]);
    if (number == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long taken = 0, nbytes = 0;
    while (PySet_GET_SIZE(seen) >= 2) {
        PyObject *raw = lines_next(lines);
        if (!raw) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            break;
        }
        Py_ssize_t size = PyBytes_CheckExact(raw) ? PyBytes_GET_SIZE(raw) : 0;
        const u8 *buf = (const u8 *)(size ? PyBytes_AS_STRING(raw) : "");
        PyObject *entry = size >= 2 && buf[size - 1] == '\n'
                          ? cc_activity(seen, buf, size - 1, number + taken + 1)
                          : Py_NewRef(Py_None);
        if (entry == Py_None) {
            Py_DECREF(entry);
            lines->pushed = raw; /* the adapter's loop reads it next */
            break;
        }
        int failed = !entry || PyList_Append(batch, entry);
        Py_XDECREF(entry);
        Py_DECREF(raw);
        if (failed) {
            return NULL;
        }
        taken++;
        nbytes += size;
    }
    return Py_BuildValue("(LL)", taken, nbytes);
}

/* ------------------------------------------------------------------------------------ */
/* A Claude Code line's entry kind and data (pipeline/formats/claude_code.py's
 * `_kind_data_py`, which it is held to), for its message lines:
 *
 *     configure_kind_data(fallback, synthetic_model)
 *     kind_data(obj) -> (kind, data)
 *
 * A user or assistant line (its type an exact str, its message an exact dict) gets
 * ("message", {"message": {"role": type, "content": blocks}, "meta": meta}) built here:
 * blocks as _blocks() makes them, meta as _request_meta() (an assistant's: usage, the
 * one-hour cache writes, model, request key, a speed other than the standard; {} for
 * the synthetic model) or the user's control tag. Any other line is fallback(obj)'s,
 * the Python function. */

static PyObject *kind_fallback = NULL, *synthetic_model = NULL;
static PyObject *s_user = NULL, *s_assistant = NULL, *s_text = NULL, *s_none = NULL,
                *s_write_1h = NULL, *s_request_key = NULL, *s_cache_creation = NULL,
                *s_hour = NULL, *s_compact_summary = NULL, *s_speed = NULL,
                *s_standard = NULL;

static PyObject *
ckernel_configure_kind_data(PyObject *Py_UNUSED(module), PyObject *const *args,
                            Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "configure_kind_data() wants the Python kind_data "
                                         "and the synthetic model's name");
        return NULL;
    }
    Py_XSETREF(kind_fallback, Py_NewRef(args[0]));
    Py_XSETREF(synthetic_model, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* d.get(key) as a borrowed reference (NULL: absent, or an error set). */
static inline PyObject *
get(PyObject *d, PyObject *key)
{
    return PyDict_GetItemWithError(d, key);
}

/* count(): a token count (count_ok's, null aside), else 0 (a new reference). */
static PyObject *
token_or_zero(PyObject *v)
{
    return Py_NewRef(v && v != Py_None && count_ok(v) ? v : zero_count);
}

/* text(): a non-empty exact str, else NULL (None). Borrowed. */
static inline PyObject *
text_of(PyObject *v)
{
    return v && PyUnicode_CheckExact(v) && PyUnicode_GET_LENGTH(v) ? v : NULL;
}

/* _usage(usage): the four counts, None when usage is not a dict, or usage itself (new)
 * when a count is present and not a token count (the audit refuses it: bad_field). */
static PyObject *
usage_counts(PyObject *usage)
{
    if (!usage || !PyDict_CheckExact(usage)) {
        return Py_NewRef(Py_None);
    }
    PyObject *out = PyDict_New();
    for (int i = 0; out && i < 4; i++) {
        PyObject *v = get(usage, usage_keys[i]);
        if (!v && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        if (v && !count_ok(v)) {
            Py_DECREF(out);
            return Py_NewRef(usage);
        }
        PyObject *n = token_or_zero(v);
        if (PyDict_SetItem(out, usage_keys[i], n) < 0) {
            Py_CLEAR(out);
        }
        Py_DECREF(n);
    }
    return out;
}

/* _hour_writes(usage): min(the one-hour writes, all the cache writes), or None. */
static PyObject *
hour_writes(PyObject *usage)
{
    PyObject *creation = usage && PyDict_CheckExact(usage) ? get(usage, s_cache_creation)
                                                             : NULL;
    if (!creation || !PyDict_CheckExact(creation)) {
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    PyObject *h = get(creation, s_hour);
    PyObject *c = h || !PyErr_Occurred() ? get(usage, usage_keys[3]) : NULL;
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *hour = token_or_zero(h), *all = token_or_zero(c);
    /* min() keeps the first of equals: the hour's */
    int less = PyLong_AsLongLong(all) < PyLong_AsLongLong(hour);
    Py_DECREF(less ? hour : all);
    return less ? all : hour;
}

/* _speed(usage): a speed other than the standard (an exact, non-empty str), borrowed;
 * else NULL (with an error set when the look-up failed). */
static PyObject *
speed_of(PyObject *usage)
{
    PyObject *v = usage && PyDict_CheckExact(usage) ? get(usage, s_speed) : NULL;
    if (!v || !PyUnicode_CheckExact(v) || PyUnicode_GET_LENGTH(v) == 0
        || PyUnicode_Compare(v, s_standard) == 0) {
        return NULL;
    }
    return v;
}

/* _request_meta(line, message). */
static PyObject *
request_meta(PyObject *line, PyObject *message)
{
    PyObject *model = get(message, s_model);
    if (!model && PyErr_Occurred()) {
        return NULL;
    }
    model = text_of(model);
    if (model && PyUnicode_Compare(model, synthetic_model) == 0) {
        return PyDict_New();
    }
    PyObject *usage = get(message, s_usage);
    PyObject *id = usage || !PyErr_Occurred() ? get(message, s_id) : NULL;
    PyObject *rid = id || !PyErr_Occurred() ? get(line, cc_scalar_keys[CC_REQUEST_ID]) : NULL;
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *id_text = text_of(id), *rid_text = text_of(rid);
    PyObject *key = PyUnicode_FromFormat("%U:%U", id_text ? id_text : s_none,
                                         rid_text ? rid_text : s_none);
    PyObject *counts = key ? usage_counts(usage) : NULL;
    PyObject *hour = counts ? hour_writes(usage) : NULL;
    PyObject *speed = hour ? speed_of(usage) : NULL;
    PyObject *meta = hour && !PyErr_Occurred() ? PyDict_New() : NULL;
    if (meta && (PyDict_SetItem(meta, s_usage, counts) < 0
                 || PyDict_SetItem(meta, s_write_1h, hour) < 0
                 || PyDict_SetItem(meta, s_model, model ? model : Py_None) < 0
                 || PyDict_SetItem(meta, s_request_key, key) < 0
                 || (speed && PyDict_SetItem(meta, s_speed, speed) < 0))) {
        Py_CLEAR(meta);
    }
    Py_XDECREF(key);
    Py_XDECREF(counts);
    Py_XDECREF(hour);
    return meta;
}

/* _blocks(content). */
static PyObject *
content_blocks(PyObject *content)
{
    if (content && PyUnicode_CheckExact(content)) {
        PyObject *block = PyDict_New();
        if (!block || PyDict_SetItem(block, s_type, s_text) < 0
            || PyDict_SetItem(block, s_text, content) < 0) {
            Py_XDECREF(block);
            return NULL;
        }
        PyObject *blocks = PyList_New(1);
        if (!blocks) {
            Py_DECREF(block);
            return NULL;
        }
        PyList_SET_ITEM(blocks, 0, block);
        return blocks;
    }
    return content && PyList_CheckExact(content) ? Py_NewRef(content) : PyList_New(0);
}

static PyObject *
ckernel_kind_data(PyObject *Py_UNUSED(module), PyObject *obj)
{
    if (!kind_fallback) {
        PyErr_SetString(PyExc_RuntimeError, "kind_data() before configure_kind_data()");
        return NULL;
    }
    if (!PyDict_Check(obj)) {
        return PyObject_CallOneArg(kind_fallback, obj);
    }
    PyObject *kind = get(obj, s_type);
    PyObject *message = kind || !PyErr_Occurred() ? get(obj, s_message) : NULL;
    if (PyErr_Occurred()) {
        return NULL;
    }
    int user = 0, assistant = 0;
    if (kind && PyUnicode_CheckExact(kind) && message && PyDict_CheckExact(message)) {
        user = PyUnicode_Compare(kind, s_user) == 0;
        assistant = !user && PyUnicode_Compare(kind, s_assistant) == 0;
    }
    if (!user && !assistant) {
        return PyObject_CallOneArg(kind_fallback, obj);
    }
    PyObject *meta = NULL;
    if (assistant) {
        meta = request_meta(obj, message);
    }
    else {
        PyObject *is_meta = get(obj, cc_scalar_keys[CC_IS_META]);
        PyObject *summary = is_meta == Py_True || PyErr_Occurred()
                            ? NULL : get(obj, cc_scalar_keys[CC_IS_COMPACT_SUMMARY]);
        meta = PyErr_Occurred() ? NULL : PyDict_New();
        if (meta && (is_meta == Py_True || summary == Py_True)
            && PyDict_SetItem(meta, s_control,
                              is_meta == Py_True ? s_meta : s_compact_summary) < 0) {
            Py_CLEAR(meta);
        }
    }
    if (!meta) {
        return NULL;
    }
    PyObject *content = get(message, s_content);
    PyObject *blocks = content || !PyErr_Occurred() ? content_blocks(content) : NULL;
    PyObject *view = blocks ? PyDict_New() : NULL;
    PyObject *data = view ? PyDict_New() : NULL;
    PyObject *result = NULL;
    if (data && PyDict_SetItem(view, s_role, kind) == 0
        && PyDict_SetItem(view, s_content, blocks) == 0
        && PyDict_SetItem(data, s_message, view) == 0
        && PyDict_SetItem(data, s_meta, meta) == 0) {
        result = PyTuple_Pack(2, s_message, data);
    }
    Py_DECREF(meta);
    Py_XDECREF(blocks);
    Py_XDECREF(view);
    Py_XDECREF(data);
    return result;
}

static PyObject *
ckernel_valid(PyObject *Py_UNUSED(module), PyObject *body)
{
    /* Whether the kernel's grammar takes `body` as one JSON value (the tests', and
     * formats.base.sniffed's look at a vak header without parsing it). */
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "valid() wants bytes");
        return NULL;
    }
    Cur c = {(const u8 *)PyBytes_AS_STRING(body),
             (const u8 *)PyBytes_AS_STRING(body) + PyBytes_GET_SIZE(body), 0};
    Val v;
    int ok = parse_value(&c, &v) == 0 && c.p == c.end;
    return PyBool_FromLong(ok);
}

/* Whether `text` holds a code point of `ranges`: bytes of native uint32 pairs (first,
 * last), sorted and disjoint. The replay's tokenizer asks it of every text it counts
 * (pipeline/replay/tokens.py: a counter whose Unicode tables class those code points
 * unlike tiktoken's must not count such a text), so it runs at memory speed: a text
 * whose storage cannot hold the lowest of them (ASCII, Latin-1) is not even read. */
static PyObject *
ckernel_any_in(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyBytes_Check(args[1])
        || PyBytes_GET_SIZE(args[1]) % 8 != 0) {
        PyErr_SetString(PyExc_TypeError,
                        "any_in(text: str, ranges: bytes of uint32 pairs) takes two arguments");
        return NULL;
    }
    PyObject *text = args[0];
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) { /* a legacy string's canonical form (none since 3.12) */
        return NULL;
    }
#endif
    Py_ssize_t pairs = PyBytes_GET_SIZE(args[1]) / 8;
    const char *table = PyBytes_AS_STRING(args[1]);
    if (pairs == 0) {
        Py_RETURN_FALSE;
    }
    uint32_t lowest;
    memcpy(&lowest, table, sizeof lowest);
    if (PyUnicode_MAX_CHAR_VALUE(text) < lowest) {
        Py_RETURN_FALSE;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < lowest) {
            continue;
        }
        /* The last pair whose first is <= c holds it, or none does. */
        Py_ssize_t lo = 0, hi = pairs;
        while (hi - lo > 1) {
            Py_ssize_t mid = (lo + hi) / 2;
            uint32_t first;
            memcpy(&first, table + 8 * mid, sizeof first);
            if (first <= c) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        uint32_t last;
        memcpy(&last, table + 8 * lo + 4, sizeof last);
        if (c <= last) {
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

/* ---- vak's work lines ------------------------------------------------------------------
 * work_quirk(body): whether a line orjson took is vak's ``work`` entry written with two
 * ``kind`` keys (the envelope's "work", then the event's object), as
 * pipeline/ledger/reader.py's _work_quirk tells with Python's json and a pairs hook
 * (~12 us a line against ~0.5 us here; the benchmark fleet has 1,465 such lines);
 * None where it must: the grammar refuses or defers the line (an escaped key, more
 * than MAX_KEYS keys, a value it defers), or the first kind is an escaped string. */

typedef struct {
    int kinds;       /* top-level "kind" keys seen */
    int first_work;  /* the first is the string "work" */
    int second_obj;  /* the second is an object */
    int escaped;     /* the first is an escaped string: Python compares it decoded */
} WorkKinds;

static int
work_member(Cur *c, const Val *key, void *ctx)
{
    WorkKinds *w = (WorkKinds *)ctx;
    Val v;
    if (parse_value(c, &v)) {
        return -1;
    }
    if (KEY_IS(key, "kind")) {
        w->kinds++;
        if (w->kinds == 1) {
            w->first_work = STR_IS(&v, "work");
            w->escaped = v.type == T_STR && v.esc;
        }
        else if (w->kinds == 2) {
            w->second_obj = v.type == T_OBJ;
        }
    }
    return 0;
}

static PyObject *
ckernel_work_quirk(PyObject *Py_UNUSED(module), PyObject *body)
{
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "work_quirk() wants bytes");
        return NULL;
    }
    Cur c = {(const u8 *)PyBytes_AS_STRING(body),
             (const u8 *)PyBytes_AS_STRING(body) + PyBytes_GET_SIZE(body), 0};
    WorkKinds w = {0, 0, 0, 0};
    int dup = 0;
    if (c.p >= c.end || *c.p != '{' || parse_keyed_object(&c, work_member, &w, &dup)
        || c.p != c.end || w.escaped) {
        Py_RETURN_NONE;
    }
    return PyBool_FromLong(w.kinds == 2 && w.first_work && w.second_obj);
}

/* ---- rows as Arrow columns ------------------------------------------------------------
 * columns(rows, kinds[, names]): the columns of ``rows`` (a list of tuples, each one
 * value per letter of ``kinds``: 's' a string, 'i' an int32, 'l' an int64, 'b' a bool;
 * None is null in any; or with ``names``, a tuple of one name per kind, a list of dicts
 * whose missing names are null) as the buffers of Arrow arrays, for pyarrow's
 * Array.from_buffers: per column (null_count, validity or None, values, data or None),
 * a string's values its int32 offsets and its data the UTF-8. The caller is
 * pipeline/tables/schemas.py's built_columns; the arrays are the same as pyarrow's
 * conversion of the rows (a test holds them alike). None where a row or a value is
 * anything else (a str subclass, an int past its column, a lone surrogate, a bool where
 * an int goes, 2 GiB of one column's text): pyarrow converts those rows and decides, as
 * it always did. One pass over the rows, row by row: a column at a time would walk
 * every row's tuple and values once per column. */

#define MAX_COLUMNS 64

typedef struct {
    char kind;
    Py_ssize_t nulls;
    Py_ssize_t chars; /* a string column's bytes so far */
    PyObject *validity, *values, *data; /* bytes; data: a string column's, grown */
} Column;

static void
columns_free(Column *cols, Py_ssize_t width)
{
    for (Py_ssize_t j = 0; j < width; j++) {
        Py_CLEAR(cols[j].validity);
        Py_CLEAR(cols[j].values);
        Py_CLEAR(cols[j].data);
    }
}

/* Bit ``i`` of an Arrow bitmap (least significant first), set. */
static inline void
set_bit(char *bitmap, Py_ssize_t i)
{
    bitmap[i >> 3] |= (char)(1u << (i & 7));
}

/* A new bytes object of ``n`` zero bytes, as a column's buffer. */
static PyObject *
zeroed_bytes(Py_ssize_t n)
{
    PyObject *b = PyBytes_FromStringAndSize(NULL, n);
    if (b) {
        memset(PyBytes_AS_STRING(b), 0, (size_t)n);
    }
    return b;
}

/* Value ``v`` (not None) of row ``i`` into its column; 0 where it does not fit (no error
 * set), -1 on an error. */
static int
column_put(Column *col, Py_ssize_t i, PyObject *v)
{
    char *out = PyBytes_AS_STRING(col->values);
    switch (col->kind) {
    case 's': {
        if (!PyUnicode_CheckExact(v)) {
            return 0;
        }
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &len);
        if (!utf8) {
            PyErr_Clear(); /* a lone surrogate: no UTF-8 */
            return 0;
        }
        if (len > INT32_MAX - col->chars) {
            return 0;
        }
        Py_ssize_t room = PyBytes_GET_SIZE(col->data);
        if (col->chars + len > room) {
            Py_ssize_t want = room * 2 > col->chars + len ? room * 2 : col->chars + len;
            if (_PyBytes_Resize(&col->data, want) < 0) {
                return -1;
            }
        }
        memcpy(PyBytes_AS_STRING(col->data) + col->chars, utf8, (size_t)len);
        col->chars += len;
        int32_t end = (int32_t)col->chars;
        memcpy(out + (i + 1) * 4, &end, 4);
        return 1;
    }
    case 'i':
    case 'l': {
        if (!PyLong_CheckExact(v)) {
            return 0;
        }
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (col->kind == 'l') {
            int64_t x64 = x;
            memcpy(out + i * 8, &x64, 8);
            return 1;
        }
        if (x < INT32_MIN || x > INT32_MAX) {
            return 0;
        }
        int32_t x32 = (int32_t)x;
        memcpy(out + i * 4, &x32, 4);
        return 1;
    }
    default: /* 'b' */
        if (v != Py_True && v != Py_False) {
            return 0;
        }
        if (v == Py_True) {
            set_bit(out, i);
        }
        return 1;
    }
}

static PyObject *
ckernel_columns(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *names = nargs == 3 ? args[2] : Py_None;
    if (nargs < 2 || nargs > 3 || !PyList_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])
        || PyBytes_GET_SIZE(args[1]) > MAX_COLUMNS
        || (names != Py_None && (!PyTuple_CheckExact(names)
                                 || PyTuple_GET_SIZE(names) != PyBytes_GET_SIZE(args[1])))) {
        PyErr_SetString(PyExc_TypeError, "columns() wants the rows (a list of tuples, or of "
                                         "dicts with names), their kinds (bytes, at most 64 "
                                         "of s, i, l, b) and the names (a tuple, one a kind)");
        return NULL;
    }
    PyObject *rows = args[0];
    const char *kinds = PyBytes_AS_STRING(args[1]);
    Py_ssize_t width = PyBytes_GET_SIZE(args[1]), n = PyList_GET_SIZE(rows);
    Py_ssize_t bits = (n + 7) / 8;
    Column cols[MAX_COLUMNS];
    memset(cols, 0, sizeof cols);
    PyObject *out = NULL;
    for (Py_ssize_t j = 0; j < width; j++) {
        char kind = kinds[j];
        if (!kind || !strchr("silb", kind)) {
            PyErr_SetString(PyExc_ValueError, "columns(): a kind is one of s, i, l, b");
            goto done;
        }
        cols[j].kind = kind;
        cols[j].validity = zeroed_bytes(bits);
        /* zeroed: a null's value is 0, a string's offsets start at 0 */
        cols[j].values = zeroed_bytes(kind == 's' ? (n + 1) * 4 : kind == 'i' ? n * 4
                                      : kind == 'l' ? n * 8 : bits);
        cols[j].data = kind == 's' ? PyBytes_FromStringAndSize(NULL, 16 * n + 16)
                                   : Py_NewRef(Py_None);
        if (!cols[j].validity || !cols[j].values || !cols[j].data) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (names == Py_None ? !PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != width
                             : !PyDict_CheckExact(row)) {
            goto misfit;
        }
        for (Py_ssize_t j = 0; j < width; j++) {
            Column *col = &cols[j];
            PyObject *v;
            if (names == Py_None) {
                v = PyTuple_GET_ITEM(row, j);
            }
            else {
                /* borrowed: used up before the next lookup */
                v = PyDict_GetItemWithError(row, PyTuple_GET_ITEM(names, j));
                if (!v) {
                    if (PyErr_Occurred()) {
                        goto done; /* a name's hash or compare raised */
                    }
                    v = Py_None; /* a missing column is null */
                }
            }
            if (v == Py_None) {
                col->nulls++;
                if (col->kind == 's') { /* a null's offset: where the last value ended */
                    int32_t end = (int32_t)col->chars;
                    memcpy(PyBytes_AS_STRING(col->values) + (i + 1) * 4, &end, 4);
                }
                continue;
            }
            set_bit(PyBytes_AS_STRING(col->validity), i);
            int put = column_put(col, i, v);
            if (put < 0) {
                goto done;
            }
            if (!put) {
                goto misfit;
            }
        }
    }
    out = PyList_New(width);
    if (!out) {
        goto done;
    }
    for (Py_ssize_t j = 0; j < width; j++) {
        Column *col = &cols[j];
        if (col->kind == 's' && _PyBytes_Resize(&col->data, col->chars) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        if (!col->nulls) {
            Py_SETREF(col->validity, Py_NewRef(Py_None));
        }
        PyObject *column = Py_BuildValue("(nOOO)", col->nulls, col->validity, col->values,
                                         col->data);
        if (!column) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, j, column);
    }
done:
    columns_free(cols, width);
    return out;
misfit:
    columns_free(cols, width);
    Py_RETURN_NONE;
}

static PyMethodDef ckernel_methods[] = {
    {"work_quirk", (PyCFunction)ckernel_work_quirk, METH_O,
     "work_quirk(body) -> bool | None: whether a line orjson took is vak's work entry "
     "with two kind keys (_work_quirk's answer); None where _work_quirk must tell."},
    {"columns", (PyCFunction)(void (*)(void))ckernel_columns, METH_FASTCALL,
     "columns(rows, kinds, names=None) -> list | None: the rows' columns as Arrow "
     "buffers, per column (null_count, validity, values, data); None where pyarrow must "
     "convert the rows."},
    {"configure_info", (PyCFunction)(void (*)(void))ckernel_configure_info, METH_FASTCALL,
     "configure_info(request_type, receipt_type, directive, zero_usage, slow): what "
     "node_info() makes and defers to."},
    {"usage_rows", (PyCFunction)(void (*)(void))ckernel_usage_rows, METH_FASTCALL,
     "usage_rows(nodes, by_id, provider, model, subagent) -> list | None: a session's "
     "usage rows (_usage_rows'), in one call; None where _usage_rows must decide."},
    {"figures", (PyCFunction)(void (*)(void))ckernel_figures, METH_FASTCALL,
     "figures(nodes, by_id) -> tuple | None: a session's figures (_figures') and its "
     "active chain's lines and ids, in one call; None where _figures must decide."},
    {"node_info", (PyCFunction)(void (*)(void))ckernel_node_info, METH_FASTCALL,
     "node_info(entry, bad) -> info: the audit's node info of a common vak entry, else "
     "slow(entry, bad)'s."},
    {"transcript_info", (PyCFunction)(void (*)(void))ckernel_transcript_info, METH_FASTCALL,
     "transcript_info(entry, bad) -> info: the audit's node info of a common entry an "
     "adapter made, with a request's key, one-hour writes and mirror, else "
     "transcript_slow(entry, bad)'s."},
    {"guarded", (PyCFunction)(void (*)(void))ckernel_guarded, METH_FASTCALL,
     "guarded(readline, limit, tap, oversize) -> Guarded: a binary file's physical lines "
     "under the line limit, an over-long one as oversize(line) makes it."},
    {"pushback", ckernel_pushback, METH_O,
     "pushback(lines) -> Lines: an iterator of lines that run() can give one back to."},
    {"run", (PyCFunction)(void (*)(void))ckernel_run, METH_FASTCALL,
     "run(by_id, nodes, slow_add, info, findings, last, lines, number, prev) -> (taken, "
     "nbytes, prev): the audit's common lines after line number, in one loop."},
    {"activity_run", (PyCFunction)(void (*)(void))ckernel_activity_run, METH_FASTCALL,
     "activity_run(seen, batch, lines, number) -> (taken, nbytes): a Claude Code "
     "transcript's activity lines after line number, in one loop."},
    {"configure_kind_data", (PyCFunction)(void (*)(void))ckernel_configure_kind_data,
     METH_FASTCALL,
     "configure_kind_data(fallback, synthetic_model): kind_data()'s Python function for "
     "the lines it does not build, and the synthetic model's name."},
    {"kind_data", ckernel_kind_data, METH_O,
     "kind_data(obj) -> (kind, data): a Claude Code line's entry kind and data "
     "(claude_code._kind_data_py's), its message lines built in C."},
    {"scan", ckernel_scan, METH_O,
     "scan(body: bytes) -> tuple | None: validate a line, read its envelope "
     "(pipeline/ledger/kernel.py's contract)."},
    {"worth_it", ckernel_worth_it, METH_O,
     "worth_it(body: bytes) -> bool: whether scan() is worth calling (not a receipt or "
     "a header)."},
    {"scan_transcript", (PyCFunction)(void (*)(void))ckernel_scan_transcript, METH_FASTCALL,
     "scan_transcript(result_type, body: bytes) -> result_type | None: validate a Claude "
     "Code line, read what its adapter reads (pipeline/formats/claude_code.py's scan)."},
    {"entry", (PyCFunction)(void (*)(void))ckernel_entry, METH_FASTCALL,
     "entry(body: bytes, line: int) -> LazyEntry | Entry | None: reader.parse_entry's "
     "entry for a line the C kernel vouches for (an eager one for a receipt or a header, "
     "parsed by orjson), None where parse_entry's other paths read it."},
    {"chained", (PyCFunction)(void (*)(void))ckernel_chained, METH_FASTCALL,
     "chained(raw: bytes, line: int, prev: str) -> LazyEntry | Entry | None: "
     "reader.read_ledger's common line: entry()'s entry of the line without its newline "
     "when chained to prev (and, a message, with the scan's view), else None."},
    {"lazy", (PyCFunction)(void (*)(void))ckernel_lazy, METH_FASTCALL,
     "lazy(line, id, parent, kind, ts, digest, body, view, mapper=None) -> LazyEntry: "
     "reader.lazy_entry's entry."},
    {"direct_sha256", (PyCFunction)(void (*)(void))ckernel_direct_sha256, METH_FASTCALL,
     "direct_sha256(on=None) -> bool: whether digests call OpenSSL's SHA-256 directly "
     "(found in the libcrypto hashlib loaded); False turns that off (hashlib's sha256 "
     "then), True back on where it was found."},
    {"sha256_calls", ckernel_sha256_calls, METH_NOARGS,
     "sha256_calls() -> str: what the digests call now: 'SHA256_Init/Update/Final' or "
     "'SHA256' (OpenSSL's, directly), or 'hashlib'."},
    {"sha256_hex", ckernel_sha256_hex, METH_O,
     "sha256_hex(body: bytes) -> str: the hex SHA-256 of body, as the entries' digests "
     "are made."},
    {"configure", (PyCFunction)(void (*)(void))ckernel_configure, METH_FASTCALL,
     "configure(lazy_type, payload_type, sha256, entry_type): what entry() and lazy() "
     "build with."},
    {"any_in", (PyCFunction)(void (*)(void))ckernel_any_in, METH_FASTCALL,
     "any_in(text: str, ranges: bytes) -> bool: whether text holds a code point of "
     "ranges (native uint32 pairs first, last; sorted, disjoint)."},
    {"configure_tree", (PyCFunction)(void (*)(void))ckernel_configure_tree, METH_FASTCALL,
     "configure_tree(node_type, known_kinds): what tree_add() builds and checks with."},
    {"tree_add", (PyCFunction)(void (*)(void))ckernel_tree_add, METH_FASTCALL,
     "tree_add(by_id, nodes, slow, entry, info=None) -> (): TreeIndex.add's common case "
     "(a known kind, not a header, its parent known, its id new), else slow(entry, info)."},
    {"valid", ckernel_valid, METH_O,
     "valid(body: bytes) -> bool: whether the kernel's grammar accepts body whole."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ckernel_module = {
    PyModuleDef_HEAD_INIT, "_ckernel",
    "The audit's per-line kernel in C (pipeline/ledger/kernel.py's scan).", -1,
    ckernel_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__ckernel(void)
{
    PyObject *orjson = PyImport_ImportModule("orjson");
    if (!orjson) {
        return NULL;
    }
    orjson_loads = PyObject_GetAttrString(orjson, "loads");
    Py_DECREF(orjson);
    if (!orjson_loads) {
        return NULL;
    }
    s_message = PyUnicode_InternFromString("message");
    s_role = PyUnicode_InternFromString("role");
    s_content = PyUnicode_InternFromString("content");
    s_type = PyUnicode_InternFromString("type");
    s_meta = PyUnicode_InternFromString("meta");
    empty_args = PyTuple_New(0);
    if (!empty_args) {
        return NULL;
    }
    s_model = PyUnicode_InternFromString("model");
    s_id = PyUnicode_InternFromString("id");
    s_usage = PyUnicode_InternFromString("usage");
    s_data = PyUnicode_InternFromString("data");
    s_agent_id = PyUnicode_InternFromString("agentId");
    s_hexdigest = PyUnicode_InternFromString("hexdigest");
    s_parent_id = PyUnicode_InternFromString("parent_id");
    s_kind = PyUnicode_InternFromString("kind");
    s_ts = PyUnicode_InternFromString("ts");
    s_prev_hash = PyUnicode_InternFromString("prev_hash");
    s_at_turn = PyUnicode_InternFromString("at_turn");
    if (!s_message || !s_role || !s_content || !s_type || !s_meta || !s_model || !s_id
        || !s_usage || !s_data || !s_agent_id || !s_hexdigest || !s_parent_id || !s_kind || !s_ts
        || !s_prev_hash || !s_at_turn) {
        return NULL;
    }
    static const char *const usage_names[4] = {"input_tokens", "output_tokens",
                                               "cache_read_input_tokens",
                                               "cache_creation_input_tokens"};
    for (int i = 0; i < 4; i++) {
        usage_keys[i] = PyUnicode_InternFromString(usage_names[i]);
        if (!usage_keys[i]) {
            return NULL;
        }
    }
    zero_count = PyLong_FromLong(0);
    s_control = PyUnicode_InternFromString("control");
    s_attempts = PyUnicode_InternFromString("attempts");
    s_winning_attempt = PyUnicode_InternFromString("winning_attempt");
    s_ordinal = PyUnicode_InternFromString("ordinal");
    s_settlement = PyUnicode_InternFromString("settlement");
    s_provider = PyUnicode_InternFromString("provider");
    s_purpose = PyUnicode_InternFromString("purpose");
    s_receipt = PyUnicode_InternFromString("receipt");
    if (!zero_count || !s_control || !s_attempts || !s_winning_attempt || !s_ordinal
        || !s_settlement || !s_provider || !s_purpose || !s_receipt) {
        return NULL;
    }
    /* the usage rows' own texts (usage_rows; "message" is s_message) */
    s_mirror = PyUnicode_InternFromString("mirror");
    s_attempt = PyUnicode_InternFromString("attempt");
    s_abandoned = PyUnicode_InternFromString("abandoned");
    s_retry = PyUnicode_InternFromString("retry");
    s_empty = PyUnicode_InternFromString("");
    s_activity = PyUnicode_InternFromString("activity");
    if (!s_mirror || !s_attempt || !s_abandoned || !s_retry || !s_empty || !s_activity) {
        return NULL;
    }
    s_user = PyUnicode_InternFromString("user");
    s_assistant = PyUnicode_InternFromString("assistant");
    s_text = PyUnicode_InternFromString("text");
    s_none = PyUnicode_InternFromString("None");
    s_write_1h = PyUnicode_InternFromString("write_1h");
    s_request_key = PyUnicode_InternFromString("request_key");
    s_cache_creation = PyUnicode_InternFromString("cache_creation");
    s_hour = PyUnicode_InternFromString("ephemeral_1h_input_tokens");
    s_compact_summary = PyUnicode_InternFromString("compact_summary");
    s_speed = PyUnicode_InternFromString("speed");
    s_standard = PyUnicode_InternFromString("standard");
    if (!s_user || !s_assistant || !s_text || !s_none || !s_write_1h || !s_request_key
        || !s_cache_creation || !s_hour || !s_compact_summary || !s_speed || !s_standard) {
        return NULL;
    }
    for (int i = 0; i < CC_NSCALARS; i++) {
        cc_scalar_lens[i] = (Py_ssize_t)strlen(cc_scalar_names[i]);
        cc_scalar_keys[i] = PyUnicode_InternFromString(cc_scalar_names[i]);
        if (!cc_scalar_keys[i]) {
            return NULL;
        }
    }
    if (PyType_Ready(&GuardedType) < 0) {
        return NULL;
    }
    if (PyType_Ready(&LinesType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&ckernel_module);
    if (m && PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH)) {
        Py_CLEAR(m);
    }
    return m;
}
