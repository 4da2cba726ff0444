/* cotrain: project files, the maintainer's description of a training
 * project (doc/project-file.md).
 *
 * A project file is one JSON object:
 *
 *   {"name": "demo", "title": "...", "description": "...",
 *    "dataset": "tiny",
 *    "model": {"n_layer": 4, "n_shared": 4, "n_head": 4, "d_model": 256,
 *              "d_ff": 1024, "seq_len": 256, "vocab": 256},
 *    "optimizer": {"type": "lamb", "lr": 0.001, "beta1": 0.9, "beta2": 0.999,
 *                  "eps": 1e-6, "weight_decay": 0.01, "clip_norm": 1.0,
 *                  "schedule": {"warmup_steps": 100, "total_steps": 10000,
 *                               "decay": "cosine", "min_lr_ratio": 0.1}},
 *    "target_batch": 256, "microbatch_size": 8, "seed": 42,
 *    "work_unit_seconds": 180,
 *    "mode": "local", "inner_batch": 4, "eval_every": 1, "eval_sequences": 32,
 *    "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
 *    "precision": "bf16"}
 *
 * Optional: "validation" {"trusted_after", "first_rate", "min_rate"}, and
 * "changes", an array of mid-run changes [{"version": V, "at": "...",
 * "optimizer": {"lr", "schedule"}, "target_batch", "work_unit_seconds",
 * "validation"}] (written by `cotrain-admin project update`; the settings
 * at version v are the file's with every change of version <= v merged over
 * them, kernels/config_changes.h).  Each version's settings must pass the
 * checks the file's own do; a local-mode project takes no optimizer change.
 *
 * "mode" is "sync" (the default) or "local"; "inner_batch" and "outer" are
 * local mode's and refused with "sync".  A sync project normalizes without
 * the three keys, as before they existed.
 *
 * "precision" ("fp32", "tf32" or "bf16", the default) is the precision of
 * a GPU host's matrix products (kernels/gpu.h); CPU hosts ignore it.  The
 * normalized form always names it.
 *
 * pf_parse checks it by shape: types, ranges, the relations between fields
 * (d_model a multiple of n_head, n_shared at most n_layer, ...), with the
 * bounds of kernels/model.h, and
 * rejects unknown keys, naming the field ("model.d_model") in the error.
 * Optional fields take the defaults in doc/project-file.md.  It is pure: no
 * database, no files.  What needs the database (the dataset exists and is
 * big enough, the vocabulary matches its tokenizer) is checked by
 * cotrain-admin. */
#ifndef COT_PROJECT_FILE_H
#define COT_PROJECT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/model.h"
#include "shared/common/error.h"

#define PF_MAX_BYTES (1u << 20) /* bytes of project file accepted */
#define PF_NAME_MAX 64
#define PF_TITLE_MAX 200
#define PF_DESCRIPTION_MAX 10000
#define PF_MAX_PARAMS (1ll << 32) /* parameters of one model */
#define PF_EVAL_EVERY_DEFAULT 1
#define PF_EVAL_EVERY_MAX 1000000
#define PF_EVAL_SEQUENCES_DEFAULT 32
#define PF_EVAL_SEQUENCES_MAX 4096
#define PF_CHANGES_MAX 256 /* entries of "changes" */
#define PF_AT_MAX 64       /* bytes of a change's "at" */

/* The model's shape: the kernels' own (kernels/model.h), read and written
 * through kernels/model_json.h. */
typedef kern_config pf_model;

typedef enum { PF_OPT_LAMB, PF_OPT_ADAMW } pf_opt_type;
typedef enum { PF_DECAY_CONSTANT, PF_DECAY_LINEAR, PF_DECAY_COSINE } pf_decay;

typedef struct {
	pf_opt_type type;
	double lr, beta1, beta2, eps, weight_decay;
	double clip_norm; /* 0: no clipping */
	int64_t warmup_steps, total_steps;
	pf_decay decay;
	double min_lr_ratio;
} pf_optimizer;

#define PF_LICENSE_MAX 64

typedef enum { PF_MODE_SYNC, PF_MODE_LOCAL } pf_mode;

/* Local mode's settings (doc/project-file.md "mode"). */
typedef struct {
	int inner_batch; /* microbatches per inner step */
	double lr, momentum;
	int nesterov;
} pf_local;

/* How aggregators combine their slices (doc/project-file.md
 * "aggregation"): the exact mean, or CenteredClip with tau and iterations. */
typedef enum { PF_AGG_MEAN, PF_AGG_CENTERED_CLIP } pf_aggregation;

/* How hosts' work is spot-checked (db: spot_policy, spot_rate): a host with
 * fewer than trusted_after agreeing checks with probability first_rate,
 * then first_rate x decay^(record - trusted_after + 1), at least min_rate. */
typedef struct {
	long long trusted_after;
	double first_rate, min_rate, decay;
} pf_validation;

/* The special ids of an encoder's model, in pf_project.special_given's bit
 * order. */
enum { PF_SPECIAL_CLS, PF_SPECIAL_SEP, PF_SPECIAL_MASK, PF_SPECIAL_PAD, PF_SPECIAL_UNK, PF_SPECIAL_N };
extern const char *const pf_special_keys[PF_SPECIAL_N];

typedef struct {
	char name[PF_NAME_MAX + 1];
	char title[PF_TITLE_MAX + 1];
	char *description; /* malloc'd, owned by the struct: pf_free */
	char dataset[PF_NAME_MAX + 1];
	/* The model's licence, an identifier such as "apache-2.0" or
	 * "CC-BY-4.0" (letters, digits, '.', '-', '+'); "" when not given.  It
	 * goes into exported model cards (cotrain-admin model export). */
	char license[PF_LICENSE_MAX + 1];
	/* "tokenizer": "byte" (false, the default) or "dataset" (true): the
	 * subword tokenizer the dataset's shards are encoded with; model.vocab
	 * must then be its vocabulary (checked by cotrain-admin). */
	bool subword;
	pf_model model;
	/* Which of model.cls_id, sep_id, mask_id, pad_id, unk_id the file
	 * gives (bit i for the i-th, PF_SPECIAL_*); the others hold defaults,
	 * which a subword project's tokenizer replaces
	 * (server/project_tokenizer.h). */
	unsigned special_given;
	pf_optimizer opt;
	pf_mode mode;
	pf_local local; /* read only with PF_MODE_LOCAL; the defaults otherwise */
	int precision;  /* KERN_PREC_* (kernels/gpu_abi.h): a GPU host's products */
	pf_aggregation aggregation;
	double clip_tau; /* CenteredClip's, with PF_AGG_CENTERED_CLIP */
	int clip_iters;
	int target_batch;    /* samples per optimizer step */
	int microbatch_size; /* samples per microbatch */
	int64_t seed;
	int work_unit_seconds;
	/* A round whose reported samples at the plan are fewer than this
	 * fraction of target_batch reopens for the rest instead of stepping
	 * (0: it always steps). */
	double min_batch_fraction;
	/* Held-out evaluation (doc/project-file.md): every eval_every-th
	 * version (0: none) on the first eval_sequences sequences of the
	 * dataset's held-out part. */
	int eval_every;
	int eval_sequences;
	/* The spot-check policy (doc/project-file.md "validation"), the
	 * spot_policy row's; has_validation 0: the database's defaults. */
	int has_validation;
	pf_validation validation;
	/* Entries of "changes": hyperparameters changed mid-run, each with the
	 * version it takes effect at (kernels/config_changes.h).  The fields
	 * above are the file's own, before any change. */
	int n_changes;
	struct json_t *changes; /* the "changes" array as given (a reference
	                         * pf_free drops), NULL when there is none */
} pf_project;

/* Parse and check len bytes of project file.  On success *out is filled
 * (release it with pf_free) and, when normalized is not NULL, *normalized
 * gets a malloc'd JSON text of the project with every default filled in, in
 * a fixed key order (the caller frees it).  On error: COT_ERR_INVALID (bad
 * JSON, a wrong type, a missing or unknown field, a value out of range; the
 * detail names the field and the hint says what is allowed),
 * COT_ERR_TOO_LARGE (over PF_MAX_BYTES), COT_ERR_NOMEM; *out holds nothing
 * to free and *normalized is NULL. */
cot_err pf_parse(const char *text, size_t len, pf_project *out, char **normalized, cot_errbuf *eb);

void pf_free(pf_project *p);

/* The normalized JSON text of p (pf_parse's *normalized), for a project
 * whose fields the caller changed after pf_parse (the special ids a
 * tokenizer gives); malloc'd (the caller frees it), NULL when out of
 * memory. */
char *pf_normalize(const pf_project *p);

/* Parameters of the model described (embeddings, blocks, final norm; the
 * output head is tied to the token embedding). */
int64_t pf_param_count(const pf_model *m);

/* Names used in the file ("lamb", "cosine"...). */
const char *pf_opt_type_name(pf_opt_type t);
const char *pf_decay_name(pf_decay d);
const char *pf_mode_name(pf_mode m);

#endif
