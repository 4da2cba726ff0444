/* cotrain kernels: the optimizer settings of a project file.
 *
 * The server and every client must feed kern_opt_step the very same floats
 * (peers compare parameter hashes after each step), so both read the
 * project config through this one function. */
#ifndef KERN_OPT_JSON_H
#define KERN_OPT_JSON_H

#include "kernels/gpu_abi.h"
#include "kernels/optimizer.h"
#include "shared/common/error.h"

/* The optimizer settings of a project config (JSON text, its "optimizer"
 * object as doc/project-file.md describes; absent fields take the defaults
 * there; NULL = "{}"), as floats for kern_opt_step.  COT_ERR_INVALID naming
 * the field. */
cot_err kern_opt_config_from_json(const char *config_json, kern_opt_config *o, cot_errbuf *eb);

/* kern_opt_config_from_json of the config in force at version
 * (kern_config_at, kernels/config_changes.h: the project's "changes" of
 * versions <= version merged in): the optimizer of the step that trains
 * version into version + 1.  Errors as both. */
cot_err kern_opt_config_at(const char *config_json, long long version, kern_opt_config *o, cot_errbuf *eb);

/* How a round turns the peers' work into v+1 (doc/project-file.md "mode"). */
typedef enum {
	KERN_MODE_SYNC = 0, /* one optimizer step on the mean gradient */
	KERN_MODE_LOCAL,    /* inner steps on each peer, one outer step (DiLoCo) */
} kern_round_mode;

#define KERN_INNER_BATCH_DEFAULT 4
#define KERN_INNER_BATCH_MAX 65536

/* The precision of a GPU host's matrix products when a project names none
 * (doc/project-file.md "precision"). */
#define KERN_PRECISION_DEFAULT KERN_PREC_BF16

typedef struct {
	kern_round_mode mode;
	int inner_batch;         /* local: microbatches per inner step */
	kern_outer_config outer; /* local: the outer optimizer */
	int precision;           /* KERN_PREC_* (kernels/gpu_abi.h): a GPU's products */
} kern_mode_config;

/* The round mode of a project config (JSON text, NULL = "{}"): "mode"
 * ("sync", the default, or "local"), "inner_batch" (default
 * KERN_INNER_BATCH_DEFAULT), "outer" {"lr", "momentum", "nesterov"}
 * (kern_outer_default) and "precision" ("fp32", "tf32" or "bf16", default
 * KERN_PRECISION_DEFAULT; only a GPU host reads it, kern_gpu_bind).  Every
 * place that branches on the mode (the client's session and round, the
 * server's step, the replay) reads it here.  COT_ERR_INVALID naming the
 * field. */
cot_err kern_mode_config_from_json(const char *config_json, kern_mode_config *mc, cot_errbuf *eb);

#endif
