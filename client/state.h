/* cotrain client: the daemon's persistent state.
 *
 * Everything the daemon must not forget across a crash, a kill -9 or a
 * reboot: the attached projects (URL, account key, host id and token,
 * resource share), each project's current work unit with the microbatches
 * computed and the last progress the server acknowledged, the journal of a
 * report in flight, the suspend flag, the local preferences and the last
 * benchmark.
 *
 * On disk it is <state_dir>/state.json:
 *
 *   line 1   "cotrain-client-state 1 <sha256 hex of the rest of the file>"
 *   rest     one JSON object (see state.c for the fields)
 *
 * written atomically: a temporary file, fsync, the old file hard-linked to
 * state.json.prev, rename over state.json, fsync of the folder.  A reader
 * sees the old or the new state, never a mix.  A file that fails its
 * checksum or shape is moved aside to state.json.corrupt-<unix time>, the
 * previous copy is used when it is sound, and the error says so.
 *
 * Reports and kill -9: before a report is sent, the report (operation and
 * microbatch count) is journaled in the state and saved; after the server
 * acknowledges it the journal is cleared and the count recorded as
 * reported.  A daemon that dies in between finds the journal on restart and
 * sends the same report again; the server treats heartbeats and finish as
 * idempotent on (work unit, mb_done), so nothing is counted twice.  A
 * report is never sent without being journaled first. */
#ifndef CL_STATE_H
#define CL_STATE_H

#include <limits.h>
#include <stdint.h>

#include <jansson.h>

#include "client/prefs.h"
#include "kernels/model.h"
#include "shared/common/error.h"

#define CL_STATE_FORMAT "cotrain-client-state"
#define CL_STATE_VERSION 1
#define CL_STATE_MAX_BYTES (4 << 20)
#define CL_MAX_PROJECTS 32
#define CL_MAX_FILES 64 /* files of one work unit */
#define CL_URL_MAX 1024
#define CL_FILE_URL_MAX 512
#define CL_TOKEN_MAX 256
#define CL_NAME_MAX 64
#define CL_RECENT_DONE 16    /* finished work unit ids remembered */
#define CL_WORK_OPT_MAX 1024 /* bytes of a work unit's optimizer (JSON) */

typedef enum { CL_REPORT_NONE, CL_REPORT_HEARTBEAT, CL_REPORT_FINISH, CL_REPORT_HANDBACK } cl_report_op;

typedef struct {
	char url[CL_FILE_URL_MAX]; /* absolute, or relative to the server */
	char sha256[65];
	int64_t size;
	char kind[16]; /* "checkpoint", "shard", or "" */
} cl_file;

typedef struct {
	int64_t id;
	int64_t version;
	int64_t lo, hi;   /* stream microbatches [lo, hi) */
	int64_t deadline; /* unix seconds */
	int nfiles;
	cl_file files[CL_MAX_FILES];
	int64_t mb_done;     /* microbatches computed, 0..hi-lo */
	int64_t mb_reported; /* acknowledged by the server */
	int64_t keep_hi;     /* after a hand-back: compute only [lo, keep_hi) */
	double samples_per_sec;
	/* The optimizer in force at the unit's version, as the server sent it
	 * (compact JSON, the "optimizer" of a project file), or "" from a
	 * server that sends none: a local-mode session's inner steps take it
	 * (client/compute.c). */
	char optimizer[CL_WORK_OPT_MAX];
	cl_report_op pending_op; /* journal: a report sent but not acknowledged */
	int64_t pending_mb;
	uint64_t sketch_seed; /* sketch each microbatch under this seed (doc/credit.md) */
	int sketch_k;         /* with k values; 0: the server wants no sketches */
	int sketch_block;     /* keep blocks of this many microbatches for the check
	                       * under a second seed (client/compute.h); 0: none */
} cl_work;

#define CL_BLOCK_MAX 1024 /* microbatches of a kept block at most */

/* The model's shape, from the project file (kernels/model_json.h); all
 * zeros until the project's information is fetched. */
typedef kern_config cl_model_shape;

/* How the project trains: the "mode", "inner_batch", "outer" and
 * "optimizer" of its config, from the project's information, as compact
 * JSON text for kernels/opt_json.h (the session reads it,
 * client/compute.c).  The state file keeps it ("train"); a state file from
 * before local mode has none (known 0) until the information is fetched
 * again. */
#define CL_TRAIN_JSON_MAX 1024
typedef struct {
	int known;
	char json[CL_TRAIN_JSON_MAX]; /* {"mode": ..., "optimizer": ...} */
} cl_train_mode;

/* Fill t from a project config object (those four keys; the others are
 * ignored) and mark it known.  COT_ERR_INVALID (not an object),
 * COT_ERR_TOO_LARGE (over CL_TRAIN_JSON_MAX), COT_ERR_NOMEM; t is then
 * unchanged.  The values are checked where they are used. */
cot_err cl_train_mode_from_config(cl_train_mode *t, const json_t *config, cot_errbuf *eb);

typedef struct {
	char url[CL_URL_MAX];       /* as given to attach */
	char base[CL_URL_MAX];      /* server base URL */
	char name[CL_NAME_MAX + 1]; /* project name on the server */
	char account_key[CL_TOKEN_MAX];
	int64_t host_id;
	char host_token[CL_TOKEN_MAX];
	double resource_share;  /* > 0, default 100 */
	double cpu_seconds;     /* compute time spent, for resource shares */
	cl_prefs account_prefs; /* pushed by the server */
	/* project parameters, from the server */
	int64_t seq_len, microbatch_size, mb_per_epoch;
	double flops_per_sample;
	int64_t seed;
	cl_model_shape model; /* from the project's config; n_layer 0 = unknown */
	cl_train_mode mode;
	int has_work;
	cl_work work;
	int64_t recent_done[CL_RECENT_DONE]; /* finished work unit ids, newest first */
	int64_t mb_total;                    /* microbatches reported finished, all time */
} cl_project;

typedef struct {
	int nprojects;
	cl_project *projects;    /* CL_MAX_PROJECTS slots, owned */
	int suspended;           /* by the user */
	cl_prefs local_prefs;    /* set with cotrainctl */
	double bench_flops;      /* FLOP/s measured, 0 = never */
	char bench_hw[65];       /* hardware fingerprint the benchmark ran on */
	int64_t bench_at;        /* unix seconds */
	int64_t saved_at;        /* unix seconds of the last save (clock checks) */
	char machine_secret[64]; /* random, drawn once; "" until drawn (hostinfo.h) */
} cl_state;

/* An empty state (no projects).  COT_ERR_NOMEM. */
cot_err cl_state_init(cl_state *s);
void cl_state_free(cl_state *s);

/* Load <dir>/state.json into s (initialized).  A missing file gives an empty
 * state and COT_OK.  A corrupt file: see above; returns COT_OK with the
 * recovered (previous or empty) state and a warning detail in eb->msg
 * (non-empty) so the caller can log it.  COT_ERR_IO when the folder cannot be
 * read. */
cot_err cl_state_load(cl_state *s, const char *dir, cot_errbuf *eb);

/* Save s atomically into <dir>/state.json.  COT_ERR_IO (disk full,
 * unwritable folder) with the old file intact. */
cot_err cl_state_save(const cl_state *s, const char *dir, cot_errbuf *eb);

/* Serialize / parse (exposed for tests and the control socket). */
cot_err cl_state_to_text(const cl_state *s, char **out, size_t *len, cot_errbuf *eb);
cot_err cl_state_from_text(cl_state *s, const char *buf, size_t len, cot_errbuf *eb);

/* The project with this URL or name, or NULL. */
cl_project *cl_state_find(cl_state *s, const char *url_or_name);

/* Append a zeroed project slot; COT_ERR_TOO_LARGE when full. */
cot_err cl_state_add(cl_state *s, cl_project **out, cot_errbuf *eb);
/* Remove the project at index i. */
void cl_state_remove(cl_state *s, int i);

/* True when the work unit id is among the project's recently finished ones. */
int cl_project_recently_done(const cl_project *p, int64_t id);
void cl_project_mark_done(cl_project *p, int64_t id);

#endif
