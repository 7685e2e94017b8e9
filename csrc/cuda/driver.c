/* The CUDA driver through dlopen: loading, errors, primary contexts, and
 * ordering and copies between streams and devices. The bottom of cuda/. */
#include "cuda/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "base/numpy_api.h"

/* ---------------------------------------------------------------------- */
/* Driver loading                                                          */
/* ---------------------------------------------------------------------- */

mg_cu_driver mg_cu;
_Thread_local CUcontext mg_cu_tls_context = NULL;
_Thread_local int mg_cu_tls_device = 0;

enum { DRIVER_UNTRIED, DRIVER_READY, DRIVER_MISSING, DRIVER_INIT_FAILED };

/* Process-wide; every access happens with the GIL held. */
static struct {
    int state;
    CUresult init_result;        /* cuInit's answer when state is DRIVER_INIT_FAILED */
    char missing[512];           /* why the library could not be used */
    int device_count;
    CUcontext primary[MG_CU_MAX_DEVICES];   /* retained once, never released */
} driver;

#define MG_CU_STR_(x) #x
#define MG_CU_STR(x) MG_CU_STR_(x)
/* `name` is macro-expanded before it reaches MG_CU_STR, so the symbol is the
 * versioned one cuda.h maps the plain name to. */
#define MG_CU_ENTRY(name, params) {MG_CU_STR(name), offsetof(mg_cu_driver, name)},
static const struct {
    const char *symbol;
    size_t offset;
} driver_symbols[] = {MG_CU_FUNCTIONS(MG_CU_ENTRY)};
#undef MG_CU_ENTRY

/* Older drivers (before 12.8) lack cuEventElapsedTime_v2; the first version
 * has the same signature and meaning. */
static void *resolve(void *library, const char *symbol)
{
    void *f = dlsym(library, symbol);
    if (f == NULL && strcmp(symbol, "cuEventElapsedTime_v2") == 0)
        f = dlsym(library, "cuEventElapsedTime");
    return f;
}

/* MLIRGPU_LIBCUDA names another driver library (a test double, an unusual
 * install); the default is the soname every driver installs. */
static int open_library(void)
{
    const char *path = getenv("MLIRGPU_LIBCUDA");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *why = dlerror();
        PyOS_snprintf(driver.missing, sizeof driver.missing, "%s", why ? why : "dlopen failed");
        return -1;
    }
    mg_cu_driver table;
    for (size_t i = 0; i < sizeof driver_symbols / sizeof driver_symbols[0]; i++) {
        void *f = resolve(library, driver_symbols[i].symbol);
        if (f == NULL) {
            PyOS_snprintf(driver.missing, sizeof driver.missing,
                          "%s has no %s: the driver is too old", path, driver_symbols[i].symbol);
            dlclose(library);
            return -1;
        }
        /* POSIX guarantees dlsym's object pointer holds a function pointer. */
        memcpy((char *)&table + driver_symbols[i].offset, &f, sizeof f);
    }
    mg_cu = table;
    return 0;   /* the library stays open for the life of the process */
}

/* ---------------------------------------------------------------------- */
/* Errors                                                                  */
/* ---------------------------------------------------------------------- */

/* Raises CudaError(message) with .code and .name set. Steals `message`. */
static int raise_cuda_error(long code, const char *name, PyObject *message)
{
    if (message == NULL)
        return -1;
    /* During interpreter teardown the module state may already be cleared. */
    PyObject *cls = (mg_st && mg_st->CudaError) ? mg_st->CudaError : PyExc_RuntimeError;
    PyObject *exc = PyObject_CallOneArg(cls, message);
    Py_DECREF(message);
    PyObject *code_obj = NULL, *name_obj = NULL;
    if (exc == NULL)
        goto error;
    code_obj = PyLong_FromLong(code);
    name_obj = PyUnicode_FromString(name);
    if (code_obj == NULL || name_obj == NULL ||
        PyObject_SetAttrString(exc, "code", code_obj) < 0 ||
        PyObject_SetAttrString(exc, "name", name_obj) < 0)
        goto error;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
error:
    Py_XDECREF(exc);
    Py_XDECREF(code_obj);
    Py_XDECREF(name_obj);
    return -1;
}

static int raise_no_driver(void)
{
    return raise_cuda_error(-1, "MLIRGPU_NO_DRIVER",
                            PyUnicode_FromFormat("no CUDA driver: %s", driver.missing));
}

/* ---- Faults ----
 * A kernel that faults (an illegal address, say) is reported by whatever
 * driver call comes next, and from then on by every call: the CUDA context
 * is dead. So the launch path notes, per stream, the last kernel launched,
 * and an error of that kind names it. Host programs note their launches
 * without the GIL: a mutex guards the table. */

#define MG_CU_LAST_LAUNCHES 64

static struct {
    CUstream stream;
    char kernel[128];
} last_launches[MG_CU_LAST_LAUNCHES];
static int last_launch_next, last_launch_any = -1;
static pthread_mutex_t last_launch_lock = PTHREAD_MUTEX_INITIALIZER;

void mg_cu_note_launch(CUstream stream, const char *kernel)
{
    pthread_mutex_lock(&last_launch_lock);
    int slot = -1;
    for (int i = 0; i < MG_CU_LAST_LAUNCHES && slot < 0; i++)
        if (last_launches[i].kernel[0] != '\0' && last_launches[i].stream == stream)
            slot = i;
    if (slot < 0) {
        slot = last_launch_next;
        last_launch_next = (last_launch_next + 1) % MG_CU_LAST_LAUNCHES;
    }
    last_launches[slot].stream = stream;
    /* a bounded copy: snprintf's formatting cost more than the rest of the launch's bookkeeping */
    size_t length = strnlen(kernel, sizeof last_launches[slot].kernel - 1);
    memcpy(last_launches[slot].kernel, kernel, length);
    last_launches[slot].kernel[length] = '\0';
    last_launch_any = slot;
    pthread_mutex_unlock(&last_launch_lock);
}

/* Errors after which the context is unusable: a kernel faulted. */
static int is_fault(CUresult r)
{
    switch ((int)r) {
    case 700: /* CUDA_ERROR_ILLEGAL_ADDRESS */
    case 702: /* CUDA_ERROR_LAUNCH_TIMEOUT */
    case 710: /* CUDA_ERROR_ASSERT */
    case 714: /* CUDA_ERROR_HARDWARE_STACK_ERROR */
    case 715: /* CUDA_ERROR_ILLEGAL_INSTRUCTION */
    case 716: /* CUDA_ERROR_MISALIGNED_ADDRESS */
    case 717: /* CUDA_ERROR_INVALID_ADDRESS_SPACE */
    case 718: /* CUDA_ERROR_INVALID_PC */
    case 719: /* CUDA_ERROR_LAUNCH_FAILED */
        return 1;
    default:
        return 0;
    }
}

static const char FAULT_ADVICE[] =
    "The CUDA context of this device is now unusable: every later call on it fails with this "
    "error. Recover by starting a new process. (The driver's primary-context reset, "
    "cuDevicePrimaryCtxReset, would free every DeviceArray, Stream, Event, Graph, loaded "
    "module and kernel made on the device; mlirgpu does not offer it.)";

static PyObject *fault_message_locked(const CUstream *stream);

/* Names the kernel that faulted: the driver reports a fault on whichever
 * call comes next, on any stream, so this names the last kernel launched on
 * the call's stream, and the last launched anywhere where that differs. */
static PyObject *fault_message(const CUstream *stream)
{
    pthread_mutex_lock(&last_launch_lock);
    PyObject *message = fault_message_locked(stream);
    pthread_mutex_unlock(&last_launch_lock);
    return message;
}

static PyObject *fault_message_locked(const CUstream *stream)
{
    int slot = -1;
    if (stream != NULL) {
        for (int i = 0; i < MG_CU_LAST_LAUNCHES && slot < 0; i++)
            if (last_launches[i].kernel[0] != '\0' && last_launches[i].stream == *stream)
                slot = i;
    }
    if (slot >= 0 && slot == last_launch_any)
        return PyUnicode_FromFormat("kernel '%s' (the last launched on this stream) faulted. %s",
                                    last_launches[slot].kernel, FAULT_ADVICE);
    if (slot >= 0)
        return PyUnicode_FromFormat("a kernel faulted: '%s' was the last launched on this stream, '%s' the "
                                    "last launched in this process. %s", last_launches[slot].kernel,
                                    last_launches[last_launch_any].kernel, FAULT_ADVICE);
    if (last_launch_any >= 0)
        return PyUnicode_FromFormat("kernel '%s' (the last launched in this process) faulted. %s",
                                    last_launches[last_launch_any].kernel, FAULT_ADVICE);
    return PyUnicode_FromFormat("a kernel faulted. %s", FAULT_ADVICE);
}

int mg_cu_raise(CUresult r, const char *what, const char *detail)
{
    return mg_cu_raise_on(r, what, detail, NULL);
}

int mg_cu_raise_on(CUresult r, const char *what, const char *detail, const CUstream *stream)
{
    const char *name = NULL, *text = NULL;
    if (mg_cu.cuGetErrorName != NULL) {
        mg_cu.cuGetErrorName(r, &name);
        mg_cu.cuGetErrorString(r, &text);
    }
    if (name == NULL)
        name = "CUDA_ERROR_UNKNOWN_CODE";
    if (text == NULL)
        text = "an error code this driver does not know";
    PyObject *message;
    if (detail != NULL && detail[0] != '\0')
        message = PyUnicode_FromFormat("%s failed: %s: %s\n%s", what, name, text, detail);
    else
        message = PyUnicode_FromFormat("%s failed: %s: %s", what, name, text);
    if (message != NULL && is_fault(r)) {
        PyObject *fault = fault_message(stream);
        PyObject *whole = fault != NULL ? PyUnicode_FromFormat("%U\n%U", message, fault) : NULL;
        Py_XDECREF(fault);
        Py_SETREF(message, whole);
    }
    return raise_cuda_error((long)r, name, message);
}

int mg_cu_check(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return 0;
    return mg_cu_raise(r, what, NULL);
}

int mg_cu_load(void)
{
    if (driver.state == DRIVER_READY)
        return 0;
    if (driver.state == DRIVER_UNTRIED) {
        if (open_library() < 0) {
            driver.state = DRIVER_MISSING;
        }
        else {
            CUresult r = mg_cu.cuInit(0);
            int count = 0;
            if (r == CUDA_SUCCESS)
                r = mg_cu.cuDeviceGetCount(&count);
            driver.init_result = r;
            driver.device_count = count < MG_CU_MAX_DEVICES ? count : MG_CU_MAX_DEVICES;
            driver.state = r == CUDA_SUCCESS ? DRIVER_READY : DRIVER_INIT_FAILED;
        }
    }
    if (driver.state == DRIVER_MISSING)
        return raise_no_driver();
    if (driver.state == DRIVER_INIT_FAILED)
        return mg_cu_raise(driver.init_result, "cuInit", NULL);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Contexts                                                                */
/* ---------------------------------------------------------------------- */

static int retain_primary(int device, CUcontext *out)
{
    if (mg_cu_load() < 0)
        return -1;
    if (device < 0 || device >= driver.device_count) {
        char detail[96];
        PyOS_snprintf(detail, sizeof detail, "device %d does not exist (%d devices)",
                      device, driver.device_count);
        return mg_cu_raise(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet", detail);
    }
    if (driver.primary[device] == NULL) {
        CUdevice handle;
        CUcontext context;
        if (mg_cu_check(mg_cu.cuDeviceGet(&handle, device), "cuDeviceGet") < 0 ||
            mg_cu_check(mg_cu.cuDevicePrimaryCtxRetain(&context, handle), "cuDevicePrimaryCtxRetain") < 0)
            return -1;
        driver.primary[device] = context;
    }
    *out = driver.primary[device];
    return 0;
}

int mg_cu_ensure_context_slow(void)
{
    CUcontext context;
    if (retain_primary(mg_cu_tls_device, &context) < 0 ||
        mg_cu_check(mg_cu.cuCtxSetCurrent(context), "cuCtxSetCurrent") < 0)
        return -1;
    mg_cu_tls_context = context;
    return 0;
}

int mg_cu_set_device(int device)
{
    CUcontext context;
    if (retain_primary(device, &context) < 0 ||
        mg_cu_check(mg_cu.cuCtxSetCurrent(context), "cuCtxSetCurrent") < 0)
        return -1;
    mg_cu_tls_device = device;
    mg_cu_tls_context = context;
    return 0;
}

int mg_cu_push(int device, int *pushed)
{
    *pushed = 0;
    if (mg_cu_ensure_context() < 0)
        return -1;
    if (device < 0 || device == mg_cu_tls_device)
        return 0;
    CUcontext context;
    if (retain_primary(device, &context) < 0 ||
        mg_cu_check(mg_cu.cuCtxPushCurrent(context), "cuCtxPushCurrent") < 0)
        return -1;
    *pushed = 1;
    return 0;
}

void mg_cu_pop(int pushed)
{
    CUcontext popped;
    if (pushed)
        mg_cu.cuCtxPopCurrent(&popped);
}

int mg_cu_push_quietly(int device)
{
    if (driver.state != DRIVER_READY || device < 0 || device >= driver.device_count ||
        driver.primary[device] == NULL)
        return -1;
    if (mg_cu_tls_context == driver.primary[device])
        return 0;
    return mg_cu.cuCtxPushCurrent(driver.primary[device]) == CUDA_SUCCESS ? 1 : -1;
}

int mg_cu_sole_device(void)
{
    return driver.state == DRIVER_READY && driver.device_count == 1 ? 0 : -1;
}

int mg_cu_pointer_device(CUdeviceptr pointer)
{
    if (mg_cu_ensure_context() < 0) {
        PyErr_Clear();   /* no driver: the view is unusable anyway, any ordinal will do */
        return mg_cu_tls_device;
    }
    int ordinal = 0;
    if (mg_cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer) != CUDA_SUCCESS)
        return mg_cu_tls_device;
    return ordinal;
}

int mg_cu_stream_capturing(CUstream stream)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return stream != NULL && mg_cu.cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS &&
           status != CU_STREAM_CAPTURE_STATUS_NONE;
}

int mg_cu_stream_order(CUstream producer, CUstream consumer)
{
    /* CU_STREAM_LEGACY and NULL name the same stream here. */
    if (producer == CU_STREAM_LEGACY)
        producer = NULL;
    if (consumer == CU_STREAM_LEGACY)
        consumer = NULL;
    if (producer == consumer)
        return 0;
    if (mg_cu_ensure_context() < 0)
        return -1;
    /* Work being captured runs only when its graph is launched: a capturing stream takes no
     * dependency on work outside the capture, and a stream outside it cannot wait for the
     * captured work (the driver refuses, and the capture is lost). */
    if (mg_cu_stream_capturing(consumer) != mg_cu_stream_capturing(producer))
        return 0;
    CUevent event = NULL;
    int status = -1;
    if (mg_cu_check(mg_cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate") < 0)
        goto error;
    if (mg_cu_check(mg_cu.cuEventRecord(event, producer), "cuEventRecord") < 0 ||
        mg_cu_check(mg_cu.cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent") < 0)
        goto error;
    status = 0;
error:
    /* Destroying a pending event is fine: the driver frees it once it fires. */
    if (event != NULL)
        mg_cu.cuEventDestroy(event);
    return status;
}

int mg_cu_stream_order_across(CUstream producer, int producer_device, CUstream consumer, int consumer_device)
{
    if (producer_device == consumer_device) {
        int pushed;
        if (mg_cu_push(producer_device, &pushed) < 0)
            return -1;
        int status = mg_cu_stream_order(producer, consumer);
        mg_cu_pop(pushed);
        return status;
    }
    CUevent event = NULL;
    int pushed, status = -1;
    if (mg_cu_push(producer_device, &pushed) < 0)
        return -1;
    /* An event, like a stream, belongs to the context that made it. */
    if (mg_cu_check(mg_cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate") < 0 ||
        mg_cu_check(mg_cu.cuEventRecord(event, producer), "cuEventRecord") < 0) {
        mg_cu_pop(pushed);
        goto error;
    }
    mg_cu_pop(pushed);
    if (mg_cu_push(consumer_device, &pushed) < 0)
        goto error;
    status = mg_cu_check(mg_cu.cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent");
    mg_cu_pop(pushed);
error:
    if (event != NULL)
        mg_cu.cuEventDestroy(event);
    return status;
}

/* Pairs (device, peer) whose peer access was enabled, or found impossible. */
static signed char peer_state[MG_CU_MAX_DEVICES][MG_CU_MAX_DEVICES];   /* 0 untried, 1 on, -1 impossible */

/* With `device`'s context current: lets it reach `peer`'s memory where the hardware allows. */
static int enable_peer_access(int device, int peer)
{
    if (peer_state[device][peer] != 0)
        return 0;
    CUdevice a, b;
    CUcontext peer_context;
    int can = 0;
    if (mg_cu_check(mg_cu.cuDeviceGet(&a, device), "cuDeviceGet") < 0 ||
        mg_cu_check(mg_cu.cuDeviceGet(&b, peer), "cuDeviceGet") < 0 ||
        mg_cu_check(mg_cu.cuDeviceCanAccessPeer(&can, a, b), "cuDeviceCanAccessPeer") < 0)
        return -1;
    if (can) {
        if (retain_primary(peer, &peer_context) < 0)
            return -1;
        /* Refused (too many peers, say): the copies are staged by the driver instead. */
        CUresult r = mg_cu.cuCtxEnablePeerAccess(peer_context, 0);
        can = r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    }
    peer_state[device][peer] = can ? 1 : -1;
    return 0;
}

int mg_cu_copy_peer(CUdeviceptr dst, int dst_device, CUdeviceptr src, int src_device, size_t nbytes,
                    CUstream stream)
{
    CUcontext dst_context, src_context;
    int pushed;
    if (retain_primary(dst_device, &dst_context) < 0 || retain_primary(src_device, &src_context) < 0 ||
        mg_cu_push(dst_device, &pushed) < 0)
        return -1;
    int status = -1;
    if (enable_peer_access(dst_device, src_device) == 0) {
        CUresult r;
        Py_BEGIN_ALLOW_THREADS
        r = mg_cu.cuMemcpyPeerAsync(dst, dst_context, src, src_context, nbytes, stream);
        Py_END_ALLOW_THREADS
        status = mg_cu_check(r, "cuMemcpyPeerAsync");
    }
    mg_cu_pop(pushed);
    return status;
}

int mg_cu_check_device(int device)
{
    if (mg_cu_load() < 0)
        return -1;
    if (device < 0 || device >= driver.device_count) {
        PyErr_Format(PyExc_ValueError, "device %d does not exist: there %s %d", device,
                     driver.device_count == 1 ? "is" : "are", driver.device_count);
        return -1;
    }
    return 0;
}

int mg_cu_init_refused(CUresult *result)
{
    *result = driver.init_result;
    return driver.state == DRIVER_INIT_FAILED;
}

int mg_cu_device_count(void)
{
    return driver.device_count;
}
