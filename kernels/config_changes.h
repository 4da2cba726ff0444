/* cotrain kernels: a project config at a model version.
 *
 * A project's hyperparameters may change mid-run (`cotrain-admin project
 * update`, doc/project-file.md "changes").  Each change is recorded in the
 * config itself, in its "changes" array, with the version it takes effect
 * at:
 *
 *   "changes": [{"version": 40, "at": "2026-...", "optimizer": {"lr": 5e-4},
 *                "target_batch": 512}, ...]
 *
 * The settings in force for version v (those of the round that trains v
 * into v+1, and of its optimizer step) are the config's own, with every
 * change of version <= v merged over them in ascending version (file order
 * among equal versions): objects merge key by key, any other value
 * replaces.  The server's step, every client's step and the replay read the
 * config through kern_config_at, so they apply the same floats. */
#ifndef KERN_CONFIG_CHANGES_H
#define KERN_CONFIG_CHANGES_H

#include "shared/common/error.h"

/* The config (JSON text, NULL = "{}") in force at version, without its
 * "changes", as a malloc'd compact JSON text in *out (the caller frees
 * it).  COT_ERR_INVALID when the config is not an object or "changes" is
 * not an array of objects with an integer "version" >= 0 (naming it),
 * COT_ERR_NOMEM; *out is NULL then. */
cot_err kern_config_at(const char *config_json, long long version, char **out, cot_errbuf *eb);

#endif
