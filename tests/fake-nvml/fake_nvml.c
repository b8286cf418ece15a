/*
 * A fake NVIDIA driver: libnvidia-ml.so.1 for the integration tests
 * (tests/integration/nvml.rs), so that the real nvml-wrapper in ptraind runs
 * against answers a test controls. Built by the tests:
 *
 *   cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 *
 * Every answer comes from a state file, re-read on every call so a test can
 * change the "hardware" while ptraind runs (write a temporary file and
 * rename it over the state file, so no call sees half a file). The file is
 * $FAKE_NVML_STATE, else `state` next to this library (found with dladdr),
 * so a daemon started by systemd needs no environment of its own.
 *
 * Format: one setting a line, `#` starts a comment, unknown keys are ignored.
 *   driver 550.54.15          nvmlSystemGetDriverVersion
 *   init 9                    nvmlInit* returns this code (9: DRIVER_NOT_LOADED)
 *   count 2                   nvmlDeviceGetCount_v2
 *   N name NVIDIA H100 80GB HBM3   (the rest of the line)
 *   N uuid GPU-...
 *   N pci 00000000:17:00.0    bus id; domain, bus and device are parsed from it
 *   N minor 0                 minor number (the /dev/nvidiaN node)
 *   N memory TOTAL USED       in MiB (free = total - used, never below 0)
 *   N util GPU [MEM]          percent
 *   N temp C
 *   N proc PID MIB            a running compute process; repeat for more;
 *                             MIB `-` is "not available" (NVML_VALUE_NOT_AVAILABLE)
 *   N ecc COUNT               volatile uncorrected ECC errors
 *   N retire_pending 0|1      nvmlDeviceGetRetiredPagesPendingStatus
 *   N remap PENDING FAILED    nvmlDeviceGetRemappedRows (0|1 each)
 *   N numa NODE
 *   N topo M LEVEL            common ancestor with device M (NVML level: 0
 *                             internal, 10 single switch, 20 multiple, 30
 *                             host bridge, 40 NUMA node, 50 system)
 *   N lost 1                  every query on the device: NVML_ERROR_GPU_IS_LOST
 *   N error QUERY CODE        one query (name, uuid, pci, minor, memory, util,
 *                             temp, procs, ecc, retire, remap, numa, topo,
 *                             handle) returns CODE
 * A key left out of a device answers NVML_ERROR_NOT_SUPPORTED, as a real
 * driver does on boards without that counter (except name, uuid and pci,
 * which default to "Fake GPU N", a UUID derived from N and bus N).
 *
 * Only the entry points ptraind reaches through nvml-wrapper are here:
 * nvml-wrapper-sys loads each symbol on its own (a `Result` per symbol), so
 * a missing one fails only the call that needs it, as on an old driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 16
#define MAX_PROCS 16
#define MAX_ERRORS 8
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define UNSET -1LL

struct proc { unsigned pid; unsigned long long mib; };
struct err { char query[16]; int code; };
struct dev {
    char name[96], uuid[96], pci[32];
    long long minor, mem_total, mem_used, util_gpu, util_mem, temp, ecc, numa;
    long long retire_pending, remap_pending, remap_failed, lost;
    long long topo[MAX_DEVICES];
    int nprocs, nerrors;
    struct proc procs[MAX_PROCS];
    struct err errors[MAX_ERRORS];
};
struct state {
    char driver[80];
    int init_code;
    unsigned count;
    struct dev dev[MAX_DEVICES];
};

/* Handles are addresses in this array: index = handle - devices. */
struct fake_device { char unused; };
static struct fake_device devices[MAX_DEVICES];
static int initialised;

static const char *state_path(void) {
    static char path[4096];
    const char *env = getenv("FAKE_NVML_STATE");
    if (env && *env)
        return env;
    Dl_info info;
    if (!dladdr((void *)state_path, &info) || !info.dli_fname)
        return "state";
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    if (!slash)
        return "state";
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "state");
    return path;
}

static void copy_str(char *dst, size_t n, const char *src) {
    snprintf(dst, n, "%s", src);
    size_t len = strlen(dst);
    while (len && (dst[len - 1] == '\n' || dst[len - 1] == ' '))
        dst[--len] = 0;
}

/* Reads the state file into *s; 0 if it cannot be read. */
static int load(struct state *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->driver, sizeof s->driver, "550.54.15");
    for (int i = 0; i < MAX_DEVICES; i++) {
        struct dev *d = &s->dev[i];
        snprintf(d->name, sizeof d->name, "Fake GPU %d", i);
        snprintf(d->uuid, sizeof d->uuid, "GPU-fa4e0000-0000-4000-8000-%012d", i);
        snprintf(d->pci, sizeof d->pci, "00000000:%02X:00.0", i + 1);
        d->minor = i;
        d->mem_total = d->mem_used = d->util_gpu = d->util_mem = d->temp = UNSET;
        d->ecc = d->numa = d->retire_pending = d->remap_pending = d->remap_failed = UNSET;
        d->lost = 0;
        for (int j = 0; j < MAX_DEVICES; j++)
            d->topo[j] = UNSET;
    }
    FILE *f = fopen(state_path(), "r");
    if (!f)
        return 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char key[32];
        int idx, off = 0;
        if (sscanf(line, " driver %79s", s->driver) == 1)
            continue;
        if (sscanf(line, " init %d", &s->init_code) == 1)
            continue;
        if (sscanf(line, " count %u", &s->count) == 1) {
            if (s->count > MAX_DEVICES)
                s->count = MAX_DEVICES;
            continue;
        }
        if (sscanf(line, " %d %31s %n", &idx, key, &off) < 2 || idx < 0 || idx >= MAX_DEVICES)
            continue;
        struct dev *d = &s->dev[idx];
        const char *rest = line + off;
        long long a = UNSET, b = UNSET;
        char word[32];
        int n = sscanf(rest, "%lld %lld", &a, &b);
        if (!strcmp(key, "name")) copy_str(d->name, sizeof d->name, rest);
        else if (!strcmp(key, "uuid")) copy_str(d->uuid, sizeof d->uuid, rest);
        else if (!strcmp(key, "pci")) copy_str(d->pci, sizeof d->pci, rest);
        else if (!strcmp(key, "minor") && n >= 1) d->minor = a;
        else if (!strcmp(key, "memory") && n == 2) { d->mem_total = a; d->mem_used = b; }
        else if (!strcmp(key, "util") && n >= 1) { d->util_gpu = a; d->util_mem = n == 2 ? b : 0; }
        else if (!strcmp(key, "temp") && n >= 1) d->temp = a;
        else if (!strcmp(key, "ecc") && n >= 1) d->ecc = a;
        else if (!strcmp(key, "numa") && n >= 1) d->numa = a;
        else if (!strcmp(key, "retire_pending") && n >= 1) d->retire_pending = a;
        else if (!strcmp(key, "remap") && n == 2) { d->remap_pending = a; d->remap_failed = b; }
        else if (!strcmp(key, "lost") && n >= 1) d->lost = a;
        else if (!strcmp(key, "topo") && n == 2 && a >= 0 && a < MAX_DEVICES) d->topo[a] = b;
        else if (!strcmp(key, "proc") && d->nprocs < MAX_PROCS) {
            unsigned pid;
            if (sscanf(rest, "%u %31s", &pid, word) == 2) {
                d->procs[d->nprocs].pid = pid;
                d->procs[d->nprocs].mib = strcmp(word, "-") ? strtoull(word, NULL, 10) : NOT_AVAILABLE;
                d->nprocs++;
            }
        } else if (!strcmp(key, "error") && d->nerrors < MAX_ERRORS) {
            struct err *e = &d->errors[d->nerrors];
            if (sscanf(rest, "%15s %d", e->query, &e->code) == 2)
                d->nerrors++;
        }
    }
    fclose(f);
    return 1;
}

/*
 * Loads the state and finds the device behind `handle`; returns NVML_SUCCESS
 * or the error the query `query` must answer (uninitialised, bad handle,
 * unreadable state, lost GPU, or an injected error).
 */
static nvmlReturn_t lookup(nvmlDevice_t handle, const char *query, struct state *s, struct dev **d) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!load(s))
        return NVML_ERROR_UNKNOWN;
    long i = handle - devices;
    if (!handle || i < 0 || i >= (long)s->count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &s->dev[i];
    if ((*d)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    for (int e = 0; e < (*d)->nerrors; e++)
        if (!strcmp((*d)->errors[e].query, query))
            return (*d)->errors[e].code;
    return NVML_SUCCESS;
}

#define LOOKUP(query)                                  \
    struct state s;                                    \
    struct dev *d = NULL;                              \
    nvmlReturn_t rc = lookup(device, query, &s, &d);   \
    if (rc != NVML_SUCCESS)                            \
        return rc

static nvmlReturn_t put_str(char *buf, unsigned len, const char *value) {
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t do_init(void) {
    struct state s;
    if (!load(&s)) /* no state file: as if no driver were loaded */
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (s.init_code)
        return s.init_code;
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlInit(void) { return do_init(); }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return do_init(); }
nvmlReturn_t nvmlShutdown(void) { initialised = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned len) {
    struct state s;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!load(&s))
        return NVML_ERROR_UNKNOWN;
    return put_str(version, len, s.driver);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    struct state s;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!load(&s))
        return NVML_ERROR_UNKNOWN;
    *count = s.count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    struct state s;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!load(&s))
        return NVML_ERROR_UNKNOWN;
    if (index >= s.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* A lost GPU still has a handle; its queries fail. */
    for (int e = 0; e < s.dev[index].nerrors; e++)
        if (!strcmp(s.dev[index].errors[e].query, "handle"))
            return s.dev[index].errors[e].code;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned len) {
    LOOKUP("name");
    return put_str(name, len, d->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned len) {
    LOOKUP("uuid");
    return put_str(uuid, len, d->uuid);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned *minor) {
    LOOKUP("minor");
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned)d->minor;
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    LOOKUP("pci");
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    unsigned fn = 0;
    sscanf(d->pci, "%x:%x:%x.%x", &pci->domain, &pci->bus, &pci->device, &fn);
    snprintf(pci->busId, sizeof pci->busId, "%s", d->pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x",
             pci->domain & 0xffff, pci->bus, pci->device, fn);
    pci->pciDeviceId = 0x233010DE;
    pci->pciSubSystemId = 0x16C110DE;
    return NVML_SUCCESS;
}

#define MIB 1048576ULL

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static void memory(const struct dev *d, unsigned long long *total, unsigned long long *used,
                   unsigned long long *free) {
    *total = (unsigned long long)d->mem_total * MIB;
    *used = (unsigned long long)d->mem_used * MIB;
    *free = *used > *total ? 0 : *total - *used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    LOOKUP("memory");
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mem_total == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    memory(d, &m->total, &m->used, &m->free);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m) {
    LOOKUP("memory");
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The real driver checks the caller's struct version the same way. */
    if (m->version != (unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (d->mem_total == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    memory(d, &m->total, &m->used, &m->free);
    m->reserved = 0;
    return NVML_SUCCESS;
}

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    LOOKUP("util");
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->util_gpu == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = (unsigned)d->util_gpu;
    u->memory = (unsigned)d->util_mem;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned *temp) {
    LOOKUP("temp");
    if (!temp || sensor != 0) /* NVML_TEMPERATURE_GPU is the only sensor */
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->temp == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned)d->temp;
    return NVML_SUCCESS;
}

/* nvmlProcessInfo_v2_t, which the _v3 call fills. */
typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned *count,
                                                      nvmlProcessInfo_t *infos) {
    LOOKUP("procs");
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned have = (unsigned)d->nprocs;
    if (*count < have) {
        *count = have;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = have;
    if (have && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < have; i++) {
        infos[i].pid = d->procs[i].pid;
        infos[i].usedGpuMemory =
            d->procs[i].mib == NOT_AVAILABLE ? NOT_AVAILABLE : d->procs[i].mib * MIB;
        infos[i].gpuInstanceId = 0xFFFFFFFFu; /* not a MIG instance */
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    LOOKUP("ecc");
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->ecc == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    /* Uncorrected (1), volatile (0) is the counter the state sets; the
     * aggregate counter never drops below it; corrected errors stay 0. */
    *count = error_type == 1 && (counter_type == 0 || counter_type == 1)
                 ? (unsigned long long)d->ecc
                 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    LOOKUP("retire");
    if (!pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->retire_pending == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *pending = d->retire_pending ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned *corr, unsigned *unc,
                                       unsigned *pending, unsigned *failed) {
    LOOKUP("remap");
    if (!corr || !unc || !pending || !failed)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->remap_pending == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *corr = 0;
    *unc = d->remap_pending || d->remap_failed ? 1 : 0;
    *pending = d->remap_pending ? 1 : 0;
    *failed = d->remap_failed ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned *node) {
    LOOKUP("numa");
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->numa == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)d->numa;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device, nvmlDevice_t other,
                                                 int *level) {
    LOOKUP("topo");
    long j = other - devices;
    if (!level || !other || j < 0 || j >= (long)s.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (s.dev[j].lost)
        return NVML_ERROR_GPU_IS_LOST;
    /* Either side may carry the pair. */
    long long l = d->topo[j] != UNSET ? d->topo[j] : s.dev[j].topo[device - devices];
    if (l == UNSET)
        return NVML_ERROR_NOT_SUPPORTED;
    *level = (int)l;
    return NVML_SUCCESS;
}
