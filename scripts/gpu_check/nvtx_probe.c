/* An NVTX tool library for scripts/gpu-check.sh: it records the ranges a process opens and closes, so that
 * the check can see the NVTX ranges Nsight Systems would show, without Nsight.
 *
 * NVTX loads the library named by NVTX_INJECTION64_PATH at a process's first NVTX call and calls its
 * InitializeInjectionNvtx2, which fills in the functions the process's NVTX calls then reach. This one
 * takes the thread and start/end ranges of the core module and appends one line per event to the file
 * named by HPCDL_NVTX_PROBE_LOG:
 *
 *     start <id> <message>     end <id>     push <message>     pop
 *
 * The types and numbers below are NVTX's stable tool interface (nvtx3/nvtxDetail/nvtxTypes.h): an export
 * table of id 1 (callbacks) whose GetModuleFunctionTable gives the core module's (1) table of pointers to
 * function pointers, indexed by callback id. Build: cc -shared -fPIC -O2 -o libnvtx_probe.so nvtx_probe.c
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*FunctionPointer)(void);
typedef FunctionPointer **FunctionTable;

typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, FunctionTable *table, unsigned int *size);
} ExportTableCallbacks;

typedef const void *(*GetExportTable)(uint32_t id);

enum { EXPORT_TABLE_CALLBACKS = 1, MODULE_CORE = 1 };
enum {
    CORE_RANGE_START_EX = 4,
    CORE_RANGE_START_A = 5,
    CORE_RANGE_END = 7,
    CORE_RANGE_PUSH_EX = 8,
    CORE_RANGE_PUSH_A = 9,
    CORE_RANGE_POP = 11,
};

/* nvtxEventAttributes_v2, up to its message (only ASCII messages are read). */
typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    uint64_t payload;
    int32_t message_type;
    const char *message;
} EventAttributes;

enum { MESSAGE_TYPE_ASCII = 1 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static uint64_t next_id = 1;
static int depth;

static void record(const char *event, uint64_t id, const char *message) {
    if (out == NULL)
        return;
    if (id != 0 && message != NULL)
        fprintf(out, "%s %llu %s\n", event, (unsigned long long)id, message);
    else if (id != 0)
        fprintf(out, "%s %llu\n", event, (unsigned long long)id);
    else if (message != NULL)
        fprintf(out, "%s %s\n", event, message);
    else
        fprintf(out, "%s\n", event);
    fflush(out);
}

static const char *ascii(const EventAttributes *attributes) {
    if (attributes == NULL || attributes->message_type != MESSAGE_TYPE_ASCII)
        return "";
    return attributes->message;
}

static uint64_t range_start(const char *message) {
    pthread_mutex_lock(&lock);
    uint64_t id = next_id++;
    record("start", id, message);
    pthread_mutex_unlock(&lock);
    return id;
}

static uint64_t range_start_a(const char *message) { return range_start(message); }

static uint64_t range_start_ex(const EventAttributes *attributes) { return range_start(ascii(attributes)); }

static void range_end(uint64_t id) {
    pthread_mutex_lock(&lock);
    record("end", id, NULL);
    pthread_mutex_unlock(&lock);
}

static int range_push(const char *message) {
    pthread_mutex_lock(&lock);
    record("push", 0, message);
    int level = depth++;
    pthread_mutex_unlock(&lock);
    return level;
}

static int range_push_a(const char *message) { return range_push(message); }

static int range_push_ex(const EventAttributes *attributes) { return range_push(ascii(attributes)); }

static int range_pop(void) {
    pthread_mutex_lock(&lock);
    record("pop", 0, NULL);
    int level = depth > 0 ? --depth : -1;
    pthread_mutex_unlock(&lock);
    return level;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(GetExportTable get_export_table) {
    const char *path = getenv("HPCDL_NVTX_PROBE_LOG");
    if (path == NULL || get_export_table == NULL)
        return 0;
    const ExportTableCallbacks *callbacks = get_export_table(EXPORT_TABLE_CALLBACKS);
    FunctionTable table = NULL;
    unsigned int size = 0;
    if (callbacks == NULL || callbacks->GetModuleFunctionTable == NULL ||
        !callbacks->GetModuleFunctionTable(MODULE_CORE, &table, &size) || table == NULL ||
        size <= CORE_RANGE_POP)
        return 0;
    pthread_mutex_lock(&lock); /* each NVTX instance in the process (torch's, NCCL's...) calls this */
    if (out == NULL)
        out = fopen(path, "a");
    int opened = out != NULL;
    pthread_mutex_unlock(&lock);
    if (!opened)
        return 0;
    *table[CORE_RANGE_START_EX] = (FunctionPointer)range_start_ex;
    *table[CORE_RANGE_START_A] = (FunctionPointer)range_start_a;
    *table[CORE_RANGE_END] = (FunctionPointer)range_end;
    *table[CORE_RANGE_PUSH_EX] = (FunctionPointer)range_push_ex;
    *table[CORE_RANGE_PUSH_A] = (FunctionPointer)range_push_a;
    *table[CORE_RANGE_POP] = (FunctionPointer)range_pop;
    pthread_mutex_lock(&lock);
    record("loaded", 0, NULL);
    pthread_mutex_unlock(&lock);
    return 1;
}
