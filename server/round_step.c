/* cotrain-server: the server's own optimizer step of a round. */
#include "server/round_step.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
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
#include "shared/common/hash.h"

/* Gradients and hashes are little-endian fp32 on the wire and in memory. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the round step reads and hashes fp32 as little-endian bytes"
#endif

static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

/* Save m into the store through a temporary file in <store>/tmp. */
static cot_err store_checkpoint(const char *store_dir, const kern_model *m, char sha[FS_SHA_HEX_LEN + 1],
                                uint64_t *size, cot_errbuf *eb)
{
	char tmpdir[4200], path[4300];
	snprintf(tmpdir, sizeof tmpdir, "%s/tmp", store_dir);
	snprintf(path, sizeof path, "%s/step-XXXXXX", tmpdir);
	if ((mkdir(store_dir, 0755) != 0 && errno != EEXIST) || (mkdir(tmpdir, 0755) != 0 && errno != EEXIST))
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", tmpdir,
		                  strerror(errno));
	int fd = mkstemp(path);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create file in \"%s\": %s", tmpdir,
		                  strerror(errno));
	close(fd);
	cot_err rc = ckpt_save(m, path, eb);
	if (!rc)
		rc = fs_put_file(store_dir, path, sha, size, eb);
	unlink(path);
	return rc;
}

cot_err round_step_mean(const char *store_dir, const char *const *sums, int n_sums, long long total,
                        float *mean, size_t n, cot_errbuf *eb)
{
	if (total < 1 || n_sums < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "no samples to average");
	enum { CHUNK = 65536 };
	double *acc = calloc(n ? n : 1, sizeof *acc);
	float *buf = malloc(CHUNK * sizeof *buf);
	cot_err rc = COT_OK;
	if (!acc || !buf) {
		free(acc);
		free(buf);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the mean gradient");
	}
	pthread_mutex_lock(&step_lock);
	for (int k = 0; k < n_sums && !rc; k++) {
		char path[4300];
		rc = fs_path(store_dir, sums[k], path, sizeof path, eb);
		if (rc)
			break;
		FILE *f = fopen(path, "rb");
		if (!f) {
			rc = cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
			                "could not open group sum \"%s\": %s", sums[k], strerror(errno));
			break;
		}
		size_t at = 0;
		while (at < n) {
			size_t want = n - at < CHUNK ? n - at : CHUNK;
			size_t got = fread(buf, sizeof *buf, want, f);
			for (size_t i = 0; i < got; i++)
				acc[at + i] += (double)buf[i];
			at += got;
			if (got < want)
				break;
		}
		bool extra = fgetc(f) != EOF;
		bool err = ferror(f);
		fclose(f);
		if (err)
			rc = cot_seterr(eb, COT_ERR_IO, "could not read group sum \"%s\"", sums[k]);
		else if (at != n || extra)
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "group sum \"%s\" is not %zu fp32 values",
			                sums[k], n);
	}
	for (size_t i = 0; i < n && !rc; i++) {
		mean[i] = (float)(acc[i] / (double)total);
		if (!isfinite(mean[i]))
			rc = cot_seterr(eb, COT_ERR_INVALID, "value %zu of the mean gradient is not finite",
			                i);
	}
	pthread_mutex_unlock(&step_lock);
	free(acc);
	free(buf);
	return rc;
}

cot_err round_step_compute(const char *store_dir, const char *ckpt_sha, const char *config_json,
                           long long version, const float *grad, size_t n, char ckpt_out[FS_SHA_HEX_LEN + 1],
                           uint64_t *size, char params_out[FS_SHA_HEX_LEN + 1], cot_errbuf *eb)
{
	kern_opt_config o;
	kern_mode_config mc;
	cot_err rc = kern_opt_config_at(config_json, version, &o, eb);
	if (!rc)
		rc = kern_mode_config_from_json(config_json, &mc, eb);
	if (rc)
		return rc;
	char path[4300];
	rc = fs_path(store_dir, ckpt_sha, path, sizeof path, eb);
	if (rc)
		return rc;
	pthread_mutex_lock(&step_lock);
	kern_model *m = NULL;
	rc = ckpt_load_new(path, 0, &m, eb);
	if (rc)
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
	/* Local mode: grad is the mean pseudo-gradient, the outer step moves
	 * checkpoint v (theta_v) with the momentum the checkpoint holds. */
	if ((rc = mc.mode == KERN_MODE_LOCAL ? kern_opt_outer_step(m, &mc.outer, eb)
	                                     : kern_opt_step(m, &o, NULL, eb)) ||
	    (rc = store_checkpoint(store_dir, m, ckpt_out, size, eb)))
		goto out;
	if (hash_sha256_hex(m->params, n * sizeof *m->params, params_out))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the parameters");
out:
	kern_model_free(m);
	pthread_mutex_unlock(&step_lock);
	return rc;
}
