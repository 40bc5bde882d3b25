/* The Python module ccbench.kernels._fused: the entry points of the fused host kernels
 * (fused_bfp.c, fused_cast.c; what they share is in fused_kernels.h).
 *
 * Built by `pip install` (an optional extension: without a C compiler the codecs run
 * their array-API kernels). Every entry point takes C-contiguous buffers (numpy arrays;
 * torch tensors through their numpy views), checks their sizes, and releases the GIL
 * while it runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fused_kernels.h"

/* Raised when the format or an entry point changes; the Python side checks it, so a stale
 * build is never used. */
#define KERNELS_VERSION 1

static int check_bfp(Py_ssize_t block, Py_ssize_t width, int rate) {
    if (rate < 2 || rate > 16 || block < 8 || block > 256 || block % 8 || width < 1 ||
        width > 256) {
        PyErr_SetString(PyExc_ValueError, "bfp: rate 2..16, block 8..256 (multiple of 8), "
                                          "width 1..256");
        return 0;
    }
    return 1;
}

static int check_size(Py_ssize_t have, Py_ssize_t need, const char *what) {
    if (have < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", what, have, need);
        return 0;
    }
    return 1;
}

static Py_ssize_t bfp_nbytes(Py_ssize_t n, Py_ssize_t block, int rate) {
    return (n + block - 1) / block * (1 + block * rate / 8);
}

/* What an entry point does: encode floats into a payload, decode a payload into floats,
 * or the reduce-scatter hop (decode, add the rank's own floats, encode the sums). */
typedef enum { ENCODE, DECODE, HOP } job;

/* One call's arguments. Its buffers by role: those its job does not take stay empty. */
typedef struct {
    Py_buffer floats;    /* read: encode's x, the hop's own */
    Py_buffer payload;   /* read: what decode and the hop decode */
    Py_buffer target;    /* written: decode's out, the hop's target */
    Py_buffer out;       /* written: the payload encode writes, the hop's (it may be empty) */
    int bfp;             /* 1: bfp in the format (block, width, rate); 0: a cast */
    Py_ssize_t block, width;
    int rate;
    int bfloat;          /* a cast: bfloat16, else float16 */
} call;

/* 1 when a call's format and buffer sizes are ones its kernel takes for n values, else 0
 * with a ValueError (checked in the order the arguments come). */
static int check_call(job j, const call *c, Py_ssize_t n) {
    if (c->bfp && !check_bfp(c->block, c->width, c->rate))
        return 0;
    const Py_ssize_t nbytes = c->bfp ? bfp_nbytes(n, c->block, c->rate) : 2 * n;
    return (j == ENCODE || check_size(c->payload.len, nbytes, "payload")) &&
           (j != HOP || check_size(c->floats.len, c->target.len, "own")) &&
           (j == DECODE || (j == HOP && c->out.len == 0) ||
            check_size(c->out.len, nbytes, "payload buffer"));
}

/* A call's kernel, run without the GIL. dest: the payload to write, NULL for none. */
static int kernel(job j, const call *c, Py_ssize_t n, uint8_t *dest, const bfp_format *f,
                  bfp_scratch *s) {
    switch (j) {
    case ENCODE:
        return c->bfp ? bfp_encode(f, c->floats.buf, n, dest, s)
                      : cast_encode(c->floats.buf, n, dest, c->bfloat);
    case DECODE:
        if (c->bfp)
            bfp_decode(f, c->payload.buf, c->target.buf, n, s);
        else
            cast_decode(c->payload.buf, c->target.buf, n, c->bfloat);
        return 1;
    default:
        return c->bfp ? bfp_decode_add_encode(f, c->payload.buf, c->floats.buf,
                                              c->target.buf, n, dest, s)
                      : cast_decode_add_encode(c->payload.buf, c->floats.buf, c->target.buf,
                                               n, dest, c->bfloat);
    }
}

/* What every entry point does once it has parsed its arguments: checks them, sets up
 * the bfp format and scratch, runs the kernel with the GIL released, releases the
 * buffers. Returns the kernel's bool (None from a decode), NULL with an error set. */
static PyObject *run(job j, call *c) {
    const Py_ssize_t n = (j == ENCODE ? c->floats.len : c->target.len) / 4;
    uint8_t *dest = j == ENCODE || c->out.len ? c->out.buf : NULL;
    bfp_format f;
    bfp_scratch s;
    s.q = NULL;
    s.tile = NULL;
    int ok = 0, ready = check_call(j, c, n);
    if (ready && c->bfp) {
        bfp_format_init(&f, c->block, c->width, c->rate);
        if (!scratch_init(&s, c->block * c->width)) {
            PyErr_NoMemory();
            ready = 0;
        }
    }
    if (ready) {
        Py_BEGIN_ALLOW_THREADS
        ok = kernel(j, c, n, dest, &f, &s);
        Py_END_ALLOW_THREADS
    }
    scratch_free(&s);
    PyBuffer_Release(&c->floats);
    PyBuffer_Release(&c->payload);
    PyBuffer_Release(&c->target);
    PyBuffer_Release(&c->out);
    if (PyErr_Occurred())
        return NULL;
    if (j == DECODE)
        Py_RETURN_NONE;
    return PyBool_FromLong(ok);
}

/* An entry point: its arguments parsed into a call (the methods' docstrings below name
 * them), then run. */
#define ENTRY(name, what, is_bfp, format, ...)               \
    static PyObject *name(PyObject *self, PyObject *args) {  \
        call c = {.bfp = is_bfp};                            \
        if (!PyArg_ParseTuple(args, format, __VA_ARGS__))    \
            return NULL;                                     \
        return run(what, &c);                                \
    }

ENTRY(py_bfp_encode, ENCODE, 1, "y*w*nni", &c.floats, &c.out, &c.block, &c.width, &c.rate)
ENTRY(py_bfp_decode, DECODE, 1, "y*w*nni", &c.payload, &c.target, &c.block, &c.width, &c.rate)
ENTRY(py_bfp_decode_add_encode, HOP, 1, "y*y*w*w*nni", &c.payload, &c.floats, &c.target, &c.out,
      &c.block, &c.width, &c.rate)
ENTRY(py_cast_encode, ENCODE, 0, "y*w*p", &c.floats, &c.out, &c.bfloat)
ENTRY(py_cast_decode, DECODE, 0, "y*w*p", &c.payload, &c.target, &c.bfloat)
ENTRY(py_cast_decode_add_encode, HOP, 0, "y*y*w*w*p", &c.payload, &c.floats, &c.target, &c.out,
      &c.bfloat)

/* f16c(enabled) -> bool: switch the F16C float16 path on or off (tests compare it with
 * the integer code); returns whether it was on. Off where the CPU lacks it. */
static PyObject *py_f16c(PyObject *self, PyObject *args) {
    int enabled;
    if (!PyArg_ParseTuple(args, "p", &enabled))
        return NULL;
    return PyBool_FromLong(cast_f16c(enabled));
}

static PyMethodDef methods[] = {
    {"bfp_encode", py_bfp_encode, METH_VARARGS,
     "bfp_encode(x, out, block, width, rate) -> False if a value is out of range"},
    {"bfp_decode", py_bfp_decode, METH_VARARGS, "bfp_decode(payload, out, block, width, rate)"},
    {"bfp_decode_add_encode", py_bfp_decode_add_encode, METH_VARARGS,
     "bfp_decode_add_encode(payload, own, target, out, block, width, rate): target = "
     "decode(payload) + own, encoded into out unless it is empty; False if out of range"},
    {"cast_encode", py_cast_encode, METH_VARARGS,
     "cast_encode(x, out, bfloat) -> False if a value does not fit"},
    {"cast_decode", py_cast_decode, METH_VARARGS, "cast_decode(payload, out, bfloat)"},
    {"cast_decode_add_encode", py_cast_decode_add_encode, METH_VARARGS,
     "cast_decode_add_encode(payload, own, target, out, bfloat) -> False if out of range"},
    {"f16c", py_f16c, METH_VARARGS,
     "f16c(enabled) -> whether the F16C float16 path was on (for tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fused",
    "Fused host kernels of the bfp, fp16 and bf16 codecs (see kernels/fused_kernels.h).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fused(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", KERNELS_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
