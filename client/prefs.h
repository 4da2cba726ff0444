/* cotrain client: computing preferences.
 *
 * A preference set is one value per known key plus a mask of the keys it
 * sets.  The daemon layers four sets, later ones winning key by key:
 *
 *   built-in defaults  <  account (pushed by the project server)
 *                      <  config file  <  local (cotrainctl prefs set)
 *
 * Keys, units and bounds (every value is checked against them, from any
 * source):
 *   max_threads       compute threads, 0 = one per core          0..4096
 *   cpu_percent       share of the cores to use, percent         1..100
 *   cpu_time_percent  share of the time to compute, percent      1..100
 *                     (a duty cycle, client/throttle.h)
 *   only_when_idle    compute only when the user is idle         bool
 *   idle_after        seconds without input before "idle"        0..86400
 *   only_on_ac        compute only on mains power                bool
 *   download_limit    bytes/s, 0 = unlimited                     0..1e12
 *   upload_limit      bytes/s, 0 = unlimited                     0..1e12
 *   disk_max          bytes for the file cache                   1 MiB..1 PiB
 *   memory_max        bytes the model may take, 0 = no limit     0..1 PiB
 *   use_gpu           compute on a GPU when one is usable        bool
 *   gpu_only_when_idle  the GPU only while the user is idle      bool
 *   gpu_device        which GPU (CUDA device index)              0..63
 *
 * Text values accept suffixes: k M G T (powers of 1024) for bytes, and
 * true/false/yes/no/on/off/1/0 for booleans. */
#ifndef CL_PREFS_H
#define CL_PREFS_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "shared/common/error.h"

typedef enum {
	PREF_MAX_THREADS,
	PREF_CPU_PERCENT,
	PREF_ONLY_WHEN_IDLE,
	PREF_IDLE_AFTER,
	PREF_ONLY_ON_AC,
	PREF_DOWNLOAD_LIMIT,
	PREF_UPLOAD_LIMIT,
	PREF_DISK_MAX,
	PREF_MEMORY_MAX,
	PREF_CPU_TIME_PERCENT,
	PREF_USE_GPU,
	PREF_GPU_ONLY_WHEN_IDLE,
	PREF_GPU_DEVICE,
	PREF_COUNT
} cl_pref_key;

typedef struct {
	int64_t v[PREF_COUNT];
	uint32_t set; /* bit k: key k has a value in this set */
} cl_prefs;

/* The built-in defaults, every key set. */
void cl_prefs_defaults(cl_prefs *p);

/* The key named name, or -1. */
int cl_prefs_key(const char *name);
/* The name of key k (never NULL for a valid key). */
const char *cl_prefs_name(cl_pref_key k);

/* Parse text for key k and set it in p.  COT_ERR_INVALID with a detail
 * naming the key, the value and the bounds; p unchanged on error. */
cot_err cl_prefs_set_text(cl_prefs *p, cl_pref_key k, const char *text, cot_errbuf *eb);

/* Set from a JSON object {"max_threads": 2, "only_when_idle": true, ...}.
 * Unknown keys are ignored (a newer server may push more); a known key of
 * the wrong type or out of bounds fails the whole object with p unchanged.
 * JSON null leaves the key unset. */
cot_err cl_prefs_from_json(cl_prefs *p, const json_t *obj, cot_errbuf *eb);

/* A new JSON object with the keys set in p (new reference; NULL when out of
 * memory). */
json_t *cl_prefs_to_json(const cl_prefs *p);

/* Copy into dst every key set in src. */
void cl_prefs_overlay(cl_prefs *dst, const cl_prefs *src);

/* Threads to compute with on a host with ncores cores. */
int cl_prefs_threads(const cl_prefs *p, int ncores);

#endif
