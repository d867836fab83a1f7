/* The plain step of a streamed completion in C: one token, no logprobs, no stop strings or parser.
 *
 * A PlainStep holds, while the direct stream takes a stream's steps from the dispatch pass
 * (generation/direct_stream.py), the per-token state the Python step keeps over four objects: the
 * detokenizer's held bytes (text/detokenizer.py, _ByteStream), the completion-token count and the time
 * of the last token (generation/output.py), the inter-token latency histogram's counts
 * (generation/metrics.py, BatchedHistogram: a list shared with it, the sum in its last slot) and the
 * SSE chunk's prefix and suffix (http_api/openai_bodies.py, ChunkWriter.text). step(token_id, now) does
 * what OutputProcessor._text_step and ChunkWriter.text do for that token and returns the chunk; the
 * Python path stays the reference (tests/unit/frontend/test_plainc.py holds both to the same bytes and
 * state) and the fallback where this module is not built. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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
} PlainStep;

static void
PlainStep_dealloc(PlainStep *self)
{
    Py_XDECREF(self->pieces);
    Py_XDECREF(self->counts);
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->suffix);
    Py_XDECREF(self->pending);
    PyMem_Free(self->bounds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
PlainStep_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"pieces", "bounds", "counts", "prefix", "suffix", NULL};
    PyObject *pieces, *bounds, *counts, *prefix, *suffix;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!SS:PlainStep", kwlist, &PyList_Type, &pieces,
                                     &bounds, &PyList_Type, &counts, &prefix, &suffix))
        return NULL;
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
    if (self->pending == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->tokens = 0;
    self->last = 0.0;
    return (PyObject *)self;
}

/* load(tokens, last, pending): take the stream's state from the Python objects. */
static PyObject *
PlainStep_load(PlainStep *self, PyObject *args)
{
    Py_ssize_t tokens;
    double last;
    PyObject *pending;
    if (!PyArg_ParseTuple(args, "ndS:load", &tokens, &last, &pending))
        return NULL;
    self->tokens = tokens;
    self->last = last;
    Py_SETREF(self->pending, Py_NewRef(pending));
    Py_RETURN_NONE;
}

/* state() -> (tokens, last, pending): the stream's state, for the Python objects. */
static PyObject *
PlainStep_state(PlainStep *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("ndO", self->tokens, self->last, self->pending);
}

/* The bytes msgspec.json encodes a str to, without the quotes: '"', '\\' and the control characters
 * escaped (\b \t \n \f \r by name, the rest as \u00XX), everything else as its UTF-8. */
static const char HEX[] = "0123456789abcdef";
static PyObject *ONE;  /* the int 1 */

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

static PyObject *
PlainStep_step(PlainStep *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "step(token_id, now)");
        return NULL;
    }
    PyObject *tid = args[0];
    if (!PyLong_Check(tid))
        Py_RETURN_NONE;
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
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
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    Py_ssize_t n;
    const unsigned char *utf8 = (const unsigned char *)PyUnicode_AsUTF8AndSize(text, &n);
    if (utf8 == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    Py_ssize_t plen = PyBytes_GET_SIZE(self->prefix), slen = PyBytes_GET_SIZE(self->suffix);
    PyObject *chunk = PyBytes_FromStringAndSize(NULL, plen + escaped_size(utf8, n) + 2 + slen);
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
    memcpy(out, PyBytes_AS_STRING(self->suffix), (size_t)slen);
    Py_DECREF(text);
    return chunk;

fail:
    if (joined != NULL && joined != local)
        PyMem_Free(joined);
    return NULL;
}

static PyMethodDef PlainStep_methods[] = {
    {"step", (PyCFunction)(void (*)(void))PlainStep_step, METH_FASTCALL,
     "step(token_id, now): the chunk of this token's text (b\"\" when it completes no character), or None "
     "for an added token, nothing done."},
    {"load", (PyCFunction)PlainStep_load, METH_VARARGS, "load(tokens, last, pending): the stream's state."},
    {"state", (PyCFunction)PlainStep_state, METH_NOARGS, "state() -> (tokens, last, pending)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlainStepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "services.frontend.generation._plainc.PlainStep",
    .tp_basicsize = sizeof(PlainStep),
    .tp_dealloc = (destructor)PlainStep_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A stream's plain steps in C (see the module's source).",
    .tp_methods = PlainStep_methods,
    .tp_new = PlainStep_new,
};

static struct PyModuleDef plainc_module = {
    PyModuleDef_HEAD_INIT, "_plainc", "The plain step of a streamed completion in C.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__plainc(void)
{
    ONE = PyLong_FromLong(1);
    if (ONE == NULL || PyType_Ready(&PlainStepType) < 0)
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
