/* simhosts: v+1 across groups between the peers (see simhosts_step.h). */
#include "tests/bench/simhosts_step.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "kernels/optimizer.h"
#include "shared/common/hash.h"

static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static sim_step *steps;

/* GET base+path into f (truncated first); 0 when the answer was 200. */
static int fetch(const char *base, const char *bearer, const char *path, FILE *f)
{
	char url[600], auth[320];
	snprintf(url, sizeof url, "%s%s", base, path);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
	CURL *c = curl_easy_init();
	struct curl_slist *hd = curl_slist_append(NULL, auth);
	long status = 0;
	if (c && hd && fseek(f, 0, SEEK_SET) == 0 && ftruncate(fileno(f), 0) == 0) {
		curl_easy_setopt(c, CURLOPT_URL, url);
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
		curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
		curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
		curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
		if (curl_easy_perform(c) == CURLE_OK)
			curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	}
	curl_slist_free_all(hd);
	if (c)
		curl_easy_cleanup(c);
	return status == 200 && fflush(f) == 0 ? 0 : -1;
}

/* The stand-in mean of round (version, attempt) at element i: small, so
 * that thousands of steps stay finite. */
static float fake_mean(long long version, long long attempt, size_t i)
{
	uint64_t x = (uint64_t)version * 1000003ULL + (uint64_t)attempt * 7919ULL + (uint64_t)i * 40503ULL;
	x ^= x >> 17;
	return (float)((long long)(x % 2001) - 1000) * 1e-7f;
}

/* Checkpoint v (the file ck_path), stepped with the stand-in mean, into s. */
static int compute(sim_step *s, const char *ck_path, const char *config, long long param_count)
{
	cot_errbuf eb = { "", "" };
	kern_opt_config o;
	kern_mode_config mc;
	kern_model *m = NULL;
	char out[64];
	snprintf(out, sizeof out, "/tmp/simhosts-step-%d.ckpt", (int)getpid());
	cot_err rc = kern_opt_config_at(config, s->version, &o, &eb);
	if (!rc)
		rc = kern_mode_config_from_json(config, &mc, &eb);
	if (!rc)
		rc = ckpt_load_new(ck_path, 0, &m, &eb);
	if (!rc && (long long)m->n_params != param_count)
		rc = cot_seterr(&eb, COT_ERR_CONFLICT, "checkpoint %lld has %zu parameters, the plan %lld",
		                s->version, m->n_params, param_count);
	if (!rc) {
		for (size_t i = 0; i < m->n_params; i++)
			m->grads[i] = fake_mean(s->version, s->attempt, i);
		if (hash_sha256_hex(m->grads, m->n_params * sizeof *m->grads, s->mean_sha))
			rc = cot_seterr(&eb, COT_ERR_INTERNAL, "could not hash the mean");
	}
	if (!rc)
		rc = mc.mode == KERN_MODE_LOCAL ? kern_opt_outer_step(m, &mc.outer, &eb)
		                                : kern_opt_step(m, &o, NULL, &eb);
	if (!rc && hash_sha256_hex(m->params, m->n_params * sizeof *m->params, s->params_sha))
		rc = cot_seterr(&eb, COT_ERR_INTERNAL, "could not hash the parameters");
	if (!rc)
		rc = ckpt_save(m, out, &eb);
	kern_model_free(m);
	FILE *f = rc ? NULL : fopen(out, "rb");
	long len = -1;
	if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (s->ckpt = malloc((size_t)len)) && fread(s->ckpt, 1, (size_t)len, f) == (size_t)len)
		s->ckpt_len = (size_t)len;
	if (f)
		fclose(f);
	unlink(out);
	if (!rc && !s->ckpt_len)
		rc = cot_seterr(&eb, COT_ERR_IO, "could not read back checkpoint %lld", s->version + 1);
	if (rc)
		fprintf(stderr, "simhosts: the step of round %lld: %s\n", s->version, eb.msg);
	return rc ? -1 : 0;
}

const sim_step *sim_step_get(const char *base, const char *bearer, const char *project, long long version,
                             long long attempt, const char *ckpt_sha, long long param_count)
{
	pthread_mutex_lock(&step_mu);
	sim_step *s;
	for (s = steps; s; s = s->next)
		if (s->version == version && s->attempt == attempt)
			break;
	if (s) {
		pthread_mutex_unlock(&step_mu);
		return s->ckpt_len ? s : NULL;
	}
	s = calloc(1, sizeof *s);
	char ck_path[64], path[200];
	snprintf(ck_path, sizeof ck_path, "/tmp/simhosts-ckpt-%d", (int)getpid());
	FILE *ck = fopen(ck_path, "w+b"), *cf = tmpfile();
	char *config = NULL;
	if (s && ck && cf && strlen(ckpt_sha) == 64) {
		s->version = version;
		s->attempt = attempt;
		snprintf(path, sizeof path, "/v1/projects/%s", project);
		json_t *p = NULL;
		if (fetch(base, bearer, path, cf) == 0 && fseek(cf, 0, SEEK_SET) == 0)
			p = json_loadf(cf, 0, NULL);
		config = json_dumps(json_object_get(p, "config"), JSON_COMPACT);
		json_decref(p);
		snprintf(path, sizeof path, "/files/%s", ckpt_sha);
		if (!config || fetch(base, bearer, path, ck) != 0)
			fprintf(stderr, "simhosts: could not fetch checkpoint %lld or the project's config\n",
			        version);
		else
			compute(s, ck_path, config, param_count);
		s->next = steps; /* kept also when it failed: the round's other hosts fail fast */
		steps = s;
		s = s->ckpt_len ? s : NULL;
	} else {
		free(s);
		s = NULL;
	}
	free(config);
	if (ck)
		fclose(ck);
	if (cf)
		fclose(cf);
	unlink(ck_path);
	pthread_mutex_unlock(&step_mu);
	return s;
}

void sim_step_free_all(void)
{
	pthread_mutex_lock(&step_mu);
	while (steps) {
		sim_step *n = steps->next;
		free(steps->ckpt);
		free(steps);
		steps = n;
	}
	pthread_mutex_unlock(&step_mu);
}
