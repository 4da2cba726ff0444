/* cotrain-admin model export: write one model version of a project to a
 * folder, for use outside cotrain.
 *
 * --format hf (the default) writes the GPT-2 layout of kernels/hf_gpt2.h,
 * which Hugging Face transformers loads with
 * GPT2LMHeadModel.from_pretrained(DIR), plus a README.md model card from
 * the database (project, dataset, rounds, samples, contributors, the last
 * round's loss).  --format cotrain writes the stored checkpoint itself,
 * optimizer moments and step included, byte for byte, with the same card.
 *
 * Nothing partial is ever left at DIR: the files are written into a fresh
 * folder beside it (".NAME.export-XXXXXX"), fsynced, and the folder is
 * renamed to DIR in one step; DIR may exist only as an empty folder. */
#include "server/admin.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/checkpoint.h"
#include "kernels/hf_gpt2.h"
#include "kernels/hf_tokenizer.h"
#include "kernels/model.h"
#include "kernels/spm.h"
#include "shared/common/filestore.h"

#define CKPT_EXPORT_FILE "checkpoint.safetensors"
#define PATH_MAX_EXPORT 2048

static const char usage[] =
        "usage: cotrain-admin model export [--version V] [--format hf|cotrain] [--pin] PROJECT DIR\n"
        "       cotrain-admin model pin PROJECT VERSION | model unpin PROJECT VERSION\n"
        "\n"
        "export writes model version V of PROJECT (default: its current version) to\n"
        "the folder DIR, which must not exist or be empty.  --format hf (the default)\n"
        "writes config.json, model.safetensors (GPT-2 names, fp32 weights only),\n"
        "tokenizer.json and tokenizer_config.json (token = byte; for a dataset of\n"
        "subword ids its tokenizer, with spiece.model), which Hugging Face\n"
        "transformers loads with GPT2LMHeadModel.from_pretrained(DIR) and\n"
        "cotrain-generate with --checkpoint DIR; --format cotrain writes the stored\n"
        "checkpoint with its optimizer state as checkpoint.safetensors.  Both add a\n"
        "README.md model card.  See doc/model.md.  --pin also pins the version.\n"
        "\n"
        "pin keeps a version's checkpoint in the file store whatever the retention\n"
        "policy (files gc, the server's --gc-interval); unpin lets the policy decide\n"
        "again.\n";

/* What the model card says, from the database. */
typedef struct {
	char project_id[32];
	char *name, *title, *description, *dataset, *license;
	long long n_tokens, samples, rounds, hosts, accounts;
	int version, current;
	char sha[FS_SHA_HEX_LEN + 1];
	char created[64];
	bool have_loss;
	double loss;
	char tokenizer[16];                     /* the dataset's: "byte", "unigram", "bpe" */
	char tokenizer_sha[FS_SHA_HEX_LEN + 1]; /* its model in the store; "" for bytes */
} card_info;

static void card_free(card_info *c)
{
	free(c->name);
	free(c->title);
	free(c->description);
	free(c->dataset);
	free(c->license);
}

static char *dup_value(PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? NULL : strdup(PQgetvalue(r, row, col));
}

/* Look up the project, the version and its numbers into *c.  Reports errors
 * itself; ADMIN_OK or ADMIN_FAIL. */
static int lookup(admin_ctx *ctx, const char *project, long long version, card_info *c)
{
	cot_errbuf eb = { "", "" };
	const char *pp[1] = { project };
	PGresult *r = admin_exec(ctx,
	                         "SELECT p.id, p.name, p.title, p.description, p.current_version, d.name,"
	                         "       d.n_tokens, p.config->>'license', d.tokenizer,"
	                         "       coalesce(d.tokenizer_sha256, '')"
	                         "  FROM project p JOIN dataset d ON d.id = p.dataset_id WHERE p.name = $1",
	                         1, pp, &eb);
	if (!r)
		return admin_fail(&eb);
	if (PQntuples(r) == 0) {
		PQclear(r);
		cot_seterr(&eb, COT_ERR_NOT_FOUND, "project \"%.80s\" does not exist", project);
		cot_sethint(&eb, "cotrain-admin project list shows the projects.");
		return admin_fail(&eb);
	}
	snprintf(c->project_id, sizeof c->project_id, "%s", PQgetvalue(r, 0, 0));
	c->name = dup_value(r, 0, 1);
	c->title = dup_value(r, 0, 2);
	c->description = dup_value(r, 0, 3);
	c->current = atoi(PQgetvalue(r, 0, 4));
	c->dataset = dup_value(r, 0, 5);
	c->n_tokens = strtoll(PQgetvalue(r, 0, 6), NULL, 10);
	c->license = dup_value(r, 0, 7);
	snprintf(c->tokenizer, sizeof c->tokenizer, "%s", PQgetvalue(r, 0, 8));
	snprintf(c->tokenizer_sha, sizeof c->tokenizer_sha, "%s", PQgetvalue(r, 0, 9));
	PQclear(r);
	if (!c->name || !c->title || !c->description || !c->dataset)
		return admin_failf("out of memory");
	c->version = version < 0 ? c->current : (int)version;

	char v[16];
	snprintf(v, sizeof v, "%d", c->version);
	const char *vp[2] = { c->project_id, v };
	if (!(r = admin_exec(ctx,
	                     "SELECT checkpoint_sha256, to_char(created_at AT TIME ZONE 'UTC',"
	                     "       'YYYY-MM-DD HH24:MI:SS') || ' UTC'"
	                     "  FROM model_version WHERE project_id = $1 AND version = $2",
	                     2, vp, &eb)))
		return admin_fail(&eb);
	if (PQntuples(r) == 0 || PQgetisnull(r, 0, 0)) {
		bool row = PQntuples(r) > 0;
		PQclear(r);
		if (row)
			cot_seterr(&eb, COT_ERR_NOT_FOUND,
			           "model version %d of project \"%s\" has no checkpoint", c->version,
			           c->name);
		else
			cot_seterr(&eb, COT_ERR_NOT_FOUND, "project \"%s\" has no model version %d", c->name,
			           c->version);
		if (row)
			cot_sethint(&eb, "The file store's retention removed it; pin versions to keep them "
			                 "(model pin, model export --pin).");
		else
			cot_sethint(&eb, "Its versions are 0 to %d.", c->current);
		return admin_fail(&eb);
	}
	snprintf(c->sha, sizeof c->sha, "%s", PQgetvalue(r, 0, 0));
	snprintf(c->created, sizeof c->created, "%s", PQgetvalue(r, 0, 1));
	PQclear(r);

	/* the rounds below the version made it: their samples, the loss of the
	 * last, the hosts whose parameters agreed */
	if (!(r = admin_exec(ctx,
	                     "SELECT count(*), coalesce(sum(coalesce(gradient_samples, samples)), 0),"
	                     "       (SELECT loss FROM round WHERE project_id = $1 AND version = $2 - 1),"
	                     "       (SELECT count(DISTINCT m.host_id) FROM round_member m"
	                     "         WHERE m.project_id = $1 AND m.version < $2 AND m.accepted),"
	                     "       (SELECT count(DISTINCT h.account_id) FROM round_member m"
	                     "          JOIN host h ON h.id = m.host_id"
	                     "         WHERE m.project_id = $1 AND m.version < $2 AND m.accepted)"
	                     "  FROM round WHERE project_id = $1 AND version < $2 AND state = 'committed'",
	                     2, vp, &eb)))
		return admin_fail(&eb);
	c->rounds = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	c->samples = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
	c->have_loss = !PQgetisnull(r, 0, 2);
	c->loss = c->have_loss ? strtod(PQgetvalue(r, 0, 2), NULL) : 0;
	c->hosts = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
	c->accounts = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
	PQclear(r);
	return ADMIN_OK;
}

/* A licence identifier safe to put in the card's YAML header. */
static bool license_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n < 1 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-' || s[i] == '+'))
			return false;
	return true;
}

/* The model card's sections on a GPT: model, tokenizer (c's, bytes when it has none),
 * use or files. */
static void card_gpt(FILE *f, const card_info *c, const kern_model *m, bool hf)
{
	const kern_config *k = &m->config;
	fprintf(f,
	        "## Model\n\n"
	        "GPT-2 (pre-LayerNorm blocks, tanh GELU, LayerNorm eps 1e-5, output head tied to\n"
	        "the token embedding): %d layers, %d heads, width %d, MLP width %d, context %d,\n"
	        "vocabulary %d; %zu parameters.\n",
	        k->n_layer, k->n_head, k->d_model, k->d_ff, k->seq_len, k->vocab, m->n_params);
	if (k->n_shared < k->n_layer)
		fprintf(f,
		        "Trained with %d parameter sets shared among the %d layers (ALBERT style: layer\n"
		        "l uses set l * %d / %d); %s\n",
		        k->n_shared, k->n_layer, k->n_shared, k->n_layer,
		        hf ? "each layer's copy is written out in full, so fine-tuning may untie them."
		           : "the checkpoint holds each set once.");
	if (c->tokenizer_sha[0])
		fprintf(f,
		        "\n## Tokenizer\n\n"
		        "SentencePiece %s of %d pieces trained on the dataset's text (sha256 `%s`):\n"
		        "`spiece.model`%s. Documents were joined by two newline pieces.\n"
		        "`cotrain-generate --checkpoint DIR --tokenizer DIR/spiece.model` decodes its\n"
		        "output.\n",
		        c->tokenizer, k->vocab, c->tokenizer_sha,
		        hf ? ", and `tokenizer.json` in the form of Hugging Face tokenizers" : "");
	else
		fprintf(f,
		        "\n## Tokenizer\n\n"
		        "Byte level: token = byte value (0 to 255) of the UTF-8 text; no merges, no special\n"
		        "tokens. Documents were joined with a blank line; `bos_token_id` and `eos_token_id`\n"
		        "are %d (\"\\n\").\n",
		        HF_EOS_TOKEN);
	if (hf && !c->tokenizer_sha[0])
		fprintf(f, "`tokenizer.json` says the same in the form of Hugging Face tokenizers (a\n"
		           "ByteLevel BPE without merges, whose ids are the byte values).\n\n"
		           "## Use\n\n"
		           "```python\n"
		           "import torch\n"
		           "from transformers import GPT2LMHeadModel\n"
		           "model = GPT2LMHeadModel.from_pretrained(\"DIR\")\n"
		           "ids = torch.tensor([list(\"Hello\".encode())])\n"
		           "out = model.generate(ids, max_new_tokens=64, do_sample=True, top_k=40)\n"
		           "print(bytes(out[0].tolist()).decode(errors=\"replace\"))\n"
		           "```\n\n"
		           "or `cotrain-generate --checkpoint DIR --prompt \"Hello\"`.\n");
	else if (!hf)
		fprintf(f,
		        "\n## Files\n\n"
		        "`%s` is cotrain's checkpoint (kernels/checkpoint.h, doc/model.md): the\n"
		        "parameters (`param.*`), both optimizer moments (`opt.m.*`, `opt.v.*`) and the\n"
		        "step in the metadata. `cotrain-generate --checkpoint DIR/%s` reads it.\n",
		        CKPT_EXPORT_FILE, CKPT_EXPORT_FILE);
}

/* The same for an encoder (kernels/encoder.h, kernels/hf_albert.h), with
 * c's tokenizer: bytes and four special ids after them, or a subword
 * model's pieces. */
static void card_encoder(FILE *f, const card_info *c, const kern_model *m, bool hf)
{
	const kern_config *k = &m->config;
	int albert = k->arch == KERN_ARCH_ALBERT;
	fprintf(f,
	        "## Model\n\n"
	        "%s, pretrained with masked language modelling and sentence order (post-LayerNorm\n"
	        "blocks, %s GELU, LayerNorm eps 1e-12, MLM decoder tied to the word embedding): %d\n"
	        "layers on %d parameter set%s, %d heads, width %d, embedding width %d, MLP width %d,\n"
	        "context %d, vocabulary %d; %zu parameters.\n",
	        albert ? "ALBERT" : "BERT", albert ? "tanh" : "erf", k->n_layer, k->n_shared,
	        k->n_shared == 1 ? "" : "s", k->n_head, k->d_model, k->d_embed, k->d_ff, k->seq_len, k->vocab,
	        m->n_params);
	if (k->position != KERN_POS_ABSOLUTE) /* an absolute model's card is as before the option */
		fprintf(f,
		        "Positions: relative (position_embedding_type %s, a learned distance embedding in\n"
		        "each attention's scores; the position embeddings are not added).\n",
		        kern_position_name(k->position));
	if (c->tokenizer_sha[0])
		fprintf(f,
		        "\n## Tokenizer\n\n"
		        "SentencePiece %s model of %d pieces (sha256 `%s`), trained on the dataset's text\n"
		        "(`spiece.model`%s). Special pieces: [CLS] %d, [SEP] %d, [MASK] %d, [PAD] %d,\n"
		        "unknown %d. A sample is [CLS] A [SEP] B [SEP] (segment ids 0 up to the first\n"
		        "[SEP], 1 after).\n",
		        c->tokenizer, k->vocab, c->tokenizer_sha,
		        hf ? "; `tokenizer.json` for Hugging Face tokenizers, whose template adds\n"
		             "[CLS] and [SEP]; `tokenizer_config.json` and `special_tokens_map.json`"
		           : "",
		        k->cls_id, k->sep_id, k->mask_id, k->pad_id, k->unk_id);
	else
		fprintf(f,
		        "\n## Tokenizer\n\n"
		        "Byte level: token = byte value (0 to 255) of the UTF-8 text, then [CLS] %d,\n"
		        "[SEP] %d, [MASK] %d, [PAD] %d; there is no unknown token. A sample is\n"
		        "[CLS] A [SEP] B [SEP]. No tokenizer file is written: the ids of a text are its\n"
		        "UTF-8 bytes, with the four special ids added around them.\n",
		        k->cls_id, k->sep_id, k->mask_id, k->pad_id);
	if (hf)
		fprintf(f,
		        "\n## Use\n\n"
		        "```python\n"
		        "from transformers import %sForPreTraining\n"
		        "model = %sForPreTraining.from_pretrained(\"DIR\")\n"
		        "```\n\n"
		        "or `cotrain-generate --checkpoint CHECKPOINT --fill-mask \"text with [MASK]\"` on "
		        "the\n"
		        "cotrain checkpoint.\n",
		        albert ? "Albert" : "Bert", albert ? "Albert" : "Bert");
	else
		fprintf(f,
		        "\n## Files\n\n"
		        "`%s` is cotrain's checkpoint (kernels/checkpoint.h, doc/model.md).\n"
		        "`cotrain-generate --checkpoint DIR --fill-mask \"text with [MASK]\"` reads it%s.\n",
		        CKPT_EXPORT_FILE, c->tokenizer_sha[0] ? " and its tokenizer `spiece.model`" : "");
}

/* The README.md model card into a malloc'd string (*len bytes), or NULL. */
static char *card_text(const card_info *c, const kern_model *m, bool hf, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		return NULL;
	const kern_config *k = &m->config;
	fprintf(f, "---\n");
	if (license_ok(c->license))
		fprintf(f, "license: %s\n", c->license);
	int enc = m->config.arch != KERN_ARCH_GPT;
	fprintf(f, "library_name: %s\ntags:\n- cotrain\n- %s\n%s%s---\n\n", hf ? "transformers" : "cotrain",
	        enc ? kern_arch_name(m->config.arch) : "gpt2", c->tokenizer_sha[0] ? "" : "- byte-level\n",
	        enc ? "- fill-mask\n" : "");
	fprintf(f, "# %s, version %d\n\n", c->title, c->version);
	if (c->description[0])
		fprintf(f, "%s\n\n", c->description);
	fprintf(f, "Trained together by volunteers with cotrain.\n\n");
	fprintf(f, "| | |\n|---|---|\n");
	fprintf(f, "| project | `%s` |\n", c->name);
	fprintf(f, "| dataset | `%s` (%lld tokens) |\n", c->dataset, c->n_tokens);
	fprintf(f, "| version | %d (of %d so far), made %s |\n", c->version, c->current, c->created);
	fprintf(f, "| rounds | %lld committed rounds, %ld optimizer steps |\n", c->rounds, m->step);
	fprintf(f, "| samples | %lld (of %d tokens each) |\n", c->samples, k->seq_len);
	fprintf(f, "| contributors | %lld hosts of %lld accounts |\n", c->hosts, c->accounts);
	if (c->have_loss)
		fprintf(f, "| loss of the last round | %.4f (%s) |\n", c->loss,
		        enc ? "masked-LM plus sentence-order cross-entropy, nats"
		            : "training cross-entropy, nats per byte");
	else
		fprintf(f, "| loss of the last round | none: version 0 is the seed model |\n");
	fprintf(f, "| licence | %s |\n", c->license && c->license[0] ? c->license : "not stated");
	fprintf(f, "| checkpoint | sha256 `%s` |\n\n", c->sha);
	if (enc)
		card_encoder(f, c, m, hf);
	else
		card_gpt(f, c, m, hf);
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* The subword tokenizer of a model trained on token ids, from the store
 * (checked by sha256): spiece.model, and with hf tokenizer.json and
 * tokenizer_config.json in place of the byte tokenizer's
 * (kernels/hf_tokenizer.h). */
static cot_err write_tokenizer(admin_ctx *ctx, const char *sha, const char *dir, bool hf, int max_len,
                               cot_errbuf *eb)
{
	spm_model *m = NULL;
	size_t len = 0;
	cot_err rc = admin_tokenizer_load(ctx, sha, &m, eb);
	const unsigned char *bytes = rc ? NULL : spm_bytes(m, &len);
	if (!rc)
		rc = hf ? hf_tokenizer_write(m, dir, max_len, eb)
		        : hf_write_file(dir, "spiece.model", bytes, len, eb);
	spm_free(m);
	return rc;
}

/* Copy the file at src to dir/name, fsynced. */
static cot_err copy_file(const char *src, const char *dir, const char *name, cot_errbuf *eb)
{
	char dst[PATH_MAX_EXPORT * 3];
	snprintf(dst, sizeof dst, "%s/%s", dir, name);
	int in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not open \"%s\": %s", src, strerror(errno));
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (out < 0) {
		int e = errno;
		close(in);
		return cot_seterr(eb, COT_ERR_IO, "could not create \"%s\": %s", dst, strerror(e));
	}
	static char buf[1 << 16];
	int err = 0;
	for (;;) {
		ssize_t k = read(in, buf, sizeof buf);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			err = k < 0 ? errno : 0;
			break;
		}
		for (ssize_t off = 0; off < k && !err;) {
			ssize_t w = write(out, buf + off, (size_t)(k - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				err = w < 0 ? errno : EIO;
			else
				off += w;
		}
		if (err)
			break;
	}
	if (!err && fsync(out) != 0)
		err = errno;
	if (close(out) != 0 && !err)
		err = errno;
	close(in);
	if (err)
		return cot_seterr(eb, COT_ERR_IO, "could not write \"%s\": %s", dst, strerror(err));
	return COT_OK;
}

/* Remove the flat folder dir and the files in it (our temporary folder). */
static void remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *e;
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
				unlinkat(dirfd(d), e->d_name, 0);
		closedir(d);
	}
	rmdir(dir);
}

/* Check that dir does not exist or is an empty folder, and that its parent
 * is a folder; split it into parent and base (trailing slashes dropped). */
static int check_target(const char *dir, char *parent, size_t plen, char *base, size_t blen)
{
	char p[PATH_MAX_EXPORT];
	size_t n = strlen(dir);
	if (n == 0 || n >= sizeof p)
		return admin_failf("export folder name is empty or longer than %d bytes",
		                   PATH_MAX_EXPORT - 1);
	memcpy(p, dir, n + 1);
	while (n > 1 && p[n - 1] == '/')
		p[--n] = '\0';
	char *slash = strrchr(p, '/');
	const char *b = slash ? slash + 1 : p;
	if (!*b || strcmp(b, ".") == 0 || strcmp(b, "..") == 0)
		return admin_failf("cannot export to \"%s\": name a new folder", dir);
	snprintf(base, blen, "%s", b);
	if (!slash)
		snprintf(parent, plen, ".");
	else if (slash == p)
		snprintf(parent, plen, "/");
	else {
		*slash = '\0';
		snprintf(parent, plen, "%s", p);
	}
	struct stat st;
	if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
		return admin_failf("cannot export to \"%s\": folder \"%s\" does not exist", dir, parent);
	if (lstat(dir, &st) != 0) {
		if (errno == ENOENT)
			return ADMIN_OK;
		return admin_failf("could not examine \"%s\": %s", dir, strerror(errno));
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr,
		        "cotrain-admin: error: cannot export to \"%s\": it exists and is not a folder\n",
		        dir);
		return ADMIN_FAIL;
	}
	DIR *d = opendir(dir);
	if (!d)
		return admin_failf("could not open folder \"%s\": %s", dir, strerror(errno));
	struct dirent *e;
	bool empty = true;
	while (empty && (e = readdir(d)))
		empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
	closedir(d);
	if (!empty) {
		fprintf(stderr,
		        "cotrain-admin: error: cannot export to \"%s\": the folder is not empty\n"
		        "cotrain-admin: hint: Name a new folder, or empty this one first.\n",
		        dir);
		return ADMIN_FAIL;
	}
	return ADMIN_OK;
}

/* Set model_version.pinned of a version; reports itself. */
static int set_pin(admin_ctx *ctx, const char *project, long long version, bool pinned)
{
	char v[24];
	snprintf(v, sizeof v, "%lld", version);
	const char *pp[3] = { project, v, pinned ? "true" : "false" };
	cot_errbuf eb = { "", "" };
	PGresult *r = admin_exec(ctx,
	                         "UPDATE model_version mv SET pinned = $3::boolean FROM project p"
	                         " WHERE p.id = mv.project_id AND p.name = $1 AND mv.version = $2::integer"
	                         " RETURNING mv.checkpoint_sha256 IS NOT NULL",
	                         3, pp, &eb);
	if (!r)
		return admin_fail(&eb);
	if (PQntuples(r) == 0) {
		PQclear(r);
		cot_seterr(&eb, COT_ERR_NOT_FOUND, "project \"%s\" has no model version %lld", project,
		           version);
		cot_sethint(&eb, "cotrain-admin project list shows the projects and their current versions.");
		return admin_fail(&eb);
	}
	bool has = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	printf("%s version %lld of project \"%s\"%s\n", pinned ? "pinned" : "unpinned", version, project,
	       pinned && !has ? " (its checkpoint was already collected)" : "");
	return ADMIN_OK;
}

/* pin|unpin PROJECT VERSION */
static int pin_cmd(admin_ctx *ctx, int argc, char **argv, bool pinned)
{
	long long version;
	const char *cmd = pinned ? "pin" : "unpin";
	if (argc != 3)
		return admin_usage(usage, "model %s: give a PROJECT and a VERSION", cmd);
	if (!admin_parse_ll(argv[2], 0, 2147483647, &version))
		return admin_usage(usage, "model %s: VERSION must be an integer from 0 to 2147483647", cmd);
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	return set_pin(ctx, argv[1], version, pinned);
}

static int export_cmd(admin_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "version", required_argument, NULL, 'v' },
		{ "format", required_argument, NULL, 'f' },
		{ "pin", no_argument, NULL, 'p' },
		{ NULL, 0, NULL, 0 },
	};
	long long version = -1;
	bool hf = true, pin = false;
	int c;
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'v') {
			if (!admin_parse_ll(optarg, 0, 2147483647, &version))
				return admin_usage(usage, "model export: --version must be an integer from 0 "
				                          "to 2147483647");
		} else if (c == 'p') {
			pin = true;
		} else if (c == 'f') {
			if (strcmp(optarg, "hf") == 0)
				hf = true;
			else if (strcmp(optarg, "cotrain") == 0)
				hf = false;
			else
				return admin_usage(usage,
				                   "model export: --format must be \"hf\" or \"cotrain\"");
		} else {
			return admin_usage(usage, "model export: bad option \"%s\"", argv[optind - 1]);
		}
	}
	if (argc - optind != 2)
		return admin_usage(usage, "model export: give a PROJECT and a DIR");
	const char *project = argv[optind], *dir = argv[optind + 1];
	char parent[PATH_MAX_EXPORT], base[PATH_MAX_EXPORT], tmp[PATH_MAX_EXPORT * 2 + 32];
	if (check_target(dir, parent, sizeof parent, base, sizeof base))
		return ADMIN_FAIL;
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;

	card_info ci;
	memset(&ci, 0, sizeof ci);
	kern_model *m = NULL;
	char *card = NULL;
	bool made_tmp = false;
	int ret = ADMIN_FAIL;
	cot_errbuf eb = { "", "" };
	if (lookup(ctx, project, version, &ci))
		goto out;

	char path[1024];
	if (fs_path(ctx->store_dir, ci.sha, path, sizeof path, &eb) ||
	    fs_verify(ctx->store_dir, ci.sha, NULL, &eb)) {
		admin_failf("cannot export version %d of project \"%s\": its checkpoint %s: %s", ci.version,
		            ci.name, ci.sha, eb.msg);
		goto out;
	}
	if (ckpt_load_new(path, 0, &m, &eb)) {
		admin_fail(&eb);
		goto out;
	}

	snprintf(tmp, sizeof tmp, "%s/.%s.export-XXXXXX", parent, base);
	if (!mkdtemp(tmp)) {
		admin_failf("could not create a folder in \"%s\": %s", parent, strerror(errno));
		goto out;
	}
	made_tmp = true;
	if (chmod(tmp, 0755) != 0) {
		admin_failf("could not change the mode of \"%s\": %s", tmp, strerror(errno));
		goto out;
	}
	size_t card_len = 0;
	if (hf ? hf_write(m, tmp, &eb) : copy_file(path, tmp, CKPT_EXPORT_FILE, &eb)) {
		admin_fail(&eb);
		goto out;
	}
	if (ci.tokenizer_sha[0] && write_tokenizer(ctx, ci.tokenizer_sha, tmp, hf, m->config.seq_len, &eb)) {
		admin_failf("cannot export the tokenizer %s of dataset \"%s\": %s", ci.tokenizer_sha,
		            ci.dataset, eb.msg);
		goto out;
	}
	if (!(card = card_text(&ci, m, hf, &card_len))) {
		admin_failf("out of memory for the model card");
		goto out;
	}
	if (hf_write_file(tmp, "README.md", card, card_len, &eb)) {
		admin_fail(&eb);
		goto out;
	}
	int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0) {
		admin_failf("could not sync folder \"%s\": %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	close(fd);
	/* rename() replaces an empty folder and refuses a non-empty one, so a
	 * folder filled meanwhile is not lost */
	if (rename(tmp, dir) != 0) {
		if (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR)
			admin_failf("cannot export to \"%s\": it is no longer an empty folder", dir);
		else
			admin_failf("could not rename \"%s\" to \"%s\": %s", tmp, dir, strerror(errno));
		goto out;
	}
	made_tmp = false;
	fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
	printf("exported version %d of project \"%s\" (%zu parameters, %s format) to \"%s\"\n", ci.version,
	       ci.name, m->n_params, hf ? "hf" : "cotrain", dir);
	ret = pin ? set_pin(ctx, ci.name, ci.version, true) : ADMIN_OK;
out:
	if (made_tmp)
		remove_tree(tmp);
	free(card);
	kern_model_free(m);
	card_free(&ci);
	return ret;
}

int admin_model_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "model: no command given");
	if (strcmp(argv[1], "export") == 0)
		return export_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(argv[1], "pin") == 0 || strcmp(argv[1], "unpin") == 0)
		return pin_cmd(ctx, argc - 1, argv + 1, argv[1][0] == 'p');
	return admin_usage(usage, "model: unknown command \"%s\"", argv[1]);
}
