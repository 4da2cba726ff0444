/* Tests for kernels/checkpoint: a model saved and loaded comes back
 * bit-identical (parameters, moments, step, config), and checkpoints that
 * lie (missing or misshapen tensors, extra tensors, NaN, bad metadata, a
 * config that does not match) are refused cleanly, leaving the model as it
 * was. */
#include "kernels/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/model.h"
#include "kernels/safetensors.h"
#include "tests/tap.h"

static char dir[256];
static const kern_config cfg = {
	.n_layer = 2, .n_shared = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab = 256, .d_ff = 64
};

static size_t nparams(const kern_model *m) { return kern_param_count(&m->config); }

static kern_model *make(const kern_config *c, unsigned seed)
{
	kern_model *m;
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	if (kern_model_create(c, 1, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, seed);
	size_t n = nparams(m);
	for (size_t i = 0; i < n; i++) {
		m->m[i] = (float)sin((double)i * 0.37 + seed) * 1e-3f;
		m->v[i] = (float)(i % 97) * 1e-6f + (float)seed * 1e-7f;
	}
	m->step = 1000 + seed;
	return m;
}

static int same_state(const kern_model *a, const kern_model *b)
{
	size_t n = nparams(a);
	return memcmp(&a->config, &b->config, sizeof a->config) == 0 && a->step == b->step &&
	       memcmp(a->params, b->params, n * sizeof(float)) == 0 &&
	       memcmp(a->m, b->m, n * sizeof(float)) == 0 && memcmp(a->v, b->v, n * sizeof(float)) == 0;
}

/* Ways to spoil a checkpoint written by write_custom. */
enum spoil {
	SP_NONE,
	SP_MISSING,
	SP_SHAPE,
	SP_DTYPE,
	SP_EXTRA,
	SP_NAN,
	SP_VERSION,
	SP_FORMAT,
	SP_TOKENIZER,
	SP_NO_FIELD,
	SP_BAD_CONFIG,
	SP_HUGE_CONFIG,
	SP_STEP,
	SP_NEG_V
};

/* Write m as ckpt_save would, spoiled as sp says. */
static void write_custom(const kern_model *m, const char *path, enum spoil sp)
{
	kern_view views[512];
	int nv = kern_param_views(&m->config, views, 512);
	if (nv <= 0 || nv > 512)
		bail_out("kern_param_views gave %d", nv);
	st_writer *w;
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	if (st_writer_new(&w, &eb))
		bail_out("st_writer_new: %s", eb.msg);
	char num[32];
	st_writer_meta(w, "format", sp == SP_FORMAT ? "gguf" : CKPT_FORMAT, &eb);
	st_writer_meta(w, "format_version", sp == SP_VERSION ? "2" : "1", &eb);
	st_writer_meta(w, "tokenizer", sp == SP_TOKENIZER ? "bpe" : "byte", &eb);
	const kern_config *c = &m->config;
	int vals[7] = { c->n_layer, c->n_shared, c->n_head, c->d_model, c->seq_len, c->vocab, c->d_ff };
	const char *keys[7] = { "n_layer", "n_shared", "n_head", "d_model", "seq_len", "vocab", "d_ff" };
	if (sp == SP_BAD_CONFIG)
		vals[2] = 3; /* 3 heads do not divide d_model 16 */
	if (sp == SP_HUGE_CONFIG)
		vals[3] = 1 << 24; /* d_model 16M in a tiny file */
	for (int i = 0; i < 7; i++) {
		if (sp == SP_NO_FIELD && i == 6)
			continue;
		snprintf(num, sizeof num, "%d", vals[i]);
		st_writer_meta(w, keys[i], num, &eb);
	}
	st_writer_meta(w, "step", sp == SP_STEP ? "-5" : "17", &eb);

	const char *groups[3] = { "param.", "opt.m.", "opt.v." };
	const float *data[3] = { m->params, m->m, m->v };
	float *nan_copy = NULL;
	int skew = -1; /* a non-square matrix, to transpose */
	for (int i = nv - 1; i >= 0; i--)
		if (views[i].ndim == 2 && views[i].shape[0] != views[i].shape[1])
			skew = i;
	if (skew < 0)
		bail_out("no non-square matrix among the views");
	for (int g = 0; g < 3; g++) {
		for (int i = 0; i < nv; i++) {
			char name[300];
			int64_t shape[4];
			const kern_view *v = &views[i];
			snprintf(name, sizeof name, "%s%.64s", groups[g], v->name);
			for (int d = 0; d < v->ndim; d++)
				shape[d] = v->shape[d];
			const float *p = data[g] + v->offset;
			if (g == 1 && i == nv - 1 && sp == SP_MISSING)
				continue;
			if (g == 0 && i == skew && sp == SP_SHAPE) {
				int64_t t = shape[0]; /* transposed: same numel */
				shape[0] = shape[1];
				shape[1] = t;
			}
			if (g == 2 && i == 0 && (sp == SP_NAN || sp == SP_NEG_V)) {
				nan_copy = malloc(v->numel * sizeof *nan_copy);
				if (!nan_copy)
					bail_out("out of memory");
				memcpy(nan_copy, p, v->numel * sizeof *nan_copy);
				nan_copy[v->numel / 2] = sp == SP_NAN ? NAN : -1.0f;
				p = nan_copy;
			}
			st_dtype dt = ST_F32;
			if (g == 0 && i == 0 && sp == SP_DTYPE) {
				dt = ST_I32; /* same size, wrong type */
			}
			if (st_writer_add(w, name, dt, v->ndim, shape, p, &eb))
				bail_out("st_writer_add: %s", eb.msg);
		}
	}
	/* The writer borrows the data until st_writer_write: x must outlive it. */
	static const float x = 0;
	if (sp == SP_EXTRA) {
		int64_t one = 1;
		st_writer_add(w, "param.surprise", ST_F32, 1, &one, &x, &eb);
	}
	if (st_writer_write(w, path, &eb))
		bail_out("st_writer_write: %s", eb.msg);
	st_writer_free(w);
	free(nan_copy);
}

static void test_round_trip(void)
{
	char path[300];
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	kern_model *a = make(&cfg, 3);
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	eb.msg[0] = '\0';
	is_int(ckpt_save(a, path, &eb), COT_OK, "saved: %s", eb.msg);

	kern_model *b;
	eb.msg[0] = '\0';
	is_int(ckpt_load_new(path, 2, &b, &eb), COT_OK,
	       "loaded into a new model: "
	       "%s",
	       eb.msg);
	if (!b)
		bail_out("cannot continue");
	ok(same_state(a, b), "config, step, parameters and moments identical");
	is_int(b->step, 1003, "step");
	is_int(b->config.d_ff, 64, "config d_ff");

	kern_model *c = make(&cfg, 9);
	ok(!same_state(a, c), "a model from another seed differs");
	is_int(ckpt_load(c, path, &eb), COT_OK, "loaded into an existing model");
	ok(same_state(a, c), "now identical");

	/* The file says what it is, for other tools. */
	st_file *f;
	is_int(st_open(path, &f, &eb), COT_OK, "readable as plain safetensors");
	is_str(st_meta(f, "format"), "cotrain-checkpoint", "format");
	is_str(st_meta(f, "tokenizer"), "byte", "tokenizer");
	is_str(st_meta(f, "n_head"), "2", "n_head");
	is_str(st_meta(f, "step"), "1003", "step");
	kern_view views[512];
	int nv = kern_param_views(&cfg, views, 512);
	is_int((long long)st_count(f), 3LL * nv, "3 tensors per view");
	char name[300];
	snprintf(name, sizeof name, "opt.v.%s", views[nv - 1].name);
	const st_tensor *t = st_find(f, name);
	ok(t && t->dtype == ST_F32 && t->numel == views[nv - 1].numel &&
	           memcmp(t->data, a->v + views[nv - 1].offset, t->nbytes) == 0,
	   "%s holds the second moment", name);
	st_close(f);

	/* A config that differs is a conflict, and the model stays as it was. */
	kern_config c2 = cfg;
	c2.d_ff = 32;
	kern_model *d = make(&c2, 5), *d0 = make(&c2, 5);
	is_int(ckpt_load(d, path, &eb), COT_ERR_CONFLICT, "a model of another config refuses it");
	ok(strstr(eb.msg, "d_ff") != NULL && eb.hint[0], "detail names d_ff: %s", eb.msg);
	ok(same_state(d, d0), "the model is untouched");

	kern_model_free(b);
	snprintf(path, sizeof path, "%s/absent.safetensors", dir);
	is_int(ckpt_load_new(path, 1, &b, &eb) == COT_ERR_NOT_FOUND && !b, 1, "a missing file is not found");
	kern_model_free(a);
	kern_model_free(b);
	kern_model_free(c);
	kern_model_free(d);
	kern_model_free(d0);
}

static void test_spoiled(void)
{
	static const struct {
		enum spoil sp;
		cot_err want;
		const char *substr, *what;
	} cases[] = {
		{ SP_MISSING, COT_ERR_CORRUPT, "is missing", "a missing tensor" },
		{ SP_SHAPE, COT_ERR_CORRUPT, "expected F32", "a transposed tensor" },
		{ SP_DTYPE, COT_ERR_CORRUPT, "is I32", "an I32 tensor" },
		{ SP_EXTRA, COT_ERR_CORRUPT, "param.surprise", "an extra tensor" },
		{ SP_NAN, COT_ERR_CORRUPT, "non-finite", "a NaN moment" },
		{ SP_VERSION, COT_ERR_UNSUPPORTED, "version 2", "format version 2" },
		{ SP_FORMAT, COT_ERR_UNSUPPORTED, "not a cotrain checkpoint", "another format" },
		{ SP_TOKENIZER, COT_ERR_UNSUPPORTED, "bpe", "another tokenizer" },
		{ SP_NO_FIELD, COT_ERR_CORRUPT, "d_ff", "a config field missing" },
		{ SP_BAD_CONFIG, COT_ERR_CORRUPT, "config is invalid", "an invalid config" },
		{ SP_STEP, COT_ERR_CORRUPT, "step", "a negative step" },
		{ SP_NEG_V, COT_ERR_CORRUPT, "negative second moment", "a negative second moment" },
	};
	char path[300];
	snprintf(path, sizeof path, "%s/spoiled.safetensors", dir);
	kern_model *src = make(&cfg, 11);
	kern_model *m = make(&cfg, 12), *m0 = make(&cfg, 12);
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);

	write_custom(src, path, SP_NONE);
	kern_model *b;
	eb.msg[0] = '\0';
	is_int(ckpt_load_new(path, 1, &b, &eb), COT_OK, "the test's own writer makes a loadable file: %s",
	       eb.msg);
	kern_model_free(b);

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		write_custom(src, path, cases[i].sp);
		memset(&eb, 0, sizeof eb);
		cot_err rc = ckpt_load(m, path, &eb);
		ok(rc == cases[i].want && strstr(eb.msg, cases[i].substr) && strstr(eb.msg, path),
		   "%s: refused as %s", cases[i].what, cot_strerror(cases[i].want));
		if (rc != cases[i].want || !strstr(eb.msg, cases[i].substr))
			diag("got %s: %s", cot_strerror(rc), eb.msg);
		ok(same_state(m, m0), "%s: the model is untouched", cases[i].what);
		b = (kern_model *)1;
		rc = ckpt_load_new(path, 1, &b, &eb);
		ok(rc == cases[i].want && b == NULL, "%s: no new model either", cases[i].what);
	}

	/* A tiny file that claims a huge model is refused before any model is
	 * made (the detail depends on which check fires first). */
	write_custom(src, path, SP_HUGE_CONFIG);
	b = (kern_model *)1;
	cot_err rc = ckpt_load_new(path, 1, &b, &eb);
	ok(rc != COT_OK && rc != COT_ERR_NOMEM && b == NULL, "a huge config in a tiny file is refused: %s",
	   eb.msg);

	/* A truncated checkpoint. */
	write_custom(src, path, SP_NONE);
	FILE *fp = fopen(path, "r+");
	if (!fp || fseek(fp, 0, SEEK_END))
		bail_out("cannot reopen %s", path);
	long len = ftell(fp);
	fclose(fp);
	if (truncate(path, len - 3))
		bail_out("cannot truncate %s", path);
	is_int(ckpt_load(m, path, &eb), COT_ERR_CORRUPT, "a truncated checkpoint is corrupt");
	ok(same_state(m, m0), "the model is untouched");

	kern_model_free(src);
	kern_model_free(m);
	kern_model_free(m0);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/test_checkpoint.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		bail_out("cannot create a temporary folder under %s", dir);
	plan_lazy();
	test_round_trip();
	test_spoiled();
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		diag("could not remove %s", dir);
	done_testing();
	return exit_status();
}
