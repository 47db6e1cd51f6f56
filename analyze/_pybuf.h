/*
 * The buffer helper of dlreplay's C extensions (analyze/trace/_pfwscan.c, analyze/_kernels.c).
 */
#ifndef DLREPLAY_PYBUF_H
#define DLREPLAY_PYBUF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A C-contiguous view of obj (writable when asked) whose length is a multiple of itemsize;
 * -1 with an exception set otherwise. */
static int get_buf(PyObject *obj, Py_buffer *b, Py_ssize_t itemsize, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, b, writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: buffer length is not a multiple of %zd", what, itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

#endif
