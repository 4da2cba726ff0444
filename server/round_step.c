/* cotrain-server: the server's own optimizer step of a round. */
#include "server/round_step.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "shared/hash.h"

/* Gradients and hashes are little-endian fp32 on the wire and in memory. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the round step reads and hashes fp32 as little-endian bytes"
#endif

static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

/* Save m into the store through a temporary file in <store>/tmp. */
static cot_err store_checkpoint(const char *store_dir, const kern_model *m,
                                char sha[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb)
{
	char tmpdir[4200], path[4300];
	snprintf(tmpdir, sizeof tmpdir, "%s/tmp", store_dir);
	snprintf(path, sizeof path, "%s/step-XXXXXX", tmpdir);
	if ((mkdir(store_dir, 0755) != 0 && errno != EEXIST) ||
	    (mkdir(tmpdir, 0755) != 0 && errno != EEXIST))
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", tmpdir, strerror(errno));
	int fd = mkstemp(path);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create file in \"%s\": %s", tmpdir, strerror(errno));
	close(fd);
	cot_err rc = ckpt_save(m, path, eb);
	if (!rc)
		rc = fs_put_file(store_dir, path, sha, size, eb);
	unlink(path);
	return rc;
}

cot_err round_step_compute(const char *store_dir, const char *ckpt_sha, const char *config_json,
                           long long version, const float *grad, size_t n,
                           char ckpt_out[FS_SHA_HEX_LEN + 1], uint64_t *size,
                           char params_out[FS_SHA_HEX_LEN + 1], cot_errbuf *eb)
{
	kern_opt_config o;
	cot_err rc = kern_opt_config_from_json(config_json, &o, eb);
	if (rc)
		return rc;
	char path[4300];
	if ((rc = fs_path(store_dir, ckpt_sha, path, sizeof path, eb)))
		return rc;
	pthread_mutex_lock(&step_lock);
	kern_model *m = NULL;
	if ((rc = ckpt_load_new(path, 0, &m, eb)))
		goto out;
	if (m->n_params != n) {
		rc = cot_seterr(eb, COT_ERR_CONFLICT, "the gradient has %zu values, the model %zu parameters",
		                n, m->n_params);
		goto out;
	}
	if (m->step != version) {
		rc = cot_seterr(eb, COT_ERR_CONFLICT, "checkpoint of version %lld has taken %ld steps",
		                version, m->step);
		goto out;
	}
	memcpy(m->grads, grad, n * sizeof *grad);
	if ((rc = kern_opt_step(m, &o, NULL, eb)) ||
	    (rc = store_checkpoint(store_dir, m, ckpt_out, size, eb)))
		goto out;
	if (hash_sha256_hex(m->params, n * sizeof *m->params, params_out))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the parameters");
out:
	kern_model_free(m);
	pthread_mutex_unlock(&step_lock);
	return rc;
}
