/* The dispatch pass's loop over one Outputs message in C (engine_client/engines.py, EngineSet._on_outputs):
 * each output offered to its stream's InFlight.plain, a call through the callable's vectorcall (the C
 * plain step's own, generation/_plainc.c, or a Python method); what no plain step took is handed back for
 * the Python loop to feed, in order. Built by setup.py where a compiler is; engines.py loops in Python
 * without it (the same result: tests/unit/frontend/test_plainc.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *S_request_id, *S_plain;

/* dispatch(outputs, inflight, raw_frames, now) -> list of (InFlight, RequestOutput) not taken, or None */
static PyObject *
dispatch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dispatch(outputs: list, inflight: dict, raw_frames, now)");
        return NULL;
    }
    PyObject *outputs = args[0], *inflight = args[1];
    PyObject *left = NULL, *out, *stream;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); i++) {
        out = PyList_GET_ITEM(outputs, i);
        Py_INCREF(out);
        PyObject *rid = PyObject_GetAttr(out, S_request_id);
        if (rid == NULL)
            goto error_out;
        stream = PyDict_GetItemWithError(inflight, rid);
        Py_DECREF(rid);
        if (stream == NULL) {
            if (PyErr_Occurred())
                goto error_out;
            Py_DECREF(out);
            continue;  /* aborted by us meanwhile */
        }
        Py_INCREF(stream);
        PyObject *plain = PyObject_GetAttr(stream, S_plain);
        if (plain == NULL)
            goto error_stream;
        if (plain != Py_None) {
            PyObject *call[] = {out, args[2], args[3]};
            PyObject *r = PyObject_Vectorcall(plain, call, 3, NULL);
            Py_DECREF(plain);
            if (r == NULL)
                goto error_stream;
            int taken = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (taken < 0)
                goto error_stream;
            if (taken) {
                Py_DECREF(stream);
                Py_DECREF(out);
                continue;
            }
        } else {
            Py_DECREF(plain);
        }
        if (left == NULL && (left = PyList_New(0)) == NULL)
            goto error_stream;
        PyObject *pair = PyTuple_Pack(2, stream, out);
        Py_DECREF(stream);
        Py_DECREF(out);
        if (pair == NULL || PyList_Append(left, pair) < 0) {
            Py_XDECREF(pair);
            goto error;
        }
        Py_DECREF(pair);
    }
    if (left == NULL)
        Py_RETURN_NONE;
    return left;

error_stream:
    Py_DECREF(stream);
error_out:
    Py_DECREF(out);
error:
    Py_XDECREF(left);
    return NULL;
}

static PyMethodDef methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "dispatch(outputs, inflight, raw_frames, now): offer each output to its stream's plain step; the "
     "(stream, output) pairs none took, in order, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dispatch", "The dispatch pass's loop in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__dispatch(void)
{
    if ((S_request_id = PyUnicode_InternFromString("request_id")) == NULL
        || (S_plain = PyUnicode_InternFromString("plain")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
