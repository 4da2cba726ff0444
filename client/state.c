/* cotrain client: the persistent state (see state.h). */
#include "client/state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kernels/model_json.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/common/sketch.h"

static const char *op_names[] = { "none", "heartbeat", "finish", "handback" };

cot_err cl_state_init(cl_state *s)
{
	memset(s, 0, sizeof *s);
	s->projects = calloc(CL_MAX_PROJECTS, sizeof *s->projects);
	return s->projects ? COT_OK : COT_ERR_NOMEM;
}

void cl_state_free(cl_state *s)
{
	free(s->projects);
	s->projects = NULL;
	s->nprojects = 0;
}

cl_project *cl_state_find(cl_state *s, const char *key)
{
	for (int i = 0; key && i < s->nprojects; i++)
		if (strcmp(s->projects[i].url, key) == 0 || strcmp(s->projects[i].name, key) == 0)
			return &s->projects[i];
	return NULL;
}

cot_err cl_state_add(cl_state *s, cl_project **out, cot_errbuf *eb)
{
	if (s->nprojects >= CL_MAX_PROJECTS)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "cannot attach more than %d projects",
		                  CL_MAX_PROJECTS);
	cl_project *p = &s->projects[s->nprojects++];
	memset(p, 0, sizeof *p);
	p->resource_share = 100;
	*out = p;
	return COT_OK;
}

void cl_state_remove(cl_state *s, int i)
{
	if (i < 0 || i >= s->nprojects)
		return;
	memmove(&s->projects[i], &s->projects[i + 1], (size_t)(s->nprojects - i - 1) * sizeof *s->projects);
	s->nprojects--;
}

int cl_project_recently_done(const cl_project *p, int64_t id)
{
	for (int i = 0; i < CL_RECENT_DONE; i++)
		if (p->recent_done[i] == id && id != 0)
			return 1;
	return 0;
}

void cl_project_mark_done(cl_project *p, int64_t id)
{
	if (cl_project_recently_done(p, id))
		return;
	memmove(&p->recent_done[1], &p->recent_done[0], (CL_RECENT_DONE - 1) * sizeof p->recent_done[0]);
	p->recent_done[0] = id;
}

/* ---- serialization ---------------------------------------------------- */

static json_t *work_to_json(const cl_work *w)
{
	json_t *files = json_array();
	for (int i = 0; files && i < w->nfiles; i++)
		json_array_append_new(files,
		                      json_pack("{s:s, s:s, s:I, s:s}", "url", w->files[i].url, "sha256",
		                                w->files[i].sha256, "size", (json_int_t)w->files[i].size,
		                                "kind", w->files[i].kind));
	json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:f, s:s, s:I}", "id",
	                      (json_int_t)w->id, "version", (json_int_t)w->version, "lo", (json_int_t)w->lo,
	                      "hi", (json_int_t)w->hi, "deadline", (json_int_t)w->deadline, "files", files,
	                      "mb_done", (json_int_t)w->mb_done, "mb_reported", (json_int_t)w->mb_reported,
	                      "keep_hi", (json_int_t)w->keep_hi, "samples_per_sec", w->samples_per_sec,
	                      "pending_op", op_names[w->pending_op], "pending_mb", (json_int_t)w->pending_mb);
	if (o && w->sketch_k > 0) {
		char seed[24];
		snprintf(seed, sizeof seed, "%llu", (unsigned long long)w->sketch_seed);
		json_object_set_new(o, "sketch_seed", json_string(seed));
		json_object_set_new(o, "sketch_k", json_integer(w->sketch_k));
		if (w->sketch_block > 0)
			json_object_set_new(o, "sketch_block", json_integer(w->sketch_block));
	}
	if (o && w->optimizer[0] && json_object_set_new(o, "optimizer", json_string(w->optimizer))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

cot_err cl_train_mode_from_config(cl_train_mode *t, const json_t *config, cot_errbuf *eb)
{
	static const char *const keys[] = { "mode", "inner_batch", "outer", "optimizer", "precision", NULL };
	if (!json_is_object(config))
		return cot_seterr(eb, COT_ERR_INVALID, "the project's config is not a JSON object");
	json_t *sub = json_object();
	if (!sub)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	for (int i = 0; keys[i]; i++) {
		json_t *v = json_object_get(config, keys[i]);
		if (v && json_object_set(sub, keys[i], v)) {
			json_decref(sub);
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		}
	}
	char *text = json_dumps(sub, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(sub);
	if (!text)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	cot_err rc = COT_OK;
	if (strlen(text) >= sizeof t->json)
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "the project's training settings are over %d bytes",
		                CL_TRAIN_JSON_MAX - 1);
	else {
		snprintf(t->json, sizeof t->json, "%s", text);
		t->known = 1;
	}
	free(text);
	return rc;
}

static json_t *project_to_json(const cl_project *p)
{
	json_t *done = json_array();
	for (int i = 0; done && i < CL_RECENT_DONE; i++)
		if (p->recent_done[i])
			json_array_append_new(done, json_integer(p->recent_done[i]));
	const cl_model_shape *m = &p->model;
	json_t *model = kern_model_config_to_json(m);
	json_t *j =
	        json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:f, s:f, s:o, s:I, s:I, s:I, s:f, s:o, s:o, s:I, "
	                  "s:I, s:o}",
	                  "url", p->url, "base", p->base, "name", p->name, "account_key", p->account_key,
	                  "host_id", (json_int_t)p->host_id, "host_token", p->host_token, "resource_share",
	                  p->resource_share, "cpu_seconds", p->cpu_seconds, "account_prefs",
	                  cl_prefs_to_json(&p->account_prefs), "seq_len", (json_int_t)p->seq_len,
	                  "microbatch_size", (json_int_t)p->microbatch_size, "mb_per_epoch",
	                  (json_int_t)p->mb_per_epoch, "flops_per_sample", p->flops_per_sample, "work",
	                  p->has_work ? work_to_json(&p->work) : json_null(), "recent_done", done, "mb_total",
	                  (json_int_t)p->mb_total, "seed", (json_int_t)p->seed, "model", model);
	json_t *train = p->mode.known ? json_loads(p->mode.json, 0, NULL) : NULL;
	if (j && train)
		json_object_set_new(j, "train", train);
	else
		json_decref(train);
	return j;
}

cot_err cl_state_to_text(const cl_state *s, char **out, size_t *len, cot_errbuf *eb)
{
	json_t *projects = json_array();
	for (int i = 0; projects && i < s->nprojects; i++)
		if (json_array_append_new(projects, project_to_json(&s->projects[i]))) {
			json_decref(projects);
			projects = NULL;
		}
	json_t *root = json_pack("{s:b, s:o, s:{s:f, s:s, s:I}, s:I, s:o}", "suspended", s->suspended,
	                         "local_prefs", cl_prefs_to_json(&s->local_prefs), "benchmark", "flops",
	                         s->bench_flops, "hw", s->bench_hw, "at", (json_int_t)s->bench_at, "saved_at",
	                         (json_int_t)s->saved_at, "projects", projects);
	if (root && s->machine_secret[0] &&
	    json_object_set_new(root, "machine_secret", json_string(s->machine_secret))) {
		json_decref(root);
		root = NULL;
	}
	if (!root)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory while writing the state");
	char *body = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
	json_decref(root);
	if (!body)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory while writing the state");
	char sha[HASH_SHA256_HEX_LEN + 1];
	size_t blen = strlen(body);
	if (hash_sha256_hex(body, blen, sha)) {
		free(body);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the state");
	}
	size_t total = blen + 128;
	char *text = malloc(total);
	if (!text) {
		free(body);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory while writing the state");
	}
	int n = snprintf(text, total, "%s %d %s\n%s\n", CL_STATE_FORMAT, CL_STATE_VERSION, sha, body);
	free(body);
	/* The checksum covers the body and its final newline: hash again. */
	char *nl = strchr(text, '\n');
	hash_sha256_hex(nl + 1, (size_t)n - (size_t)(nl + 1 - text), sha);
	memcpy(nl - HASH_SHA256_HEX_LEN, sha, HASH_SHA256_HEX_LEN);
	*out = text;
	*len = (size_t)n;
	return COT_OK;
}

/* Copy a bounded string field (required). */
static cot_err get_str(const json_t *o, const char *key, size_t min, char *dst, size_t cap, cot_errbuf *eb)
{
	const char *v = "";
	cot_err rc = cot_json_str(o, key, true, min, cap - 1, &v, eb);
	if (rc)
		return rc;
	memcpy(dst, v, strlen(v) + 1);
	return COT_OK;
}

static cot_err get_i64(const json_t *o, const char *key, long long min, long long max, int64_t *dst,
                       cot_errbuf *eb)
{
	long long v = 0;
	cot_err rc = cot_json_int(o, key, true, min, max, &v, eb);
	if (!rc)
		*dst = v;
	return rc;
}

#define TRY(x) \
	do { \
		if ((rc = (x))) \
			goto fail; \
	} while (0)

static cot_err work_from_json(cl_work *w, const json_t *o, cot_errbuf *eb)
{
	cot_err rc;
	const int64_t BIG = (int64_t)1 << 60;
	if (!json_is_object(o))
		return cot_seterr(eb, COT_ERR_CORRUPT, "\"work\" must be an object");
	TRY(get_i64(o, "id", 1, BIG, &w->id, eb));
	TRY(get_i64(o, "version", 0, BIG, &w->version, eb));
	TRY(get_i64(o, "lo", 0, BIG, &w->lo, eb));
	TRY(get_i64(o, "hi", w->lo + 1, BIG, &w->hi, eb));
	TRY(get_i64(o, "deadline", 0, BIG, &w->deadline, eb));
	TRY(get_i64(o, "mb_done", 0, w->hi - w->lo, &w->mb_done, eb));
	TRY(get_i64(o, "mb_reported", 0, w->hi - w->lo, &w->mb_reported, eb));
	TRY(get_i64(o, "keep_hi", w->lo, w->hi, &w->keep_hi, eb));
	TRY(cot_json_num(o, "samples_per_sec", true, 0, 1e15, &w->samples_per_sec, eb));
	TRY(get_i64(o, "pending_mb", 0, w->hi - w->lo, &w->pending_mb, eb));
	if (json_object_get(o, "sketch_k")) {
		int64_t k = 0;
		const char *seed = NULL;
		TRY(get_i64(o, "sketch_k", 1, SKETCH_K_MAX, &k, eb));
		TRY(cot_json_str(o, "sketch_seed", true, 1, 20, &seed, eb));
		char *end;
		errno = 0;
		unsigned long long v = strtoull(seed, &end, 10);
		if (*end || errno || seed[0] == '-')
			return cot_seterr(eb, COT_ERR_CORRUPT, "\"sketch_seed\" is not a 64-bit number");
		w->sketch_seed = v;
		w->sketch_k = (int)k;
		int64_t b = 0;
		if (json_object_get(o, "sketch_block"))
			TRY(get_i64(o, "sketch_block", 1, CL_BLOCK_MAX, &b, eb));
		w->sketch_block = (int)b;
	}
	const char *opt = "";
	TRY(cot_json_str(o, "optimizer", false, 0, CL_WORK_OPT_MAX - 1, &opt, eb));
	snprintf(w->optimizer, sizeof w->optimizer, "%s", opt ? opt : "");
	const char *op = "";
	TRY(cot_json_str(o, "pending_op", true, 1, 16, &op, eb));
	w->pending_op = CL_REPORT_NONE;
	int found = 0;
	for (int i = 0; i < 4; i++)
		if (strcmp(op, op_names[i]) == 0) {
			w->pending_op = (cl_report_op)i;
			found = 1;
		}
	if (!found)
		return cot_seterr(eb, COT_ERR_CORRUPT, "unknown pending report \"%s\"", op);
	const json_t *files = json_object_get(o, "files");
	if (!json_is_array(files) || json_array_size(files) > CL_MAX_FILES)
		return cot_seterr(eb, COT_ERR_CORRUPT, "\"files\" must be an array of at most %d files",
		                  CL_MAX_FILES);
	w->nfiles = (int)json_array_size(files);
	for (int i = 0; i < w->nfiles; i++) {
		const json_t *f = json_array_get(files, i);
		cl_file *cf = &w->files[i];
		if (!json_is_object(f))
			return cot_seterr(eb, COT_ERR_CORRUPT, "a file of work unit %lld is not an object",
			                  (long long)w->id);
		TRY(get_str(f, "url", 1, cf->url, sizeof cf->url, eb));
		TRY(get_str(f, "sha256", 64, cf->sha256, sizeof cf->sha256, eb));
		TRY(get_str(f, "kind", 0, cf->kind, sizeof cf->kind, eb));
		TRY(get_i64(f, "size", 0, BIG, &cf->size, eb));
		if (!hash_is_sha256_hex(cf->sha256))
			return cot_seterr(eb, COT_ERR_CORRUPT, "bad sha256 in work unit %lld",
			                  (long long)w->id);
	}
	return COT_OK;
fail:
	return rc;
}

static cot_err project_from_json(cl_project *p, const json_t *o, cot_errbuf *eb)
{
	cot_err rc;
	const int64_t BIG = (int64_t)1 << 60;
	memset(p, 0, sizeof *p);
	if (!json_is_object(o))
		return cot_seterr(eb, COT_ERR_CORRUPT, "a project is not an object");
	TRY(get_str(o, "url", 1, p->url, sizeof p->url, eb));
	TRY(get_str(o, "base", 1, p->base, sizeof p->base, eb));
	TRY(get_str(o, "name", 1, p->name, sizeof p->name, eb));
	TRY(get_str(o, "account_key", 0, p->account_key, sizeof p->account_key, eb));
	TRY(get_str(o, "host_token", 1, p->host_token, sizeof p->host_token, eb));
	TRY(get_i64(o, "host_id", 1, BIG, &p->host_id, eb));
	TRY(cot_json_num(o, "resource_share", true, 0.001, 1e6, &p->resource_share, eb));
	TRY(cot_json_num(o, "cpu_seconds", true, 0, 1e15, &p->cpu_seconds, eb));
	TRY(get_i64(o, "seq_len", 0, 1 << 20, &p->seq_len, eb));
	TRY(get_i64(o, "microbatch_size", 0, 1 << 20, &p->microbatch_size, eb));
	TRY(get_i64(o, "mb_per_epoch", 0, BIG, &p->mb_per_epoch, eb));
	TRY(cot_json_num(o, "flops_per_sample", true, 0, 1e30, &p->flops_per_sample, eb));
	TRY(get_i64(o, "mb_total", 0, BIG, &p->mb_total, eb));
	TRY(get_i64(o, "seed", -BIG, BIG, &p->seed, eb));
	if (kern_model_config_from_json(json_object_get(o, "model"), "model", KERN_MODEL_JSON_STORED,
	                                &p->model, eb))
		return COT_ERR_CORRUPT;
	/* Optional: a state file from before local mode has none. */
	const json_t *train = json_object_get(o, "train");
	if (train && cl_train_mode_from_config(&p->mode, train, eb))
		return COT_ERR_CORRUPT;
	p->account_prefs.set = 0;
	TRY(cl_prefs_from_json(&p->account_prefs, json_object_get(o, "account_prefs"), eb));
	const json_t *done = json_object_get(o, "recent_done");
	if (!json_is_array(done) || json_array_size(done) > CL_RECENT_DONE)
		return cot_seterr(eb, COT_ERR_CORRUPT, "\"recent_done\" must be an array of at most %d ids",
		                  CL_RECENT_DONE);
	for (size_t i = 0; i < json_array_size(done); i++) {
		const json_t *d = json_array_get(done, i);
		if (!json_is_integer(d) || json_integer_value(d) <= 0)
			return cot_seterr(eb, COT_ERR_CORRUPT, "\"recent_done\" holds a bad id");
		p->recent_done[i] = json_integer_value(d);
	}
	const json_t *w = json_object_get(o, "work");
	if (w && !json_is_null(w)) {
		TRY(work_from_json(&p->work, w, eb));
		p->has_work = 1;
	}
	return COT_OK;
fail:
	return rc;
}

cot_err cl_state_from_text(cl_state *s, const char *buf, size_t len, cot_errbuf *eb)
{
	char head[128];
	const char *nl = memchr(buf, '\n', len < sizeof head ? len : sizeof head);
	if (!nl)
		return cot_seterr(eb, COT_ERR_CORRUPT, "state file has no header line");
	memcpy(head, buf, (size_t)(nl - buf));
	head[nl - buf] = '\0';
	char fmt[32], sha[80];
	int version;
	if (sscanf(head, "%31s %d %79s", fmt, &version, sha) != 3 || strcmp(fmt, CL_STATE_FORMAT) != 0)
		return cot_seterr(eb, COT_ERR_CORRUPT, "state file has a bad header line");
	if (version != CL_STATE_VERSION)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "state file version %d is not supported (this client reads %d)", version,
		                  CL_STATE_VERSION);
	const char *body = nl + 1;
	size_t blen = len - (size_t)(body - buf);
	char got[HASH_SHA256_HEX_LEN + 1];
	if (hash_sha256_hex(body, blen, got) || strcmp(got, sha) != 0)
		return cot_seterr(eb, COT_ERR_CORRUPT, "state file fails its checksum");

	json_t *root;
	cot_errbuf e2 = { "", "" };
	if (cot_json_parse_object(body, blen, &root, &e2))
		return cot_seterr(eb, COT_ERR_CORRUPT, "state file is not valid JSON: %s", e2.msg);
	cl_state tmp;
	cot_err rc = cl_state_init(&tmp);
	if (rc) {
		json_decref(root);
		return cot_seterr(eb, rc, "out of memory while reading the state");
	}
	bool susp = false;
	const json_t *bench = json_object_get(root, "benchmark");
	const json_t *projects = json_object_get(root, "projects");
	if ((rc = cot_json_bool(root, "suspended", true, &susp, &e2)) ||
	    (rc = get_i64(root, "saved_at", 0, (int64_t)1 << 60, &tmp.saved_at, &e2)) ||
	    (rc = cl_prefs_from_json(&tmp.local_prefs, json_object_get(root, "local_prefs"), &e2)))
		goto bad;
	tmp.suspended = susp;
	if (json_object_get(root, "machine_secret") &&
	    (rc = get_str(root, "machine_secret", 16, tmp.machine_secret, sizeof tmp.machine_secret, &e2)))
		goto bad;
	if (!json_is_object(bench)) {
		rc = cot_seterr(&e2, COT_ERR_CORRUPT, "\"benchmark\" must be an object");
		goto bad;
	}
	if ((rc = cot_json_num(bench, "flops", true, 0, 1e30, &tmp.bench_flops, &e2)) ||
	    (rc = get_str(bench, "hw", 0, tmp.bench_hw, sizeof tmp.bench_hw, &e2)) ||
	    (rc = get_i64(bench, "at", 0, (int64_t)1 << 60, &tmp.bench_at, &e2)))
		goto bad;
	if (!json_is_array(projects) || json_array_size(projects) > CL_MAX_PROJECTS) {
		rc = cot_seterr(&e2, COT_ERR_CORRUPT, "\"projects\" must be an array of at most %d projects",
		                CL_MAX_PROJECTS);
		goto bad;
	}
	for (size_t i = 0; i < json_array_size(projects); i++) {
		rc = project_from_json(&tmp.projects[i], json_array_get(projects, i), &e2);
		if (rc)
			goto bad;
		tmp.nprojects++;
	}
	json_decref(root);
	cl_state_free(s);
	*s = tmp;
	return COT_OK;
bad:
	json_decref(root);
	cl_state_free(&tmp);
	return cot_seterr(eb, COT_ERR_CORRUPT, "state file has a bad shape: %s", e2.msg);
}

/* ---- files ------------------------------------------------------------ */

static cot_err read_file(const char *path, char **out, size_t *len, cot_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not open state file \"%s\": %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0 || st.st_size > CL_STATE_MAX_BYTES) {
		close(fd);
		return cot_seterr(eb, COT_ERR_CORRUPT, "state file \"%s\" is larger than %d bytes", path,
		                  CL_STATE_MAX_BYTES);
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory while reading the state");
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return COT_OK;
}

cot_err cl_state_load(cl_state *s, const char *dir, cot_errbuf *eb)
{
	char path[PATH_MAX], prev[PATH_MAX];
	snprintf(path, sizeof path, "%s/state.json", dir);
	snprintf(prev, sizeof prev, "%s/state.json.prev", dir);
	eb->msg[0] = '\0';
	char *buf;
	size_t len;
	cot_errbuf e1 = { "", "" }, e2 = { "", "" };
	cot_err rc = read_file(path, &buf, &len, &e1);
	if (rc == COT_ERR_NOT_FOUND) {
		/* A crash between link and rename leaves only the previous copy. */
		rc = read_file(prev, &buf, &len, &e2);
		if (rc == COT_ERR_NOT_FOUND)
			return COT_OK; /* first start */
		if (rc == COT_OK) {
			rc = cl_state_from_text(s, buf, len, &e2);
			free(buf);
			if (rc == COT_OK)
				return COT_OK;
		}
		cot_seterr(eb, COT_OK,
		           "state file \"%s\" is missing and its previous copy is unusable (%s); starting "
		           "with an empty state",
		           path, e2.msg);
		return COT_OK;
	}
	if (rc == COT_ERR_IO)
		return cot_seterr(eb, rc, "%s", e1.msg);
	if (rc == COT_OK) {
		rc = cl_state_from_text(s, buf, len, &e1);
		free(buf);
		if (rc == COT_OK)
			return COT_OK;
	}
	/* Corrupt: keep it for inspection, then fall back. */
	char aside[PATH_MAX];
	snprintf(aside, sizeof aside, "%s/state.json.corrupt-%lld", dir, (long long)time(NULL));
	if (rename(path, aside) < 0)
		snprintf(aside, sizeof aside, "(could not move it aside: %s)", strerror(errno));
	cot_err rc2 = read_file(prev, &buf, &len, &e2);
	if (rc2 == COT_OK) {
		rc2 = cl_state_from_text(s, buf, len, &e2);
		free(buf);
	}
	if (rc2 == COT_OK)
		cot_seterr(eb, COT_OK,
		           "state file \"%s\" is unusable: %s; it was moved to \"%s\" and the previous copy "
		           "was loaded",
		           path, e1.msg, aside);
	else
		cot_seterr(eb, COT_OK,
		           "state file \"%s\" is unusable: %s; it was moved to \"%s\" and no usable previous "
		           "copy exists, so the client starts with no projects attached",
		           path, e1.msg, aside);
	cot_sethint(eb, "Attach the projects again with \"cotrainctl attach\" if they are missing.");
	return COT_OK;
}

cot_err cl_state_save(const cl_state *s, const char *dir, cot_errbuf *eb)
{
	char *text;
	size_t len;
	cot_err rc = cl_state_to_text(s, &text, &len, eb);
	if (rc)
		return rc;
	char path[PATH_MAX], tmp[PATH_MAX], prev[PATH_MAX], prevtmp[PATH_MAX];
	snprintf(path, sizeof path, "%s/state.json", dir);
	snprintf(tmp, sizeof tmp, "%s/state.json.tmp", dir);
	snprintf(prev, sizeof prev, "%s/state.json.prev", dir);
	snprintf(prevtmp, sizeof prevtmp, "%s/state.json.prev.tmp", dir);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		free(text);
		rc = cot_seterr(eb, COT_ERR_IO, "could not create state file \"%s\": %s", tmp,
		                strerror(errno));
		cot_sethint(eb,
		            "Check that the state directory exists and is writable by the daemon's user.");
		return rc;
	}
	size_t off = 0;
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	free(text);
	int err = off < len ? (errno ? errno : ENOSPC) : 0;
	if (!err && fsync(fd) < 0)
		err = errno;
	if (close(fd) < 0 && !err)
		err = errno;
	if (err) {
		unlink(tmp);
		rc = cot_seterr(eb, COT_ERR_IO, "could not write state file \"%s\": %s", tmp, strerror(err));
		if (err == ENOSPC || err == EDQUOT)
			cot_sethint(eb, "Free some disk space; the client keeps its last saved state until "
			                "it can write again.");
		return rc;
	}
	/* Keep the previous copy: link, then rename over the old .prev. */
	unlink(prevtmp);
	if (link(path, prevtmp) == 0)
		rename(prevtmp, prev);
	if (rename(tmp, path) < 0) {
		err = errno;
		unlink(tmp);
		return cot_seterr(eb, COT_ERR_IO, "could not replace state file \"%s\": %s", path,
		                  strerror(err));
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return COT_OK;
}
