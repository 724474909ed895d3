/*
 * simnvml: a simulated NVIDIA Management Library for the lab's GPU VMs.
 *
 * Built by the lab's set-up as libnvidia-ml.so.1 (gcc -shared); nvidia-ml-py loads
 * it as it would load the driver's library, so the real binding and slurm-burst's
 * GPU check run end to end on machines without a GPU. It exports, under the names
 * (and version suffixes) the binding looks up, the NVML calls the check and the
 * telemetry make; any other call is simply absent (the binding then raises
 * FUNCTION_NOT_FOUND, as with an old driver).
 *
 * The simulated GPUs are read at nvmlInit from a text file, SIMNVML_STATE or
 * /run/simgpu/nvml.state, one "key value" per line ('#' starts a comment):
 *
 *   count 2                       GPUs NVML sees
 *   name NVIDIA A100-SXM4-80GB    model (every GPU)
 *   driver 550.54.15              driver version
 *   cuda 12040                    highest CUDA the driver supports (1000*major + 10*minor)
 *   arch ampere                   ampere (and later): row remapping, no page retirement;
 *                                 volta: page retirement, no row remapping
 *   ecc 1                         0: ECC counters are NOT_SUPPORTED (a consumer GPU)
 *   not_supported NAME[,NAME]     these calls answer NOT_SUPPORTED
 *   gpuN.KEY VALUE                per GPU: util, mem_util, mem_total, mem_used (bytes),
 *                                 power_mw, temp, slowdown_temp, ecc_uncorrected,
 *                                 remap_pending, remap_failure, retired_pending,
 *                                 clocks_event (bit mask), xid (delivered once to an
 *                                 event set registered for XID events), minor, lost
 *
 * A file that cannot be read makes nvmlInit fail with DRIVER_NOT_LOADED, as a node
 * without a loaded driver does. When SIMNVML_CALLS names a file, nvmlShutdown writes
 * "FUNCTION COUNT" for every call made since nvmlInit (tests count the check's calls).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUCCESS 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_TIMEOUT 10
#define ERR_GPU_IS_LOST 15
#define ERR_UNKNOWN 999

#define MAX_GPUS 16
#define XID_EVENT 0x8ULL
#define SUPPORTED_EVENTS (0x1ULL | 0x2ULL | 0x8ULL | 0x400ULL | 0x800ULL)

typedef struct {
    unsigned index, minor, util, mem_util, power_mw, temp, slowdown_temp;
    unsigned remap_pending, remap_failure, retired_pending, lost;
    unsigned long long mem_total, mem_used, ecc_uncorrected, clocks_event, xid;
    char name[96];
} gpu_t;

typedef struct {
    unsigned long long mask[MAX_GPUS];
    int delivered[MAX_GPUS];
} event_set_t;

typedef struct {
    gpu_t *device;
    unsigned long long type, data;
    unsigned gi, ci;
} event_data_t;

static gpu_t gpus[MAX_GPUS];
static unsigned gpu_count;
static int initialized;
static int volta;
static int ecc = 1;
static unsigned cuda = 12040;
static char driver[80] = "550.54.15";
static char not_supported[1024];

/* call counting: one slot per exported function */
static const char *call_names[64];
static unsigned long call_counts[64];
static int call_slots;

static void count_call(const char *name) {
    int i;
    for (i = 0; i < call_slots; i++)
        if (strcmp(call_names[i], name) == 0) {
            call_counts[i]++;
            return;
        }
    if (call_slots < 64) {
        call_names[call_slots] = name;
        call_counts[call_slots++] = 1;
    }
}

static int unsupported(const char *name) {
    const char *p = not_supported;
    size_t n = strlen(name);
    while ((p = strstr(p, name)) != NULL) {
        int starts = p == not_supported || p[-1] == ',';
        int ends = p[n] == '\0' || p[n] == ',';
        if (starts && ends)
            return 1;
        p += n;
    }
    return 0;
}

#define ENTER(fn)                            \
    count_call(#fn);                         \
    if (!initialized)                        \
        return ERR_UNINITIALIZED;            \
    if (unsupported(#fn))                    \
        return ERR_NOT_SUPPORTED;

#define DEVICE(fn, h)                        \
    ENTER(fn)                                \
    if ((h) == NULL)                         \
        return ERR_INVALID_ARGUMENT;         \
    if ((h)->lost)                           \
        return ERR_GPU_IS_LOST;

static void defaults(void) {
    unsigned i;
    memset(gpus, 0, sizeof gpus);
    for (i = 0; i < MAX_GPUS; i++) {
        gpus[i].index = gpus[i].minor = i;
        gpus[i].mem_total = 85899345920ULL; /* 80 GiB */
        gpus[i].power_mw = 60000;
        gpus[i].temp = 34;
        gpus[i].slowdown_temp = 90;
        gpus[i].clocks_event = 0x1; /* idle */
        strcpy(gpus[i].name, "NVIDIA A100-SXM4-80GB");
    }
    gpu_count = 0;
    volta = 0;
    ecc = 1;
    cuda = 12040;
    strcpy(driver, "550.54.15");
    not_supported[0] = '\0';
}

static void set_gpu(gpu_t *g, const char *key, const char *value) {
    unsigned long long v = strtoull(value, NULL, 0);
    if (strcmp(key, "util") == 0) g->util = (unsigned)v;
    else if (strcmp(key, "mem_util") == 0) g->mem_util = (unsigned)v;
    else if (strcmp(key, "mem_total") == 0) g->mem_total = v;
    else if (strcmp(key, "mem_used") == 0) g->mem_used = v;
    else if (strcmp(key, "power_mw") == 0) g->power_mw = (unsigned)v;
    else if (strcmp(key, "temp") == 0) g->temp = (unsigned)v;
    else if (strcmp(key, "slowdown_temp") == 0) g->slowdown_temp = (unsigned)v;
    else if (strcmp(key, "ecc_uncorrected") == 0) g->ecc_uncorrected = v;
    else if (strcmp(key, "remap_pending") == 0) g->remap_pending = (unsigned)v;
    else if (strcmp(key, "remap_failure") == 0) g->remap_failure = (unsigned)v;
    else if (strcmp(key, "retired_pending") == 0) g->retired_pending = (unsigned)v;
    else if (strcmp(key, "clocks_event") == 0) g->clocks_event = v;
    else if (strcmp(key, "xid") == 0) g->xid = v;
    else if (strcmp(key, "minor") == 0) g->minor = (unsigned)v;
    else if (strcmp(key, "lost") == 0) g->lost = (unsigned)v;
    else if (strcmp(key, "name") == 0) snprintf(g->name, sizeof g->name, "%s", value);
}

static int load_state(void) {
    const char *path = getenv("SIMNVML_STATE");
    char line[512];
    FILE *f;
    defaults();
    f = fopen(path && *path ? path : "/run/simgpu/nvml.state", "r");
    if (f == NULL)
        return ERR_DRIVER_NOT_LOADED;
    while (fgets(line, sizeof line, f) != NULL) {
        char *key = line, *value, *end;
        unsigned i;
        line[strcspn(line, "#\r\n")] = '\0';
        while (*key == ' ' || *key == '\t') key++;
        value = key + strcspn(key, " \t");
        if (*value) *value++ = '\0';
        while (*value == ' ' || *value == '\t') value++;
        end = value + strlen(value);
        while (end > value && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (*key == '\0') continue;
        if (strcmp(key, "count") == 0) {
            gpu_count = (unsigned)strtoul(value, NULL, 10);
            if (gpu_count > MAX_GPUS) gpu_count = MAX_GPUS;
        } else if (strcmp(key, "name") == 0) {
            for (i = 0; i < MAX_GPUS; i++) snprintf(gpus[i].name, sizeof gpus[i].name, "%s", value);
        } else if (strcmp(key, "driver") == 0) {
            snprintf(driver, sizeof driver, "%s", value);
        } else if (strcmp(key, "cuda") == 0) {
            cuda = (unsigned)strtoul(value, NULL, 10);
        } else if (strcmp(key, "arch") == 0) {
            volta = strcmp(value, "volta") == 0;
        } else if (strcmp(key, "ecc") == 0) {
            ecc = atoi(value) != 0;
        } else if (strcmp(key, "not_supported") == 0) {
            snprintf(not_supported, sizeof not_supported, "%s", value);
        } else if (strncmp(key, "gpu", 3) == 0) {
            char *dot;
            unsigned long n = strtoul(key + 3, &dot, 10);
            if (*dot == '.' && n < MAX_GPUS) set_gpu(&gpus[n], dot + 1, value);
        }
    }
    fclose(f);
    return SUCCESS;
}

static int copy_string(char *out, unsigned length, const char *value) {
    if (out == NULL) return ERR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return ERR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return SUCCESS;
}

/* -- init, shutdown, errors ------------------------------------------------------ */
int nvmlInitWithFlags(unsigned flags) {
    int rc;
    (void)flags;
    call_slots = 0;
    count_call("nvmlInitWithFlags");
    rc = load_state();
    if (rc == SUCCESS) initialized = 1;
    return rc;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    const char *path = getenv("SIMNVML_CALLS");
    count_call("nvmlShutdown");
    if (!initialized) return ERR_UNINITIALIZED;
    initialized = 0;
    if (path && *path) {
        FILE *f = fopen(path, "w");
        int i;
        if (f != NULL) {
            for (i = 0; i < call_slots; i++) fprintf(f, "%s %lu\n", call_names[i], call_counts[i]);
            fclose(f);
        }
    }
    return SUCCESS;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case SUCCESS: return "Success";
    case ERR_UNINITIALIZED: return "Uninitialized";
    case ERR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERR_NOT_SUPPORTED: return "Not Supported";
    case ERR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case ERR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case ERR_TIMEOUT: return "Timeout";
    case ERR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

/* -- system ---------------------------------------------------------------------- */
int nvmlSystemGetDriverVersion(char *version, unsigned length) {
    ENTER(nvmlSystemGetDriverVersion)
    return copy_string(version, length, driver);
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER(nvmlSystemGetCudaDriverVersion)
    if (version == NULL) return ERR_INVALID_ARGUMENT;
    *version = (int)cuda;
    return SUCCESS;
}

int nvmlSystemGetCudaDriverVersion_v2(int *version) {
    ENTER(nvmlSystemGetCudaDriverVersion_v2)
    if (version == NULL) return ERR_INVALID_ARGUMENT;
    *version = (int)cuda;
    return SUCCESS;
}

/* -- devices --------------------------------------------------------------------- */
int nvmlDeviceGetCount_v2(unsigned *count) {
    ENTER(nvmlDeviceGetCount_v2)
    if (count == NULL) return ERR_INVALID_ARGUMENT;
    *count = gpu_count;
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, gpu_t **device) {
    ENTER(nvmlDeviceGetHandleByIndex_v2)
    if (device == NULL || index >= gpu_count) return ERR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return gpus[index].lost ? ERR_GPU_IS_LOST : SUCCESS;
}

int nvmlDeviceGetName(gpu_t *d, char *name, unsigned length) {
    DEVICE(nvmlDeviceGetName, d)
    return copy_string(name, length, d->name);
}

int nvmlDeviceGetUUID(gpu_t *d, char *uuid, unsigned length) {
    char value[96];
    DEVICE(nvmlDeviceGetUUID, d)
    snprintf(value, sizeof value, "GPU-5157a000-0000-4000-8000-%012u", d->index);
    return copy_string(uuid, length, value);
}

int nvmlDeviceGetIndex(gpu_t *d, unsigned *index) {
    DEVICE(nvmlDeviceGetIndex, d)
    if (index == NULL) return ERR_INVALID_ARGUMENT;
    *index = d->index;
    return SUCCESS;
}

int nvmlDeviceGetMinorNumber(gpu_t *d, unsigned *minor) {
    DEVICE(nvmlDeviceGetMinorNumber, d)
    if (minor == NULL) return ERR_INVALID_ARGUMENT;
    *minor = d->minor;
    return SUCCESS;
}

int nvmlDeviceGetTotalEccErrors(gpu_t *d, int error_type, int counter_type,
                                unsigned long long *count) {
    DEVICE(nvmlDeviceGetTotalEccErrors, d)
    (void)counter_type;
    if (!ecc) return ERR_NOT_SUPPORTED;
    if (count == NULL) return ERR_INVALID_ARGUMENT;
    *count = error_type == 1 ? d->ecc_uncorrected : 0;
    return SUCCESS;
}

int nvmlDeviceGetRemappedRows(gpu_t *d, unsigned *corrected, unsigned *uncorrected,
                              unsigned *pending, unsigned *failure) {
    DEVICE(nvmlDeviceGetRemappedRows, d)
    if (volta) return ERR_NOT_SUPPORTED;
    if (!corrected || !uncorrected || !pending || !failure) return ERR_INVALID_ARGUMENT;
    *corrected = 0;
    *uncorrected = d->remap_pending || d->remap_failure ? 1 : 0;
    *pending = d->remap_pending ? 1 : 0;
    *failure = d->remap_failure ? 1 : 0;
    return SUCCESS;
}

int nvmlDeviceGetRetiredPagesPendingStatus(gpu_t *d, int *pending) {
    DEVICE(nvmlDeviceGetRetiredPagesPendingStatus, d)
    if (!volta) return ERR_NOT_SUPPORTED;
    if (pending == NULL) return ERR_INVALID_ARGUMENT;
    *pending = d->retired_pending ? 1 : 0;
    return SUCCESS;
}

int nvmlDeviceGetTemperature(gpu_t *d, int sensor, unsigned *temp) {
    DEVICE(nvmlDeviceGetTemperature, d)
    if (sensor != 0 || temp == NULL) return ERR_INVALID_ARGUMENT;
    *temp = d->temp;
    return SUCCESS;
}

int nvmlDeviceGetTemperatureThreshold(gpu_t *d, int threshold, unsigned *temp) {
    DEVICE(nvmlDeviceGetTemperatureThreshold, d)
    if (temp == NULL) return ERR_INVALID_ARGUMENT;
    if (threshold == 0) *temp = d->slowdown_temp + 5; /* shutdown */
    else if (threshold == 1) *temp = d->slowdown_temp;
    else return ERR_NOT_SUPPORTED;
    return SUCCESS;
}

int nvmlDeviceGetCurrentClocksEventReasons(gpu_t *d, unsigned long long *reasons) {
    DEVICE(nvmlDeviceGetCurrentClocksEventReasons, d)
    if (reasons == NULL) return ERR_INVALID_ARGUMENT;
    *reasons = d->clocks_event;
    return SUCCESS;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(gpu_t *d, unsigned long long *reasons) {
    DEVICE(nvmlDeviceGetCurrentClocksThrottleReasons, d)
    if (reasons == NULL) return ERR_INVALID_ARGUMENT;
    *reasons = d->clocks_event;
    return SUCCESS;
}

int nvmlDeviceGetUtilizationRates(gpu_t *d, unsigned *rates) {
    DEVICE(nvmlDeviceGetUtilizationRates, d)
    if (rates == NULL) return ERR_INVALID_ARGUMENT;
    rates[0] = d->util;     /* nvmlUtilization_t { gpu, memory } */
    rates[1] = d->mem_util;
    return SUCCESS;
}

int nvmlDeviceGetMemoryInfo(gpu_t *d, unsigned long long *memory) {
    DEVICE(nvmlDeviceGetMemoryInfo, d)
    if (memory == NULL) return ERR_INVALID_ARGUMENT;
    memory[0] = d->mem_total; /* nvmlMemory_t { total, free, used } */
    memory[1] = d->mem_total > d->mem_used ? d->mem_total - d->mem_used : 0;
    memory[2] = d->mem_used;
    return SUCCESS;
}

int nvmlDeviceGetPowerUsage(gpu_t *d, unsigned *milliwatts) {
    DEVICE(nvmlDeviceGetPowerUsage, d)
    if (milliwatts == NULL) return ERR_INVALID_ARGUMENT;
    *milliwatts = d->power_mw;
    return SUCCESS;
}

/* -- events ---------------------------------------------------------------------- */
int nvmlEventSetCreate(event_set_t **set) {
    ENTER(nvmlEventSetCreate)
    if (set == NULL) return ERR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? SUCCESS : ERR_UNKNOWN;
}

int nvmlDeviceGetSupportedEventTypes(gpu_t *d, unsigned long long *types) {
    DEVICE(nvmlDeviceGetSupportedEventTypes, d)
    if (types == NULL) return ERR_INVALID_ARGUMENT;
    *types = SUPPORTED_EVENTS;
    return SUCCESS;
}

int nvmlDeviceRegisterEvents(gpu_t *d, unsigned long long types, event_set_t *set) {
    DEVICE(nvmlDeviceRegisterEvents, d)
    if (set == NULL) return ERR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS) return ERR_NOT_SUPPORTED;
    set->mask[d->index] |= types;
    return SUCCESS;
}

int nvmlEventSetWait_v2(event_set_t *set, event_data_t *data, unsigned timeout_ms) {
    unsigned i;
    struct timespec ts;
    ENTER(nvmlEventSetWait_v2)
    if (set == NULL || data == NULL) return ERR_INVALID_ARGUMENT;
    for (i = 0; i < gpu_count; i++) {
        if ((set->mask[i] & XID_EVENT) && gpus[i].xid && !set->delivered[i]) {
            set->delivered[i] = 1;
            memset(data, 0, sizeof *data);
            data->device = &gpus[i];
            data->type = XID_EVENT;
            data->data = gpus[i].xid;
            return SUCCESS;
        }
    }
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
    return ERR_TIMEOUT;
}

int nvmlEventSetFree(event_set_t *set) {
    ENTER(nvmlEventSetFree)
    free(set);
    return SUCCESS;
}
