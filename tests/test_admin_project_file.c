/* cotrain tests: project files parsed and checked by shape (pure, no
 * database): a full file, defaults, and every kind of bad input named by
 * its field. */
#include "server/project_file.h"
#include "kernels/model.h"
#include "kernels/config_changes.h"
#include "kernels/opt_json.h"
#include "tests/tap.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *full =
        "{\"name\":\"demo\",\"title\":\"Demo\",\"description\":\"A demo.\",\"dataset\":\"tiny\","
        "\"model\":{\"n_layer\":4,\"n_shared\":2,\"n_head\":4,\"d_model\":256,\"d_ff\":512,\"seq_len\":256,"
        "\"vocab\":256},"
        "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.0003,\"beta1\":0.9,\"beta2\":0.95,\"eps\":1e-8,"
        "\"weight_decay\":0.1,\"clip_norm\":0,\"schedule\":{\"warmup_steps\":10,\"total_steps\":100,"
        "\"decay\":\"linear\",\"min_lr_ratio\":0}},"
        "\"target_batch\":256,\"microbatch_size\":8,\"seed\":42,\"work_unit_seconds\":120}";

static const char *local =
        "{\"name\":\"loc\",\"dataset\":\"tiny\","
        "\"model\":{\"n_layer\":2,\"n_head\":2,\"d_model\":64,\"seq_len\":32},\"target_batch\":64,"
        "\"optimizer\":{\"type\":\"adamw\"},"
        "\"mode\":\"local\",\"inner_batch\":2,\"outer\":{\"lr\":0.5,\"momentum\":0.8,\"nesterov\":false}}";

static const char *minimal =
        "{\"name\":\"mini\",\"dataset\":\"tiny\","
        "\"model\":{\"n_layer\":2,\"n_head\":2,\"d_model\":64,\"seq_len\":32},\"target_batch\":64}";

/* Replace the first occurrence of `from` in full by `to` and parse. */
static cot_err parse_edit(const char *base, const char *from, const char *to, cot_errbuf *eb)
{
	char buf[4096];
	const char *at = strstr(base, from);
	if (!at)
		bail_out("fixture lacks %s", from);
	snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
	pf_project p;
	cot_err rc = pf_parse(buf, strlen(buf), &p, NULL, eb);
	pf_free(&p);
	return rc;
}

/* The error of the last refuse(), for checks of its wording. */
static cot_errbuf eb_last;

static void refuse(const char *base, const char *from, const char *to, const char *field, const char *what)
{
	cot_errbuf eb = { "", "" };
	cot_err rc = parse_edit(base, from, to, &eb);
	eb_last = eb;
	is_int(rc, COT_ERR_INVALID, "refuse %s", what);
	char quoted[128];
	snprintf(quoted, sizeof quoted, "\"%s\"", field);
	ok(strstr(eb.msg, quoted) != NULL, "  the message names %s: %s%s%s", field, eb.msg,
	   eb.hint[0] ? " / hint: " : "", eb.hint);
}

int main(void)
{
	cot_errbuf eb = { "", "" };
	pf_project p;
	char *norm = NULL;

	plan_lazy();
	if (!is_int(pf_parse(full, strlen(full), &p, &norm, &eb), COT_OK, "a full project file parses"))
		diag("%s", eb.msg);
	is_str(p.name, "demo", "name");
	is_str(p.title, "Demo", "title");
	is_str(p.description, "A demo.", "description");
	is_str(p.dataset, "tiny", "dataset");
	ok(p.model.n_layer == 4 && p.model.n_shared == 2 && p.model.n_head == 4 && p.model.d_model == 256 &&
	           p.model.d_ff == 512 && p.model.seq_len == 256 && p.model.vocab == 256,
	   "model shape");
	ok(p.opt.type == PF_OPT_ADAMW && p.opt.lr == 0.0003 && p.opt.beta2 == 0.95 && p.opt.eps == 1e-8 &&
	           p.opt.weight_decay == 0.1 && p.opt.clip_norm == 0,
	   "optimizer");
	ok(p.opt.warmup_steps == 10 && p.opt.total_steps == 100 && p.opt.decay == PF_DECAY_LINEAR &&
	           p.opt.min_lr_ratio == 0,
	   "schedule");
	ok(p.target_batch == 256 && p.microbatch_size == 8 && p.seed == 42 && p.work_unit_seconds == 120,
	   "batch sizes, seed, work-unit length");
	pf_free(&p);

	/* The normalized text parses back to the same project. */
	pf_project q;
	char *norm2 = NULL;
	ok(norm && pf_parse(norm, strlen(norm), &q, &norm2, &eb) == COT_OK, "the normalized file parses");
	ok(norm && norm2 && strcmp(norm, norm2) == 0, "and normalizes to itself");
	ok(q.opt.eps == 1e-8 && q.opt.lr == 0.0003, "reals survive the round trip exactly");
	pf_free(&q);
	free(norm);
	free(norm2);

	/* Defaults. */
	norm = NULL;
	if (!is_int(pf_parse(minimal, strlen(minimal), &p, &norm, &eb), COT_OK,
	            "a minimal project file parses"))
		diag("%s", eb.msg);
	is_str(p.title, "mini", "title defaults to the name");
	ok(p.model.n_shared == 2 && p.model.d_ff == 256 && p.model.vocab == 256,
	   "n_shared defaults to n_layer, d_ff to 4 d_model, vocab to 256");
	ok(p.opt.type == PF_OPT_LAMB && p.opt.lr == 1e-3 && p.opt.beta1 == 0.9 && p.opt.beta2 == 0.999 &&
	           p.opt.eps == 1e-6 && p.opt.weight_decay == 0.01 && p.opt.clip_norm == 1.0,
	   "optimizer defaults");
	ok(p.opt.warmup_steps == 0 && p.opt.total_steps == 10000 && p.opt.decay == PF_DECAY_COSINE &&
	           p.opt.min_lr_ratio == 0.1,
	   "schedule defaults");
	ok(p.microbatch_size == 8 && p.seed == 0 && p.work_unit_seconds == 180, "other defaults");
	json_t *j = norm ? json_loads(norm, 0, NULL) : NULL;
	ok(j && json_integer_value(json_object_get(json_object_get(j, "model"), "d_ff")) == 256 &&
	           json_is_object(json_object_get(json_object_get(j, "optimizer"), "schedule")),
	   "the normalized file spells out the defaults");
	json_decref(j);
	free(norm);
	pf_free(&p);

	/* An encoder: model.arch and its defaults (the byte tokenizer's 256
	 * ids and four special tokens after them). */
	const char *albert =
	        "{\"name\":\"enc\",\"dataset\":\"tiny\",\"model\":{\"arch\":\"albert\",\"n_layer\":4,"
	        "\"n_shared\":1,\"n_head\":2,\"d_model\":64,\"seq_len\":32},\"target_batch\":64}";
	norm = NULL;
	if (!is_int(pf_parse(albert, strlen(albert), &p, &norm, &eb), COT_OK,
	            "an ALBERT project file parses"))
		diag("%s", eb.msg);
	ok(p.model.arch == KERN_ARCH_ALBERT && p.model.vocab == 260 && p.model.d_embed == 64 &&
	           p.model.type_vocab == 2 && p.model.cls_id == 256 && p.model.sep_id == 257 &&
	           p.model.mask_id == 258 && p.model.pad_id == 259,
	   "encoder defaults: vocab 260, d_embed min(128, d_model), specials 256..259");
	is_int(pf_param_count(&p.model), (long long)kern_param_count(&p.model),
	       "an encoder's parameter count is the kernels' (%lld)", (long long)kern_param_count(&p.model));
	ok(norm && strstr(norm, "\"arch\": \"albert\"") && strstr(norm, "\"mask_id\": 258"),
	   "the normalized file names the arch and the special ids");
	char *norm3 = NULL;
	ok(norm && pf_parse(norm, strlen(norm), &q, &norm3, &eb) == COT_OK && norm3 && !strcmp(norm, norm3) &&
	           !memcmp(&q.model, &p.model, sizeof p.model),
	   "and parses back to the same model");
	ok(norm && !strstr(norm, "\"position\""), "an absolute encoder's normalized file has no position");
	pf_free(&q);
	free(norm3);
	free(norm);
	pf_free(&p);

	/* Relative positions: model.position, kept through normalisation. */
	const char *rel =
	        "{\"name\":\"enc\",\"dataset\":\"tiny\",\"model\":{\"arch\":\"albert\",\"n_layer\":4,"
	        "\"n_shared\":1,\"n_head\":2,\"d_model\":64,\"seq_len\":32,"
	        "\"position\":\"relative_key\"},\"target_batch\":64}";
	norm = NULL;
	if (!is_int(pf_parse(rel, strlen(rel), &p, &norm, &eb), COT_OK,
	            "an ALBERT project file with relative_key positions parses"))
		diag("%s", eb.msg);
	ok(p.model.position == KERN_POS_RELATIVE_KEY, "model.position relative_key");
	is_int(pf_param_count(&p.model), (long long)kern_param_count(&p.model),
	       "with a distance embedding of 2T-1 rows by the head width (%lld parameters)",
	       (long long)kern_param_count(&p.model));
	ok(kern_param_count(&p.model) == kern_param_count(&(pf_model){ .n_layer = 4,
	                                                               .n_shared = 1,
	                                                               .n_head = 2,
	                                                               .d_model = 64,
	                                                               .d_ff = 256,
	                                                               .seq_len = 32,
	                                                               .vocab = 260,
	                                                               .arch = KERN_ARCH_ALBERT,
	                                                               .d_embed = 64,
	                                                               .type_vocab = 2,
	                                                               .cls_id = 256,
	                                                               .sep_id = 257,
	                                                               .mask_id = 258,
	                                                               .pad_id = 259,
	                                                               .unk_id = -1 }) +
	                                         63 * 32,
	   "  which is 63 x 32 more than the absolute model's");
	norm3 = NULL;
	ok(norm && strstr(norm, "\"position\": \"relative_key\"") &&
	           pf_parse(norm, strlen(norm), &q, &norm3, &eb) == COT_OK && norm3 && !strcmp(norm, norm3) &&
	           !memcmp(&q.model, &p.model, sizeof p.model),
	   "the normalized file names the position and parses back to the same model");
	pf_free(&q);
	free(norm3);
	free(norm);
	pf_free(&p);
	refuse(rel, "\"relative_key\"", "\"relative\"", "model.position", "an unknown model.position");
	ok(strstr(eb_last.msg, "relative_key_query") && strstr(eb_last.hint, "\"relative\""),
	   "  the message lists the values and the hint the one given");
	refuse(rel, "\"relative_key\"", "1", "model.position", "a model.position that is not a string");
	refuse(minimal, "\"n_layer\":2", "\"n_layer\":2,\"position\":\"relative_key\"", "model.position",
	       "model.position on a gpt");
	refuse(albert, "\"albert\"", "\"roberta\"", "model.arch", "an unknown model.arch");
	refuse(minimal, "\"n_layer\":2", "\"n_layer\":2,\"d_embed\":32", "model.d_embed",
	       "an encoder field on a gpt");
	refuse(albert, "\"n_layer\":4", "\"n_layer\":4,\"cls_id\":257", "model",
	       "two special tokens on one id");
	refuse(albert, "\"n_shared\":1", "\"n_shared\":3", "model", "ALBERT groups of unequal sizes");
	refuse(albert, "\"n_layer\":4", "\"n_layer\":4,\"mask_id\":260", "model.mask_id",
	       "a special id outside the vocabulary");

	is_int(pf_param_count(&(pf_model){ .n_layer = 1,
	                                   .n_shared = 1,
	                                   .n_head = 1,
	                                   .d_model = 2,
	                                   .d_ff = 8,
	                                   .seq_len = 3,
	                                   .vocab = 5 }),
	       5 * 2 + 3 * 2 + (4 * 4 + 2 * 2 * 8 + 9 * 2 + 8) + 2 * 2, "parameter count by hand");

	/* Bad files, each naming the field. */
	is_int(pf_parse("{\"name\":", 8, &p, NULL, &eb), COT_ERR_INVALID, "refuse malformed JSON");
	ok(strstr(eb.msg, "not valid JSON") && strstr(eb.msg, "line 1"), "  with the position: %s", eb.msg);
	is_int(pf_parse("[1,2]", 5, &p, NULL, &eb), COT_ERR_INVALID, "refuse a JSON array");
	refuse(full, "\"name\":\"demo\",", "", "name", "a missing name");
	refuse(full, "\"demo\"", "\"Demo Project\"", "name", "an invalid project name");
	refuse(full, "\"dataset\":\"tiny\",", "", "dataset", "a missing dataset");
	refuse(full, "\"dataset\":\"tiny\"", "\"dataset\":7", "dataset", "a dataset that is not a string");
	refuse(full, "\"dataset\":\"tiny\"", "\"dataset\":\"../etc\"", "dataset", "a bad dataset name");
	refuse(full, "\"title\":\"Demo\"", "\"title\":\"\"", "title", "an empty title");
	refuse(full, "\"dataset\":\"tiny\"", "\"dataset\":\"tiny\",\"tokenizer\":\"sentencepiece\"",
	       "tokenizer", "a tokenizer that is neither byte nor dataset");
	refuse(full, "\"dataset\":\"tiny\"", "\"dataset\":\"tiny\",\"tokenizer\":7", "tokenizer",
	       "a tokenizer that is not a string");
	{
		char buf[4096], *n2 = NULL;
		const char *at = strstr(full, "\"dataset\":\"tiny\"");
		snprintf(buf, sizeof buf, "%.*s\"dataset\":\"tiny\",\"tokenizer\":\"dataset\"%s",
		         (int)(at - full), full, at + strlen("\"dataset\":\"tiny\""));
		pf_project q;
		eb.msg[0] = '\0';
		ok(pf_parse(buf, strlen(buf), &q, &n2, &eb) == COT_OK && q.subword && n2 &&
		           strstr(n2, "\"tokenizer\": \"dataset\""),
		   "\"tokenizer\": \"dataset\" is read and kept in the normalized file (%s)", eb.msg);
		free(n2);
		pf_free(&q);
		ok(!strstr(full, "tokenizer") && pf_parse(full, strlen(full), &q, &n2, &eb) == COT_OK &&
		           !q.subword && !strstr(n2, "tokenizer"),
		   "without \"tokenizer\" the project is on bytes and the normalized file does not name it");
		free(n2);
		pf_free(&q);
	}
	refuse(full, "\"seed\":42", "\"seed\":42,\"colour\":\"blue\"", "colour", "an unknown top-level key");
	refuse(full, "\"vocab\":256", "\"vocab\":256,\"n_embd\":3", "model.n_embd", "an unknown model key");
	refuse(full, "\"min_lr_ratio\":0", "\"min_lr_ratio\":0,\"x\":1", "optimizer.schedule.x",
	       "an unknown schedule key");
	refuse(full, "\"n_layer\":4,", "", "model.n_layer", "a missing n_layer");
	refuse(full, "\"n_head\":4", "\"n_head\":\"4\"", "model.n_head", "a string where an integer belongs");
	refuse(full, "\"n_head\":4", "\"n_head\":4.5", "model.n_head", "a real where an integer belongs");
	refuse(full, "\"d_model\":256", "\"d_model\":250", "model.d_model",
	       "d_model not a multiple of n_head");
	refuse(full, "\"n_shared\":2", "\"n_shared\":5", "model.n_shared", "n_shared above n_layer");
	refuse(full, "\"seq_len\":256", "\"seq_len\":0", "model.seq_len", "a zero seq_len");
	refuse(full, "\"d_model\":256", "\"d_model\":-256", "model.d_model", "a negative d_model");
	refuse(full, "\"n_shared\":2,\"n_head\":4,\"d_model\":256,\"d_ff\":512",
	       "\"n_shared\":4,\"n_head\":4,\"d_model\":16384,\"d_ff\":16384", "model", "a model too large");
	refuse(full,
	       "\"model\":{\"n_layer\":4,\"n_shared\":2,\"n_head\":4,\"d_model\":256,\"d_ff\":512,\"seq_"
	       "len\":256,\"vocab\":256}",
	       "\"model\":[4]", "model", "a model that is not an object");
	refuse(full, "\"type\":\"adamw\"", "\"type\":\"sgd\"", "optimizer.type", "an unknown optimizer");
	refuse(full, "\"lr\":0.0003", "\"lr\":0", "optimizer.lr", "a zero learning rate");
	refuse(full, "\"beta1\":0.9", "\"beta1\":1", "optimizer.beta1", "beta1 of 1");
	refuse(full, "\"eps\":1e-8", "\"eps\":true", "optimizer.eps", "a boolean eps");
	refuse(full, "\"decay\":\"linear\"", "\"decay\":\"step\"", "optimizer.schedule.decay",
	       "an unknown decay");
	refuse(full, "\"warmup_steps\":10", "\"warmup_steps\":1000", "optimizer.schedule.warmup_steps",
	       "warm-up longer than training");
	refuse(full, "\"target_batch\":256", "\"target_batch\":250", "target_batch",
	       "a target batch that is not whole microbatches");
	refuse(full, "\"target_batch\":256,", "", "target_batch", "a missing target batch");
	refuse(full, "\"microbatch_size\":8", "\"microbatch_size\":0", "microbatch_size",
	       "a zero microbatch");
	refuse(full, "\"seed\":42", "\"seed\":-1", "seed", "a negative seed");
	refuse(full, "\"work_unit_seconds\":120", "\"work_unit_seconds\":100000", "work_unit_seconds",
	       "work units longer than a day");
	refuse(full, "\"seed\":42", "\"seed\":42,\"seed\":43", "seed", "a duplicate key");

	/* Local mode: its keys, read back by the kernels' reader, and refused
	 * where they do not belong. */
	norm = NULL;
	if (!is_int(pf_parse(local, strlen(local), &p, &norm, &eb), COT_OK, "a local-mode project parses"))
		diag("%s", eb.msg);
	ok(p.mode == PF_MODE_LOCAL && p.local.inner_batch == 2 && p.local.lr == 0.5 &&
	           p.local.momentum == 0.8 && !p.local.nesterov,
	   "mode, inner batch and outer optimizer as written");
	j = norm ? json_loads(norm, 0, NULL) : NULL;
	ok(j && strcmp(json_string_value(json_object_get(j, "mode")), "local") == 0 &&
	           json_integer_value(json_object_get(j, "inner_batch")) == 2 &&
	           json_real_value(json_object_get(json_object_get(j, "outer"), "lr")) == 0.5 &&
	           json_is_false(json_object_get(json_object_get(j, "outer"), "nesterov")),
	   "the normalized config holds them");
	json_decref(j);
	ok(norm && pf_parse(norm, strlen(norm), &q, &norm2, &eb) == COT_OK && strcmp(norm, norm2) == 0,
	   "and normalizes to itself");
	pf_free(&q);
	free(norm2);
	free(norm);
	pf_free(&p);
	const char *dl = "{\"name\":\"loc\",\"dataset\":\"tiny\",\"model\":{\"n_layer\":2,\"n_head\":2,"
	                 "\"d_model\":64,\"seq_len\":32},\"target_batch\":64,\"mode\":\"local\"}";
	norm = NULL;
	ok(pf_parse(dl, strlen(dl), &p, &norm, &eb) == COT_OK && p.local.inner_batch == 4 &&
	           p.local.lr == 0.7 && p.local.momentum == 0.9 && p.local.nesterov,
	   "local mode's defaults: inner batch 4, outer lr 0.7, momentum 0.9, Nesterov");
	j = norm ? json_loads(norm, 0, NULL) : NULL;
	ok(j && json_integer_value(json_object_get(j, "inner_batch")) == 4 &&
	           json_is_true(json_object_get(json_object_get(j, "outer"), "nesterov")),
	   "the normalized file spells them out");
	json_decref(j);
	free(norm);
	pf_free(&p);
	norm = NULL;
	ok(pf_parse(full, strlen(full), &p, &norm, &eb) == COT_OK && p.mode == PF_MODE_SYNC && norm &&
	           !strstr(norm, "\"mode\"") && !strstr(norm, "inner_batch") && !strstr(norm, "outer"),
	   "a sync project normalizes as before local mode existed");
	free(norm);
	pf_free(&p);
	/* Aggregation: the mean by default, CenteredClip with BTARD's defaults
	 * or the given tau and iterations. */
	norm = NULL;
	ok(pf_parse(minimal, strlen(minimal), &p, &norm, &eb) == COT_OK && p.aggregation == PF_AGG_MEAN &&
	           norm && !strstr(norm, "aggregation") && !strstr(norm, "centered_clip"),
	   "the mean by default, nothing written for it");
	free(norm);
	pf_free(&p);
	const char *cc =
	        "{\"name\":\"cc\",\"dataset\":\"tiny\",\"model\":{\"n_layer\":2,\"n_head\":2,"
	        "\"d_model\":64,\"seq_len\":32},\"target_batch\":64,\"aggregation\":\"centered_clip\","
	        "\"centered_clip\":{\"tau\":0.25,\"iterations\":7}}";
	norm = NULL;
	ok(pf_parse(cc, strlen(cc), &p, &norm, &eb) == COT_OK && p.aggregation == PF_AGG_CENTERED_CLIP &&
	           p.clip_tau == 0.25 && p.clip_iters == 7,
	   "centered_clip with tau 0.25 and 7 iterations as written");
	j = norm ? json_loads(norm, 0, NULL) : NULL;
	ok(j && strcmp(json_string_value(json_object_get(j, "aggregation")), "centered_clip") == 0 &&
	           json_real_value(json_object_get(json_object_get(j, "centered_clip"), "tau")) == 0.25 &&
	           json_integer_value(json_object_get(json_object_get(j, "centered_clip"), "iterations")) ==
	                   7,
	   "the normalized config holds them (what the plan hands the aggregators)");
	json_decref(j);
	free(norm);
	pf_free(&p);
	const char *ccd =
	        "{\"name\":\"cc\",\"dataset\":\"tiny\",\"model\":{\"n_layer\":2,\"n_head\":2,"
	        "\"d_model\":64,\"seq_len\":32},\"target_batch\":64,\"aggregation\":\"centered_clip\"}";
	ok(pf_parse(ccd, strlen(ccd), &p, NULL, &eb) == COT_OK && p.clip_tau == 1.0 && p.clip_iters == 20,
	   "CenteredClip's defaults are BTARD's: tau 1, 20 iterations");
	pf_free(&p);
	refuse(cc, "\"aggregation\":\"centered_clip\"", "\"aggregation\":\"median\"", "aggregation",
	       "an unknown aggregation");
	refuse(cc, "\"aggregation\":\"centered_clip\"", "\"aggregation\":\"mean\"", "centered_clip",
	       "centered_clip settings with the mean");
	refuse(cc, "\"tau\":0.25", "\"tau\":0", "centered_clip.tau", "a tau of 0");
	refuse(cc, "\"iterations\":7", "\"iterations\":0", "centered_clip.iterations", "0 iterations");
	refuse(cc, "\"iterations\":7", "\"iterations\":7,\"eps\":1", "centered_clip.eps", "an unknown key");
	/* Precision of a GPU host's products: each name read, kept in the
	 * normalized file and read back by the kernels (what a client binds its
	 * GPU with); bf16 when absent, spelled out. */
	{
		static const char *const names[] = { "fp32", "tf32", "bf16" };
		static const int precs[] = { KERN_PREC_FP32, KERN_PREC_TF32, KERN_PREC_BF16 };
		for (int i = 0; i < 3; i++) {
			char buf[4096], want[32], *n2 = NULL, *n3 = NULL;
			snprintf(buf, sizeof buf, "%.*s,\"precision\":\"%s\"}", (int)strlen(minimal) - 1,
			         minimal, names[i]);
			snprintf(want, sizeof want, "\"precision\": \"%s\"", names[i]);
			kern_mode_config mc = { .precision = -1 };
			pf_project back;
			eb.msg[0] = '\0';
			ok(pf_parse(buf, strlen(buf), &p, &n2, &eb) == COT_OK && p.precision == precs[i] &&
			           n2 && strstr(n2, want) &&
			           kern_mode_config_from_json(n2, &mc, &eb) == COT_OK &&
			           mc.precision == precs[i],
			   "\"precision\": \"%s\" is read, normalized and read back by the kernels %s",
			   names[i], eb.msg);
			ok(n2 && pf_parse(n2, strlen(n2), &back, &n3, &eb) == COT_OK && n3 &&
			           strcmp(n2, n3) == 0 && back.precision == precs[i],
			   "  and normalizes to itself");
			free(n2);
			free(n3);
			pf_free(&back);
			pf_free(&p);
		}
		char *n2 = NULL;
		kern_mode_config mc = { .precision = -1 };
		ok(!strstr(minimal, "precision") &&
		           pf_parse(minimal, strlen(minimal), &p, &n2, &eb) == COT_OK &&
		           p.precision == KERN_PREC_BF16 && n2 && strstr(n2, "\"precision\": \"bf16\"") &&
		           kern_mode_config_from_json(n2, &mc, &eb) == COT_OK &&
		           mc.precision == KERN_PREC_BF16,
		   "without \"precision\" the project computes in bf16 and its normalized file says so");
		free(n2);
		pf_free(&p);
	}
	const char *prec = "{\"name\":\"pr\",\"dataset\":\"tiny\",\"model\":{\"n_layer\":2,\"n_head\":2,"
	                   "\"d_model\":64,\"seq_len\":32},\"target_batch\":64,\"precision\":\"tf32\"}";
	refuse(prec, "\"tf32\"", "\"fp16\"", "precision", "a precision of fp16");
	ok(strstr(eb_last.msg, "\"fp32\", \"tf32\", \"bf16\"") && strstr(eb_last.hint, "GPU"),
	   "  the message lists the allowed values and the hint says what it sets: %s / %s", eb_last.msg,
	   eb_last.hint);
	refuse(prec, "\"tf32\"", "\"BF16\"", "precision", "a precision in capitals");
	refuse(prec, "\"tf32\"", "16", "precision", "a precision that is not a string");
	refuse(prec, "\"precision\":\"tf32\"", "\"changes\":[{\"version\":1,\"precision\":\"fp32\"}]",
	       "changes[0].precision", "a precision in a mid-run change");
	refuse(local, "\"mode\":\"local\"", "\"mode\":\"async\"", "mode", "an unknown mode");
	refuse(local, "\"mode\":\"local\"", "\"mode\":\"sync\"", "inner_batch", "inner_batch in sync mode");
	refuse(local, "\"mode\":\"local\",\"inner_batch\":2,", "", "outer", "outer without local mode");
	refuse(local, "\"inner_batch\":2", "\"inner_batch\":0", "inner_batch", "an inner batch of 0");
	refuse(local, "\"inner_batch\":2", "\"inner_batch\":100000", "inner_batch",
	       "an inner batch too large");
	refuse(local, "\"inner_batch\":2", "\"inner_batch\":2.5", "inner_batch", "a fractional inner batch");
	refuse(local, "\"lr\":0.5", "\"lr\":0", "outer.lr", "an outer lr of 0");
	refuse(local, "\"lr\":0.5", "\"lr\":11", "outer.lr", "an outer lr above 10");
	refuse(local, "\"momentum\":0.8", "\"momentum\":1", "outer.momentum", "an outer momentum of 1");
	refuse(local, "\"momentum\":0.8", "\"momentum\":-0.1", "outer.momentum", "a negative momentum");
	refuse(local, "\"nesterov\":false", "\"nesterov\":0", "outer.nesterov",
	       "a nesterov that is not a boolean");
	refuse(local, "\"nesterov\":false", "\"nesterov\":false,\"dampening\":0", "outer.dampening",
	       "an unknown outer key");
	refuse(local, "\"outer\":{\"lr\":0.5,\"momentum\":0.8,\"nesterov\":false}", "\"outer\":0.7", "outer",
	       "an outer that is not an object");

	/* Mid-run changes ("changes", kernels/config_changes.h). */
	const char *ch = "\"work_unit_seconds\":120}";
	const char *with = "\"work_unit_seconds\":120,\"validation\":{\"first_rate\":0.5},\"changes\":["
	                   "{\"version\":7,\"at\":\"2026-11-26T09:00:00Z\",\"target_batch\":512},"
	                   "{\"version\":3,\"optimizer\":{\"lr\":0.0001,\"schedule\":{\"total_steps\":400}},"
	                   "\"validation\":{\"min_rate\":0.2}}]}";
	char buf[4096];
	snprintf(buf, sizeof buf, "%.*s%s", (int)(strstr(full, ch) - full), full, with);
	norm = NULL;
	if (is_int(pf_parse(buf, strlen(buf), &p, &norm, &eb), COT_OK, "a file with changes parses: %s",
	           eb.msg)) {
		ok(p.n_changes == 2 && p.target_batch == 256 && p.opt.lr == 0.0003 && p.has_validation &&
		           p.validation.first_rate == 0.5,
		   "the file's own settings are those before any change");
		j = norm ? json_loads(norm, 0, NULL) : NULL;
		json_t *c = json_object_get(j, "changes");
		ok(json_array_size(c) == 2 &&
		           json_integer_value(json_object_get(json_array_get(c, 0), "version")) == 3,
		   "the normalized file keeps the changes, in ascending version");
		json_decref(j);
		kern_opt_config o2, o3, o9;
		ok(kern_opt_config_at(norm, 2, &o2, &eb) == COT_OK &&
		           kern_opt_config_at(norm, 3, &o3, &eb) == COT_OK &&
		           kern_opt_config_at(norm, 9, &o9, &eb) == COT_OK && o2.lr == 0.0003f &&
		           o2.total_steps == 100 && o3.lr == 0.0001f && o3.total_steps == 400 &&
		           o3.warmup_steps == 10 && o3.decay == KERN_DECAY_LINEAR && o9.lr == 0.0001f,
		   "the optimizer at each version: the file's before 3, the change's lr and total_steps from "
		   "3 "
		   "(the rest of the schedule kept)");
		char *at = NULL;
		j = kern_config_at(norm, 8, &at, &eb) == COT_OK ? json_loads(at, 0, NULL) : NULL;
		json_t *val = json_object_get(j, "validation");
		ok(j && json_integer_value(json_object_get(j, "target_batch")) == 512 &&
		           !json_object_get(j, "changes") &&
		           json_real_value(json_object_get(val, "first_rate")) == 0.5 &&
		           json_real_value(json_object_get(val, "min_rate")) == 0.2,
		   "the config at version 8: target 512, both changes' validation merged key by key");
		json_decref(j);
		free(at);
		pf_free(&p);
	}
	free(norm);
	norm = NULL;
	refuse(buf, "\"target_batch\":512", "\"target_batch\":4", "target_batch",
	       "a change to a target batch below the microbatch size");
	refuse(buf, "\"lr\":0.0001", "\"lr\":-0.0001", "optimizer.lr", "a change to a negative lr");
	refuse(buf, "\"lr\":0.0001", "\"beta1\":0.5", "changes[1].optimizer.beta1",
	       "a change to a setting a run cannot change");
	refuse(buf, "\"version\":7,", "\"version\":7,\"model\":{},", "changes[0].model",
	       "a change to the model");
	refuse(buf, "\"version\":7,", "", "changes[0].version", "a change without a version");
	refuse(buf, "\"version\":7", "\"version\":-1", "changes[0].version", "a negative version");
	refuse(buf, "\"total_steps\":400", "\"warmup_steps\":400", "optimizer.schedule.warmup_steps",
	       "a change whose warm-up passes the schedule's end");
	refuse(buf, "\"first_rate\":0.5", "\"first_rate\":2", "validation.first_rate", "a rate above 1");
	refuse(buf, "\"first_rate\":0.5", "\"decay\":0", "validation.decay",
	       "a decay of 0 (a rate that never comes back)");
	refuse(local, "\"outer\":", "\"changes\":5,\"outer\":", "changes", "changes that are not an array");
	ok(parse_edit(local, "\"outer\":",
	              "\"changes\":[{\"version\":1,\"optimizer\":{\"lr\":0.1}}],\"outer\":", &eb) == COT_OK,
	   "a local-mode project takes an optimizer change (its inner steps')");
	refuse(local, "\"outer\":", "\"changes\":[{\"version\":1,\"at\":\"x\"}],\"outer\":", "changes[0]",
	       "a change of nothing");

	char *huge = malloc(PF_MAX_BYTES + 2);
	if (huge) {
		memset(huge, ' ', PF_MAX_BYTES + 1);
		huge[0] = '{';
		huge[PF_MAX_BYTES] = '}';
		is_int(pf_parse(huge, PF_MAX_BYTES + 1, &p, NULL, &eb), COT_ERR_TOO_LARGE,
		       "refuse an oversized file");
		free(huge);
	}
	done_testing();
	return exit_status();
}
