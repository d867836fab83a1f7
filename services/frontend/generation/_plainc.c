/* The plain step of a streamed completion in C: one token, no stop strings or parser; with a chat
 * completion's logprobs, or none.
 *
 * A PlainStep holds, while the direct stream takes a stream's steps from the dispatch pass
 * (generation/direct_stream.py), the per-token state the Python step keeps over four objects: the
 * detokenizer's held bytes (text/detokenizer.py, _ByteStream), the completion-token count and the time
 * of the last token (generation/output.py), the inter-token latency histogram's counts
 * (generation/metrics.py, BatchedHistogram: a list shared with it, the sum in its last slot) and the
 * SSE chunk's prefix and suffix (http_api/openai_bodies.py, ChunkWriter.text). step(token_id, now) does
 * what OutputProcessor._text_step and ChunkWriter.text do for that token and returns the chunk.
 * With logprobs (a chat completion's: the `heads` keyword), it also holds the entries of tokens whose
 * text is not out yet (OutputProcessor._pending) and makes each step's entry from the formatter's
 * per-id cells (text/logprobs_format.py, _Table) and the step's packed row (protocol/logprobs.py), as
 * LogprobsFormatter._chat_one and OutputProcessor._logprobs_step do; any row that function would not
 * take (a cell not made yet, a logprob to floor, an id whose string depends on the next, ...) is
 * declined, nothing done, for the Python step. The Python path stays the reference
 * (tests/unit/frontend/test_plainc.py holds both to the same bytes and state) and the fallback where
 * this module is not built. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

typedef struct {
    PyObject_HEAD
    PyObject *pieces;   /* list: each token's raw bytes, None for an added token */
    PyObject *counts;   /* list: the histogram's count per bound, then its sum (a float) */
    PyObject *prefix;   /* bytes: the chunk up to the JSON string of the text */
    PyObject *suffix;   /* bytes: the chunk after it */
    PyObject *pending;  /* bytes: an incomplete UTF-8 sequence held back */
    double *bounds;     /* the histogram's upper bounds (the last +Inf) */
    Py_ssize_t nbounds;
    Py_ssize_t tokens;
    double last;
    /* logprobs (a chat completion's), all NULL without: the formatter's per-id chat heads and tails (lists
     * of bytes or None) and ids whose string depends on the next (a set), the alternatives asked (k), the
     * chunk's bytes between the text and the entries, and the entries held for the next text (a list) */
    PyObject *heads, *tails, *partial, *mid, *entries;
    Py_ssize_t top;
    /* bind(): the direct stream it serves, its InFlight, the pass's list of streams to write */
    PyObject *owner;
    PyObject *inflight;
    PyObject *writing;
    PyObject *cycle;      /* the response's uvicorn RequestResponseCycle, or NULL: the owner's outlet's put() */
    PyObject *transport;  /* its transport, and three of its bound methods (no lookup a token) */
    PyObject *write, *buffered, *closing;
    int fd;               /* its socket, where it is plain TCP (no TLS between): sent to directly, else -1 */
    PyObject *body;       /* bytes: the chunks of this pass not yet written (queued in `writing` when not empty) */
    vectorcallfunc vectorcall;
} PlainStep;

static PyObject *PlainStep_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames);

static int
PlainStep_traverse(PlainStep *self, visitproc visit, void *arg)
{
    Py_VISIT(self->owner);
    Py_VISIT(self->inflight);
    Py_VISIT(self->writing);
    Py_VISIT(self->cycle);
    Py_VISIT(self->transport);
    Py_VISIT(self->write);
    Py_VISIT(self->buffered);
    Py_VISIT(self->closing);
    Py_VISIT(self->counts);
    Py_VISIT(self->heads);
    Py_VISIT(self->tails);
    Py_VISIT(self->partial);
    Py_VISIT(self->entries);
    return 0;
}

static int
PlainStep_clear(PlainStep *self)
{
    self->fd = -1;
    Py_CLEAR(self->owner);
    Py_CLEAR(self->inflight);
    Py_CLEAR(self->writing);
    Py_CLEAR(self->cycle);
    Py_CLEAR(self->transport);
    Py_CLEAR(self->write);
    Py_CLEAR(self->buffered);
    Py_CLEAR(self->closing);
    return 0;
}

static void
PlainStep_dealloc(PlainStep *self)
{
    PyObject_GC_UnTrack(self);
    PlainStep_clear(self);
    Py_XDECREF(self->body);
    Py_XDECREF(self->pieces);
    Py_XDECREF(self->counts);
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->suffix);
    Py_XDECREF(self->pending);
    Py_XDECREF(self->heads);
    Py_XDECREF(self->tails);
    Py_XDECREF(self->partial);
    Py_XDECREF(self->mid);
    Py_XDECREF(self->entries);
    PyMem_Free(self->bounds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
PlainStep_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"pieces", "bounds", "counts", "prefix", "suffix", "heads", "tails", "partial", "top",
                             "mid", NULL};
    PyObject *pieces, *bounds, *counts, *prefix, *suffix, *heads = NULL, *tails = NULL, *partial = NULL,
        *mid = NULL;
    Py_ssize_t top = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!SS|$O!O!O!nS:PlainStep", kwlist, &PyList_Type, &pieces,
                                     &bounds, &PyList_Type, &counts, &prefix, &suffix, &PyList_Type, &heads,
                                     &PyList_Type, &tails, &PySet_Type, &partial, &top, &mid))
        return NULL;
    if ((heads != NULL || tails != NULL || partial != NULL || mid != NULL)
        && (heads == NULL || tails == NULL || partial == NULL || mid == NULL || top < 0)) {
        PyErr_SetString(PyExc_ValueError, "logprobs take heads, tails, partial, mid and a top of 0 or more");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(bounds, "bounds must be a sequence of floats");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || PyList_GET_SIZE(counts) != n + 1) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "counts must hold one count per bound and then the sum");
        return NULL;
    }
    double *b = PyMem_Malloc(sizeof(double) * (size_t)n);
    if (b == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        b[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (b[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            PyMem_Free(b);
            return NULL;
        }
    }
    Py_DECREF(seq);
    PlainStep *self = (PlainStep *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyMem_Free(b);
        return NULL;
    }
    self->bounds = b;
    self->nbounds = n;
    self->pieces = Py_NewRef(pieces);
    self->counts = Py_NewRef(counts);
    self->prefix = Py_NewRef(prefix);
    self->suffix = Py_NewRef(suffix);
    self->pending = PyBytes_FromStringAndSize(NULL, 0);
    self->body = PyBytes_FromStringAndSize(NULL, 0);
    if (self->pending == NULL || self->body == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    if (heads != NULL) {
        self->heads = Py_NewRef(heads);
        self->tails = Py_NewRef(tails);
        self->partial = Py_NewRef(partial);
        self->mid = Py_NewRef(mid);
        self->top = top;
        if ((self->entries = PyList_New(0)) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    self->tokens = 0;
    self->last = 0.0;
    self->vectorcall = PlainStep_vectorcall;
    self->fd = -1;
    return (PyObject *)self;
}

/* load(tokens, last, pending, entries=()): take the stream's state from the Python objects; `entries`
 * (with logprobs) those held for the next text, copied. */
static PyObject *
PlainStep_load(PlainStep *self, PyObject *args)
{
    Py_ssize_t tokens;
    double last;
    PyObject *pending, *entries = NULL;
    if (!PyArg_ParseTuple(args, "ndS|O:load", &tokens, &last, &pending, &entries))
        return NULL;
    PyObject *held = NULL;
    if (entries != NULL) {
        if ((held = PySequence_List(entries)) == NULL)
            return NULL;
        if (self->entries == NULL && PyList_GET_SIZE(held)) {
            Py_DECREF(held);
            PyErr_SetString(PyExc_ValueError, "entries held for a step that makes no logprobs");
            return NULL;
        }
    }
    self->tokens = tokens;
    self->last = last;
    Py_SETREF(self->pending, Py_NewRef(pending));
    if (self->entries != NULL) {
        if (held == NULL && (held = PyList_New(0)) == NULL)
            return NULL;
        Py_SETREF(self->entries, held);
    }
    else
        Py_XDECREF(held);
    Py_RETURN_NONE;
}

/* state() -> (tokens, last, pending, entries): the stream's state, for the Python objects; `entries` a
 * new list ([] without logprobs). */
static PyObject *
PlainStep_state(PlainStep *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *entries = self->entries != NULL ? PyList_GetSlice(self->entries, 0, PY_SSIZE_T_MAX) : PyList_New(0);
    if (entries == NULL)
        return NULL;
    return Py_BuildValue("ndON", self->tokens, self->last, self->pending, entries);
}

/* The bytes msgspec.json encodes a str to, without the quotes: '"', '\\' and the control characters
 * escaped (\b \t \n \f \r by name, the rest as \u00XX), everything else as its UTF-8. */
static const char HEX[] = "0123456789abcdef";
static PyObject *ONE;  /* the int 1 */
static PyObject *EMPTY;  /* b"" */
static PyObject *S_stream_outlet, *S_flow, *S_write_paused, *S_disconnected, *S_transport, *S_write,
    *S_put, *S_get_write_buffer_size, *S_is_closing;

static Py_ssize_t
escaped_size(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t size = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r')
            size += 1;
        else if (c < 0x20)
            size += 5;
    }
    return size;
}

static char *
escape(char *out, const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\t': *out++ = 't'; break;
        case '\n': *out++ = 'n'; break;
        case '\f': *out++ = 'f'; break;
        case '\r': *out++ = 'r'; break;
        default:
            memcpy(out, "u00", 3);
            out[3] = HEX[c >> 4];
            out[4] = HEX[c & 0xf];
            out += 5;
        }
    }
    return out;
}

/* counts[i] += 1 and counts[-1] += value, as BatchedHistogram.observe does. */
static int
observe(PlainStep *self, double value)
{
    PyObject *counts = self->counts;
    Py_ssize_t n = self->nbounds;
    if (PyList_GET_SIZE(counts) != n + 1) {
        PyErr_SetString(PyExc_RuntimeError, "the histogram's counts list changed size");
        return -1;
    }
    /* bisect_left: the first bound >= value */
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (self->bounds[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == n)  /* no bound >= value: cannot be, the last is +Inf (a NaN takes the first, as in bisect_left) */
        lo = n - 1;
    PyObject *count = PyNumber_Add(PyList_GET_ITEM(counts, lo), ONE);
    if (count == NULL)
        return -1;
    double sum = PyFloat_AsDouble(PyList_GET_ITEM(counts, n));
    if (sum == -1.0 && PyErr_Occurred()) {
        Py_DECREF(count);
        return -1;
    }
    PyObject *total = PyFloat_FromDouble(sum + value);
    if (total == NULL) {
        Py_DECREF(count);
        return -1;
    }
    /* PyList_SetItem takes the new reference and drops the list's to the old value */
    if (PyList_SetItem(counts, lo, count) < 0) {
        Py_DECREF(total);
        return -1;
    }
    return PyList_SetItem(counts, n, total);
}

/* ---- logprobs ---- */

#define FLOOR (-9999.0)  /* logprobs_format.FLOOR: what is below it is written as it */
/* msgspec.json.Encoder().encode, which writes a row's logprobs as the Python step does (one call for the
 * row's numbers, several times quicker than repr's digits one by one) */
static PyObject *ENCODE;

static PyObject *S_frame, *S_offset, *S_positions, *S_k, *S_packed_logprobs, *S_packed_prompt_logprobs;

/* An int attribute of `obj` into *value: 1, or 0 when it is no int that fits (declined), -1 an error. */
static int
int_attr(PyObject *obj, PyObject *name, Py_ssize_t *value)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int ok = PyLong_Check(v);
    if (ok) {
        *value = PyLong_AsSsize_t(v);
        if (*value == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                Py_DECREF(v);
                return -1;
            }
            PyErr_Clear();
            ok = 0;
        }
    }
    Py_DECREF(v);
    return ok;
}

/* The chat entry of the one generated token whose packed row `packed` (a PackedLogprobs) names in
 * `raw_frames`, as LogprobsFormatter._chat_one makes it: 1 with *entry set (a new reference), 0 where
 * that function would not make it (it or unpack() would take another way, or fail: the Python step's to
 * take or to report), -1 an error. */
static int
make_entry(PlainStep *self, PyObject *packed, PyObject *raw_frames, PyObject **entry)
{
#if !PY_LITTLE_ENDIAN
    return 0;  /* the rows are little-endian: unpack() swaps them */
#endif
    Py_ssize_t frame, offset, positions, k;
    int ok;
    if ((ok = int_attr(packed, S_positions, &positions)) <= 0 || (ok = int_attr(packed, S_k, &k)) <= 0
        || (ok = int_attr(packed, S_frame, &frame)) <= 0 || (ok = int_attr(packed, S_offset, &offset)) <= 0)
        return ok;
    if (positions != 1 || k != self->top || offset < 0 || offset % 4 || frame < 0)
        return 0;
    Py_ssize_t frames = PySequence_Size(raw_frames);
    if (frames < 0) {
        PyErr_Clear();
        return 0;
    }
    if (frame >= frames)
        return 0;
    PyObject *holder = PySequence_GetItem(raw_frames, frame);
    if (holder == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(holder, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_DECREF(holder);
        return 0;
    }
    Py_ssize_t w = k + 1;
    int rc = 0;
    PyObject *values = NULL, *text = NULL;
    if (offset > view.len || view.len - offset < 4 * (2 * w + 1))
        goto done;  /* unpack() reports the short frame */
    const char *ids = (const char *)view.buf + offset, *lps = ids + 4 * w;
    PyObject *heads = self->heads, *tails = self->tails;
    /* ,"top_logprobs":[ ... ]} with k closing braces and commas between; the numbers counted below */
    Py_ssize_t size = 17 + 2 + k + (k ? k - 1 : 0);
    if ((values = PyTuple_New(w)) == NULL) {
        rc = -1;
        goto done;
    }
    for (Py_ssize_t j = 0; j < w; j++) {
        int32_t tid;
        float lp;
        memcpy(&tid, ids + 4 * j, 4);
        memcpy(&lp, lps + 4 * j, 4);
        double value = (double)lp;
        /* a negative id: unpack()'s error; a cell not made or past the lists: _chat_one makes it; a logprob
         * to floor (or -inf, NaN, +inf, which msgspec writes as null): _chat_rows' */
        if (tid < 0 || tid >= PyList_GET_SIZE(heads) || tid >= PyList_GET_SIZE(tails) || !(value > FLOOR)
            || !isfinite(value))
            goto done;
        PyObject *head = PyList_GET_ITEM(heads, tid), *tail = PyList_GET_ITEM(tails, tid);
        if (!PyBytes_Check(head) || !PyBytes_Check(tail))
            goto done;
        PyObject *number = PyFloat_FromDouble(value);
        if (number == NULL) {
            rc = -1;
            goto done;
        }
        PyTuple_SET_ITEM(values, j, number);
        size += PyBytes_GET_SIZE(head) + PyBytes_GET_SIZE(tail);
    }
    /* "[a,b,...]": the numbers, w of them with w - 1 commas */
    if ((text = PyObject_CallOneArg(ENCODE, values)) == NULL) {
        rc = -1;
        goto done;
    }
    if (!PyBytes_Check(text) || PyBytes_GET_SIZE(text) < 2) {
        PyErr_SetString(PyExc_TypeError, "msgspec's encoder returned no JSON array");
        rc = -1;
        goto done;
    }
    const char *number = PyBytes_AS_STRING(text) + 1, *numbers_end = PyBytes_AS_STRING(text) + PyBytes_GET_SIZE(text) - 1;
    size += numbers_end - number - k;
    int32_t own;
    memcpy(&own, ids, 4);
    if (PySet_GET_SIZE(self->partial)) {  /* the next token's string would depend on this one: the context */
        PyObject *key = PyLong_FromLong(own);
        if (key == NULL) {
            rc = -1;
            goto done;
        }
        int in = PySet_Contains(self->partial, key);
        Py_DECREF(key);
        if (in != 0) {
            rc = in < 0 ? -1 : 0;
            goto done;
        }
    }
    PyObject *made = PyBytes_FromStringAndSize(NULL, size);
    if (made == NULL) {
        rc = -1;
        goto done;
    }
    char *out = PyBytes_AS_STRING(made);
    for (Py_ssize_t j = 0; j < w; j++) {
        int32_t tid;
        memcpy(&tid, ids + 4 * j, 4);
        PyObject *head = PyList_GET_ITEM(heads, tid), *tail = PyList_GET_ITEM(tails, tid);
        if (j > 1)
            *out++ = ',';
        memcpy(out, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head));
        out += PyBytes_GET_SIZE(head);
        const char *comma = memchr(number, ',', (size_t)(numbers_end - number));
        const char *ends = comma != NULL ? comma : numbers_end;
        if ((j < k) != (comma != NULL)) {  /* cannot be: one number per value, no commas in any */
            Py_DECREF(made);
            PyErr_SetString(PyExc_ValueError, "msgspec's encoder wrote another count of numbers");
            rc = -1;
            goto done;
        }
        memcpy(out, number, (size_t)(ends - number));
        out += ends - number;
        number = ends + 1;
        memcpy(out, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
        out += PyBytes_GET_SIZE(tail);
        if (j == 0) {
            memcpy(out, ",\"top_logprobs\":[", 17);
            out += 17;
        }
        else
            *out++ = '}';
    }
    memcpy(out, "]}", 2);
    *entry = made;
    rc = 1;
done:
    Py_XDECREF(values);
    Py_XDECREF(text);
    PyBuffer_Release(&view);
    Py_DECREF(holder);
    return rc;
}

/* The step of token `tid` at `now`: its chunk (b"" when it completes no character), None (a new
 * reference) for an added token or an id that is not an int (nothing done), NULL on an error. With
 * logprobs, `entry` is the token's (make_entry()): held for the next text when it has none, else the
 * chunk carries it after those held. */
static PyObject *
step_token(PlainStep *self, PyObject *tid, double now, PyObject *entry)
{
    if (!PyLong_Check(tid))
        Py_RETURN_NONE;
    int overflow;
    long long id = PyLong_AsLongLongAndOverflow(tid, &overflow);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    PyObject *pieces = self->pieces;
    const char *piece = "";
    Py_ssize_t piece_len = 0;
    /* An id past the table (or any int) decodes to nothing, as tokenizer.decode drops it. */
    if (!overflow && id >= 0 && id < PyList_GET_SIZE(pieces)) {
        PyObject *p = PyList_GET_ITEM(pieces, (Py_ssize_t)id);
        if (p == Py_None)
            Py_RETURN_NONE;  /* an added token: the Python step's (it closes the held bytes) */
        if (!PyBytes_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "a token's piece must be bytes");
            return NULL;
        }
        piece = PyBytes_AS_STRING(p);
        piece_len = PyBytes_GET_SIZE(p);
    }
    if (observe(self, now - self->last) < 0)
        return NULL;
    self->last = now;
    self->tokens += 1;

    /* held bytes + the piece, decoded as codecs.utf_8_decode(data, "replace", False) */
    Py_ssize_t held = PyBytes_GET_SIZE(self->pending);
    const char *data = piece;
    Py_ssize_t len = piece_len;
    char local[64];
    char *joined = NULL;
    if (held) {
        len = held + piece_len;
        joined = len <= (Py_ssize_t)sizeof(local) ? local : PyMem_Malloc((size_t)len);
        if (joined == NULL)
            return PyErr_NoMemory();
        memcpy(joined, PyBytes_AS_STRING(self->pending), (size_t)held);
        memcpy(joined + held, piece, (size_t)piece_len);
        data = joined;
    }
    Py_ssize_t used = 0;
    PyObject *text = PyUnicode_DecodeUTF8Stateful(data, len, "replace", &used);
    if (text == NULL)
        goto fail;
    if (used != len || held) {
        PyObject *rest = PyBytes_FromStringAndSize(data + used, len - used);
        if (rest == NULL) {
            Py_DECREF(text);
            goto fail;
        }
        Py_SETREF(self->pending, rest);
    }
    if (joined != NULL && joined != local)
        PyMem_Free(joined);
    if (PyUnicode_GET_LENGTH(text) == 0) {
        Py_DECREF(text);
        if (entry != NULL && PyList_Append(self->entries, entry) < 0)
            return NULL;
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    Py_ssize_t n;
    const unsigned char *utf8 = (const unsigned char *)PyUnicode_AsUTF8AndSize(text, &n);
    if (utf8 == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    Py_ssize_t plen = PyBytes_GET_SIZE(self->prefix), slen = PyBytes_GET_SIZE(self->suffix);
    /* with logprobs: the mid, the held entries and this one, a comma between each two */
    Py_ssize_t held_entries = entry != NULL ? PyList_GET_SIZE(self->entries) : 0;
    Py_ssize_t lsize = 0;
    if (entry != NULL) {
        lsize = PyBytes_GET_SIZE(self->mid) + PyBytes_GET_SIZE(entry) + held_entries;
        for (Py_ssize_t i = 0; i < held_entries; i++) {
            PyObject *e = PyList_GET_ITEM(self->entries, i);
            if (!PyBytes_Check(e)) {
                Py_DECREF(text);
                PyErr_SetString(PyExc_TypeError, "a held logprobs entry must be bytes");
                return NULL;
            }
            lsize += PyBytes_GET_SIZE(e);
        }
    }
    PyObject *chunk = PyBytes_FromStringAndSize(NULL, plen + escaped_size(utf8, n) + 2 + lsize + slen);
    if (chunk == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(chunk);
    memcpy(out, PyBytes_AS_STRING(self->prefix), (size_t)plen);
    out += plen;
    *out++ = '"';
    out = escape(out, utf8, n);
    *out++ = '"';
    Py_DECREF(text);
    if (entry != NULL) {
        memcpy(out, PyBytes_AS_STRING(self->mid), (size_t)PyBytes_GET_SIZE(self->mid));
        out += PyBytes_GET_SIZE(self->mid);
        for (Py_ssize_t i = 0; i < held_entries; i++) {
            PyObject *e = PyList_GET_ITEM(self->entries, i);
            memcpy(out, PyBytes_AS_STRING(e), (size_t)PyBytes_GET_SIZE(e));
            out += PyBytes_GET_SIZE(e);
            *out++ = ',';
        }
        memcpy(out, PyBytes_AS_STRING(entry), (size_t)PyBytes_GET_SIZE(entry));
        out += PyBytes_GET_SIZE(entry);
        if (held_entries && PyList_SetSlice(self->entries, 0, held_entries, NULL) < 0) {
            Py_DECREF(chunk);
            return NULL;
        }
    }
    memcpy(out, PyBytes_AS_STRING(self->suffix), (size_t)slen);
    return chunk;

fail:
    if (joined != NULL && joined != local)
        PyMem_Free(joined);
    return NULL;
}

/* A step with logprobs: its entry from `packed` made first (declined: None, nothing done), then the
 * token's step with it. */
static PyObject *
step_logprobs(PlainStep *self, PyObject *tid, double now, PyObject *packed, PyObject *raw_frames)
{
    PyObject *entry = NULL;
    int made = packed == Py_None ? 0 : make_entry(self, packed, raw_frames, &entry);
    if (made <= 0) {
        if (made < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *chunk = step_token(self, tid, now, entry);
    Py_DECREF(entry);
    return chunk;
}

static PyObject *
PlainStep_step(PlainStep *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != (self->heads != NULL ? 4 : 2)) {
        PyErr_SetString(PyExc_TypeError, self->heads != NULL ? "step(token_id, now, packed_logprobs, raw_frames)"
                                                              : "step(token_id, now)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (self->heads != NULL)
        return step_logprobs(self, args[0], now, args[2], args[3]);
    return step_token(self, args[0], now, NULL);
}

/* Interned attribute names, made at import. */
static PyObject *S_new_token_ids, *S_finish_reason, *S_generated, *S_body, *S_native_other, *S_native_failed;

/* `body` written at the pass's end after what was queued before in it (DirectStream._queue). */
static int
queue_body(PlainStep *self, PyObject *body)
{
    if (PyBytes_GET_SIZE(self->body) == 0) {
        if (self->writing == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "a PlainStep queued a body before bind()");
            return -1;
        }
        Py_SETREF(self->body, Py_NewRef(body));
        return PyList_Append(self->writing, (PyObject *)self);
    }
    PyObject *joined = PyNumber_Add(self->body, body);
    if (joined == NULL)
        return -1;
    Py_SETREF(self->body, joined);
    return 0;
}

static PyObject *
PlainStep_queue(PlainStep *self, PyObject *body)
{
    if (!PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "queue(body: bytes)");
        return NULL;
    }
    if (PyBytes_GET_SIZE(body) && queue_body(self, body) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The error set now, taken as its exception object (a new reference, its traceback on it) when it is an
 * Exception; NULL, the error left set, for the others (KeyboardInterrupt and the like go on up). */
static PyObject *
take_exception(void)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return exc;
}

/* InFlight.plain: (out, raw_frames, now) -> bool. A step of one token and no finish is made here and
 * queued on the owner; anything else (and an added token) is the owner's _native_other(out, raw_frames,
 * now); an error in the step is handed to the owner's _native_failed(exc), which fails that stream. */
static PyObject *
plain_call(PlainStep *self, PyObject *out, PyObject *raw_frames, PyObject *now_obj)
{
    if (self->owner == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a PlainStep called before bind()");
        return NULL;
    }
    PyObject *body = NULL;
    PyObject *ids = PyObject_GetAttr(out, S_new_token_ids);
    if (ids == NULL)
        goto failed;
    PyObject *finish = PyObject_GetAttr(out, S_finish_reason);
    if (finish == NULL) {
        Py_DECREF(ids);
        goto failed;
    }
    int one = finish == Py_None && PyList_Check(ids) && PyList_GET_SIZE(ids) == 1;
    Py_DECREF(finish);
    if (one) {
        double now = PyFloat_AsDouble(now_obj);
        if (now == -1.0 && PyErr_Occurred())
            body = NULL;
        else if (self->heads == NULL)
            body = step_token(self, PyList_GET_ITEM(ids, 0), now, NULL);
        else {  /* logprobs: the token's packed row, and no prompt's (else declined: the Python step's) */
            PyObject *packed = PyObject_GetAttr(out, S_packed_logprobs);
            PyObject *prompt = packed == NULL ? NULL : PyObject_GetAttr(out, S_packed_prompt_logprobs);
            if (prompt != NULL)
                body = step_logprobs(self, PyList_GET_ITEM(ids, 0), now, prompt == Py_None ? packed : Py_None,
                                     raw_frames);
            Py_XDECREF(prompt);
            Py_XDECREF(packed);
        }
    }
    Py_DECREF(ids);
    if (one && body == NULL)
        goto failed;
    if (!one || body == Py_None) {
        Py_XDECREF(body);
        PyObject *owner = Py_NewRef(self->owner);  /* held: the call may unbind this step */
        PyObject *args[] = {owner, out, raw_frames, now_obj};
        PyObject *r = PyObject_VectorcallMethod(S_native_other, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(owner);
        return r;
    }
    /* stream.generated += 1 */
    PyObject *generated = PyObject_GetAttr(self->inflight, S_generated);
    if (generated == NULL)
        goto failed;
    PyObject *more = PyNumber_Add(generated, ONE);
    Py_DECREF(generated);
    if (more == NULL || PyObject_SetAttr(self->inflight, S_generated, more) < 0) {
        Py_XDECREF(more);
        goto failed;
    }
    Py_DECREF(more);
    if (PyBytes_GET_SIZE(body) && queue_body(self, body) < 0)
        goto failed;
    Py_DECREF(body);
    Py_RETURN_TRUE;

failed:
    Py_XDECREF(body);
    PyObject *exc = take_exception();
    if (exc == NULL)
        return NULL;  /* KeyboardInterrupt and the like go on up */
    PyObject *owner = Py_NewRef(self->owner);
    PyObject *args[] = {owner, exc};
    PyObject *r = PyObject_VectorcallMethod(S_native_failed, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(owner);
    Py_DECREF(exc);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_TRUE;
}

static PyObject *
PlainStep_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "PlainStep(out, raw_frames, now): three positional arguments");
        return NULL;
    }
    return plain_call((PlainStep *)callable, args[0], args[1], args[2]);
}

/* bind(owner, inflight, writing, cycle, fd): what the step serves when called as InFlight.plain. */
static PyObject *
PlainStep_bind(PlainStep *self, PyObject *args)
{
    PyObject *owner, *inflight, *writing, *cycle, *transport = NULL, *write = NULL, *buffered = NULL,
        *closing = NULL;
    int fd;
    if (!PyArg_ParseTuple(args, "OOO!Oi:bind", &owner, &inflight, &PyList_Type, &writing, &cycle, &fd))
        return NULL;
    if (cycle != Py_None) {
        if ((transport = PyObject_GetAttr(cycle, S_transport)) == NULL
            || (write = PyObject_GetAttr(transport, S_write)) == NULL
            || (buffered = PyObject_GetAttr(transport, S_get_write_buffer_size)) == NULL
            || (closing = PyObject_GetAttr(transport, S_is_closing)) == NULL) {
            Py_XDECREF(transport);
            Py_XDECREF(write);
            Py_XDECREF(buffered);
            return NULL;
        }
    }
    Py_XSETREF(self->owner, Py_NewRef(owner));
    Py_XSETREF(self->inflight, Py_NewRef(inflight));
    Py_XSETREF(self->writing, Py_NewRef(writing));
    Py_XSETREF(self->cycle, cycle == Py_None ? NULL : Py_NewRef(cycle));
    Py_XSETREF(self->transport, transport);
    Py_XSETREF(self->write, write);
    Py_XSETREF(self->buffered, buffered);
    Py_XSETREF(self->closing, closing);
    self->fd = transport == NULL ? -1 : fd;
    Py_RETURN_NONE;
}

/* unbind() -> bytes: drop what bind() gave; what was queued and not written (b"" but for a bug). */
static PyObject *
PlainStep_unbind(PlainStep *self, PyObject *Py_UNUSED(ignored))
{
    PlainStep_clear(self);
    PyObject *body = self->body;
    self->body = Py_NewRef(EMPTY);
    return body;
}

static PyMethodDef PlainStep_methods[] = {
    {"bind", (PyCFunction)PlainStep_bind, METH_VARARGS,
     "bind(owner, inflight, writing, cycle, fd): the direct stream, its InFlight, the pass's write list, the "
     "response's uvicorn cycle (or None: the owner's outlet) and its socket (-1: through the transport)."},
    {"unbind", (PyCFunction)PlainStep_unbind, METH_NOARGS,
     "unbind() -> bytes: drop what bind() gave; what was queued and not written."},
    {"queue", (PyCFunction)PlainStep_queue, METH_O, "queue(body): written at the pass's end after the rest."},
    {"step", (PyCFunction)(void (*)(void))PlainStep_step, METH_FASTCALL,
     "step(token_id, now), with logprobs step(token_id, now, packed_logprobs, raw_frames): the chunk of this "
     "token's text (b\"\" when it completes no character), or None for a step it does not make (an added "
     "token; with logprobs, a row _chat_one would not make), nothing done."},
    {"load", (PyCFunction)PlainStep_load, METH_VARARGS,
     "load(tokens, last, pending, entries=()): the stream's state."},
    {"state", (PyCFunction)PlainStep_state, METH_NOARGS, "state() -> (tokens, last, pending, entries)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlainStepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "services.frontend.generation._plainc.PlainStep",
    .tp_basicsize = sizeof(PlainStep),
    .tp_dealloc = (destructor)PlainStep_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)PlainStep_traverse,
    .tp_clear = (inquiry)PlainStep_clear,
    .tp_vectorcall_offset = offsetof(PlainStep, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_doc = "A stream's plain steps in C (see the module's source).",
    .tp_methods = PlainStep_methods,
    .tp_new = PlainStep_new,
};

/* ---- the pass's writes (generation/direct_stream.py, _write_pass) ---- */

/* stream._outlet.put(body) for a direct stream: 1 written, 0 refused, -1 an error. */
static int
put_outlet(PyObject *stream, PyObject *body)
{
    PyObject *outlet = PyObject_GetAttr(stream, S_stream_outlet);
    if (outlet == NULL)
        return -1;
    PyObject *args[] = {outlet, body};
    PyObject *r = PyObject_VectorcallMethod(S_put, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(outlet);
    int rc = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    return rc;
}

/* `body` as one HTTP/1.1 chunk, in three pieces: the size in hex and CRLF (written into `head`, 24 bytes),
 * the body as it is, CRLF. The chunk's length. */
static Py_ssize_t
frame_chunk(PyObject *body, char *head, struct iovec *iov)
{
    Py_ssize_t n = PyBytes_GET_SIZE(body);
    int hn = snprintf(head, 24, "%zx\r\n", (size_t)n);
    iov[0].iov_base = head;
    iov[0].iov_len = (size_t)hn;
    iov[1].iov_base = PyBytes_AS_STRING(body);
    iov[1].iov_len = (size_t)n;
    iov[2].iov_base = (char *)"\r\n";
    iov[2].iov_len = 2;
    return hn + n + 2;
}

/* write(the framed chunk's bytes from `sent` on): one bytes object across the three pieces. 1 or -1. */
static int
write_rest(PyObject *write, const struct iovec *iov, Py_ssize_t total, Py_ssize_t sent)
{
    PyObject *rest = PyBytes_FromStringAndSize(NULL, total - sent);
    if (rest == NULL)
        return -1;
    char *out = PyBytes_AS_STRING(rest);
    Py_ssize_t at = 0;
    for (int i = 0; i < 3; i++) {
        Py_ssize_t len = (Py_ssize_t)iov[i].iov_len;
        if (at + len > sent) {
            Py_ssize_t from = sent > at ? sent - at : 0;
            memcpy(out, (char *)iov[i].iov_base + from, (size_t)(len - from));
            out += len - from;
        }
        at += len;
    }
    PyObject *r = PyObject_CallOneArg(write, rest);
    Py_DECREF(rest);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 1;
}

/* transport.write(body as one HTTP/1.1 chunk). 1 or -1. */
static int
write_chunk(PyObject *write, PyObject *body)
{
    char head[24];
    struct iovec iov[3];
    Py_ssize_t total = frame_chunk(body, head, iov);
    return write_rest(write, iov, total, 0);
}

/* HttpOutlet.put(body) on its cycle: 1 written, 0 refused (the flow paused, the client gone), -1 an error. */
static int
put_cycle(PyObject *cycle, PyObject *body)
{
    int rc = -1;
    PyObject *flow = NULL, *transport = NULL;
    if ((flow = PyObject_GetAttr(cycle, S_flow)) == NULL)
        goto done;
    PyObject *flag = PyObject_GetAttr(flow, S_write_paused);
    if (flag == NULL)
        goto done;
    int paused = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    if (paused < 0)
        goto done;
    if ((flag = PyObject_GetAttr(cycle, S_disconnected)) == NULL)
        goto done;
    int gone = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    if (gone < 0)
        goto done;
    if (paused || gone) {
        rc = 0;
        goto done;
    }
    if ((transport = PyObject_GetAttr(cycle, S_transport)) == NULL)
        goto done;
    PyObject *write = PyObject_GetAttr(transport, S_write);
    if (write == NULL)
        goto done;
    rc = write_chunk(write, body);
    Py_DECREF(write);
done:
    Py_XDECREF(transport);
    Py_XDECREF(flow);
    return rc;
}

/* An open transport holding nothing back: the chunk sent on its socket here (one sendmsg, the framing and
 * the body as they are, no copy); what the kernel did not take goes to the transport's write(), which holds
 * it and everything after it (the next passes see it hold bytes back, and write through it, in order).
 * An error (the peer gone) is the transport's too: its write() meets it and closes. 1 or -1. */
static int
send_chunk(PlainStep *step, PyObject *body)
{
    char head[24];
    struct iovec iov[3];
    Py_ssize_t total = frame_chunk(body, head, iov);
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = 3;
    ssize_t sent;
    do {
        sent = sendmsg(step->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent == total)
        return 1;
    if (sent < 0)
        sent = 0;  /* EAGAIN, or an error the transport's write() will meet and report */
    return write_rest(step->write, iov, total, sent);  /* what the kernel did not take */
}

/* A PlainStep's body: written at once where its transport holds nothing back and is open (then the flow
 * cannot be paused, as uvicorn pauses it only past the transport's high-water mark, and the client has
 * not gone, which closes the transport first); else put_cycle()'s checks; without a cycle, the owner's
 * outlet's put(). */
static int
put_step(PlainStep *step, PyObject *body)
{
    if (step->transport != NULL) {
        PyObject *size = PyObject_CallNoArgs(step->buffered);
        if (size == NULL)
            return -1;
        int empty = PyLong_Check(size) && PyLong_AsSsize_t(size) == 0;
        PyErr_Clear();  /* a size past any int is not 0 */
        Py_DECREF(size);
        if (empty) {
            PyObject *closing = PyObject_CallNoArgs(step->closing);
            if (closing == NULL)
                return -1;
            int open = closing == Py_False;
            Py_DECREF(closing);
            if (open)
                return step->fd >= 0 ? send_chunk(step, body) : write_chunk(step->write, body);
        }
        return put_cycle(step->cycle, body);
    }
    if (step->owner == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a PlainStep's body written after unbind()");
        return -1;
    }
    return put_outlet(step->owner, body);
}

/* A put's outcome `rc` for `who` (the stream): nothing when written (1); else (who, body, the exception or
 * None) appended to *refused. -1 (the error left set) on a failure of its own or an exception that is not
 * an Exception (KeyboardInterrupt and the like go on up). */
static int
record(PyObject **refused, int rc, PyObject *who, PyObject *body)
{
    if (rc == 1)
        return 0;
    PyObject *exc = NULL;
    if (rc < 0 && (exc = take_exception()) == NULL)
        return -1;
    PyObject *entry = PyTuple_Pack(3, who, body, exc == NULL ? Py_None : exc);
    Py_XDECREF(exc);
    if (entry == NULL)
        return -1;
    if (*refused == NULL && (*refused = PyList_New(0)) == NULL) {
        Py_DECREF(entry);
        return -1;
    }
    int rc2 = PyList_Append(*refused, entry);
    Py_DECREF(entry);
    return rc2;
}

/* write_pass(streams) -> list of (stream, body, exception or None) whose outlet took nothing, or None:
 * each stream's _body (emptied) put to its _outlet, an HttpOutlet's here, any other's by its put(). */
static PyObject *
write_pass(PyObject *module, PyObject *streams)
{
    if (!PyList_Check(streams)) {
        PyErr_SetString(PyExc_TypeError, "write_pass(streams: list)");
        return NULL;
    }
    PyObject *refused = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(streams); i++) {
        PyObject *stream = PyList_GET_ITEM(streams, i);
        Py_INCREF(stream);
        if (Py_TYPE(stream) == &PlainStepType) {  /* its own body and transport */
            PlainStep *step = (PlainStep *)stream;
            PyObject *body = step->body;
            step->body = Py_NewRef(EMPTY);
            int rc = put_step(step, body);
            int failed = record(&refused, rc, step->owner != NULL ? step->owner : Py_None, body);
            Py_DECREF(body);
            Py_DECREF(stream);
            if (failed < 0) {
                Py_XDECREF(refused);
                return NULL;
            }
            continue;
        }
        /* a direct stream with no C step (its outlet not uvicorn's: gRPC): its own body, its outlet's put() */
        PyObject *body = PyObject_GetAttr(stream, S_body);
        if (body == NULL || PyObject_SetAttr(stream, S_body, EMPTY) < 0) {
            Py_XDECREF(body);
            Py_DECREF(stream);
            Py_XDECREF(refused);
            return NULL;
        }
        int failed = record(&refused, put_outlet(stream, body), stream, body);
        Py_DECREF(body);
        Py_DECREF(stream);
        if (failed < 0) {
            Py_XDECREF(refused);
            return NULL;
        }
    }
    if (refused == NULL)
        Py_RETURN_NONE;
    return refused;
}

static PyMethodDef module_methods[] = {
    {"write_pass", (PyCFunction)write_pass, METH_O,
     "write_pass(streams): each stream's body to its outlet; the (stream, body, exception or None) refused."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef plainc_module = {
    PyModuleDef_HEAD_INIT, "_plainc", "The plain step of a streamed completion in C.", -1, module_methods, NULL,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__plainc(void)
{
    ONE = PyLong_FromLong(1);
    if (ONE == NULL)
        return NULL;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(S_new_token_ids, "new_token_ids");
    INTERN(S_finish_reason, "finish_reason");
    INTERN(S_generated, "generated");
    INTERN(S_body, "_body");
    INTERN(S_native_other, "_native_other");
    INTERN(S_native_failed, "_native_failed");
    INTERN(S_stream_outlet, "_outlet");
    INTERN(S_flow, "flow");
    INTERN(S_write_paused, "write_paused");
    INTERN(S_disconnected, "disconnected");
    INTERN(S_transport, "transport");
    INTERN(S_write, "write");
    INTERN(S_put, "put");
    INTERN(S_get_write_buffer_size, "get_write_buffer_size");
    INTERN(S_is_closing, "is_closing");
    INTERN(S_frame, "frame");
    INTERN(S_offset, "offset");
    INTERN(S_positions, "positions");
    INTERN(S_k, "k");
    INTERN(S_packed_logprobs, "packed_logprobs");
    INTERN(S_packed_prompt_logprobs, "packed_prompt_logprobs");
#undef INTERN
    if ((EMPTY = PyBytes_FromStringAndSize(NULL, 0)) == NULL)
        return NULL;
    PyObject *json = PyImport_ImportModule("msgspec.json");
    if (json == NULL)
        return NULL;
    PyObject *encoder = PyObject_CallMethod(json, "Encoder", NULL);
    Py_DECREF(json);
    if (encoder == NULL)
        return NULL;
    ENCODE = PyObject_GetAttrString(encoder, "encode");
    Py_DECREF(encoder);
    if (ENCODE == NULL)
        return NULL;
    if (PyType_Ready(&PlainStepType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&plainc_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "PlainStep", (PyObject *)&PlainStepType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
