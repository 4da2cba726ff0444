/* cotrain kernels: the optimizer settings of a project file.
 *
 * The server and every client must feed kern_opt_step the very same floats
 * (peers compare parameter hashes after each step), so both read the
 * project config through this one function. */
#ifndef KERN_OPT_JSON_H
#define KERN_OPT_JSON_H

#include "kernels/optimizer.h"
#include "shared/common/error.h"

/* The optimizer settings of a project config (JSON text, its "optimizer"
 * object as doc/project-file.md describes; absent fields take the defaults
 * there; NULL = "{}"), as floats for kern_opt_step.  COT_ERR_INVALID naming
 * the field. */
cot_err kern_opt_config_from_json(const char *config_json, kern_opt_config *o, cot_errbuf *eb);

#endif
