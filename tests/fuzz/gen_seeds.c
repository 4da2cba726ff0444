/* cotrain tests: writes the seed inputs of the fuzz harnesses, each a valid
 * input made by cotrain's own encoders and writers (so a seed is what a
 * well-behaved peer, server or maintainer sends), into
 * <corpus>/<harness>/seed-*.  Built on demand, not by `make`:
 *
 *   make tests/fuzz/gen_seeds && tests/fuzz/gen_seeds ../tests/fuzz/corpus
 *
 * Seeds are deterministic; rerunning rewrites the same bytes.  Inputs that
 * once crashed a harness live beside them as crash-* and are never
 * regenerated. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/state.h"
#include "kernels/checkpoint.h"
#include "kernels/safetensors.h"
#include "shared/averaging/allreduce_msg.h"
#include "shared/averaging/compress.h"
#include "shared/common/ckpt_pieces.h"
#include "shared/common/filestore.h"
#include "shared/common/shard.h"
#include "shared/peer/frame.h"
#include "shared/peer/hello.h"

static const char *top;

static void die(const char *what, const char *detail)
{
	fprintf(stderr, "gen_seeds: %s: %s\n", what, detail);
	exit(1);
}

static void put(const char *harness, const char *name, const void *p, size_t n)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", top, harness);
	if (mkdir(path, 0755) && errno != EEXIST)
		die(path, strerror(errno));
	snprintf(path, sizeof path, "%s/%s/seed-%s", top, harness, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f))
		die(path, strerror(errno));
}

static void put_str(const char *harness, const char *name, const char *s)
{
	put(harness, name, s, strlen(s));
}

/* The writer's bytes with a selector byte in front (allreduce_msg). */
static void put_sel(const char *harness, const char *name, uint8_t sel, frame_writer *w)
{
	if (w->err)
		die(name, "encoding failed");
	unsigned char *b = malloc(w->len + 1);
	b[0] = sel;
	memcpy(b + 1, w->buf, w->len);
	put(harness, name, b, w->len + 1);
	free(b);
	frame_writer_free(w);
	frame_writer_init(w, FRAME_PAYLOAD_HARD_MAX);
}

/* A whole frame of type t around the payload in w. */
static void put_frame(const char *name, uint8_t type, frame_writer *w)
{
	frame_header h = { .type = type, .length = (uint32_t)w->len, .request_id = 7 };
	unsigned char *b = malloc(FRAME_HEADER_LEN + w->len);
	frame_header_encode(&h, b);
	if (w->len)
		memcpy(b + FRAME_HEADER_LEN, w->buf, w->len);
	put("frame", name, b, FRAME_HEADER_LEN + w->len);
	free(b);
	frame_writer_free(w);
	frame_writer_init(w, FRAME_PAYLOAD_HARD_MAX);
}

static void peer_seeds(void)
{
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	hello_msg h = { .proto_min = 2,
		        .proto_max = 2,
		        .project = "demo",
		        .host_id = 7,
		        .round = 3,
		        .max_payload = FRAME_PAYLOAD_DEFAULT_MAX };
	hello_encode(&h, &w);
	put("hello", "ours", w.buf, w.len);
	put_frame("hello", FRAME_HELLO, &w);
	hello_msg h2 = { .proto_min = 1,
		         .proto_max = 9,
		         .project = "a-much-longer-project.name_9",
		         .host_id = 1LL << 40,
		         .round = 0,
		         .max_payload = FRAME_PAYLOAD_MIN_MAX };
	hello_encode(&h2, &w);
	put("hello", "range", w.buf, w.len);
	frame_writer_free(&w);
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	put_frame("ready", FRAME_READY, &w);
	frame_error_encode(&w, FRAME_ERR_ROUND, "not in the same round");
	put_frame("error", FRAME_ERROR, &w);
	frame_put_u8(&w, 6);
	frame_put_blob(&w, "abcdef", 6);
	frame_put_u8(&w, 7);
	frame_put_str(&w, "a string");
	frame_put_u8(&w, 2);
	frame_put_u64(&w, 1234567890123ULL);
	frame_put_u8(&w, 4);
	frame_put_f32(&w, 1.5f);
	put_frame("walk", 0x40, &w);
	frame_writer_free(&w);
}

static void averaging_seeds(void)
{
	frame_writer w;
	frame_writer_init(&w, FRAME_PAYLOAD_HARD_MAX);
	float x[8] = { 1.0f, -2.5f, 0.0f, 3e-5f, 65504.0f, -1e-8f, 0.25f, 7.0f };
	unsigned char enc[64];
	cot_errbuf eb;
	for (int k = COMP_NONE; k <= COMP_BLOCK8; k++) {
		size_t n = comp_encoded_size(k, 8);
		if (comp_encode(k, x, 8, enc, n, &eb))
			die("comp_encode", eb.msg);
		ar_slice_msg s = { .round = 3,
			           .from = 7,
			           .samples = 40,
			           .comp = (uint8_t)k,
			           .start = 100,
			           .end = 108,
			           .data = enc,
			           .dlen = n };
		ar_slice_encode(&w, &s);
		char name[32];
		snprintf(name, sizeof name, "slice-%s", comp_name(k));
		put_sel("allreduce_msg", name, 0, &w);
		ar_part_msg pm = { .round = 3, .agg = 5, .start = 100, .end = 108, .data = enc, .dlen = n };
		ar_part_encode(&w, &pm);
		snprintf(name, sizeof name, "part-%s", comp_name(k));
		put_sel("allreduce_msg", name, 3, &w);
		unsigned char cb[3 + 64] = { (uint8_t)k, 8, 0 };
		memcpy(cb + 3, enc, n);
		snprintf(name, sizeof name, "%s-8", comp_name(k));
		put("compress", name, cb, 3 + n);
	}
	int64_t ids[3] = { 5, 7, 9 };
	ar_accepted_msg a = { .round = 3, .agg = 5, .ids = ids, .n_ids = 3 };
	ar_accepted_encode(&w, &a);
	put_sel("allreduce_msg", "accepted", 1, &w);
	ar_result_msg r = { .round = 3,
		            .agg = 5,
		            .start = 100,
		            .end = 108,
		            .comp = COMP_NONE,
		            .total = 120,
		            .ids = ids,
		            .n_ids = 3,
		            .data = (const unsigned char *)x,
		            .dlen = sizeof x };
	ar_result_encode(&w, &r);
	put_sel("allreduce_msg", "result", 2, &w);
	r.dlen = 0;
	ar_result_encode(&w, &r);
	put_sel("allreduce_msg", "result-parts", 2, &w);
	ar_stream_msg st = { .round = 3, .member = 7 };
	ar_stream_encode(&w, &st);
	put_sel("allreduce_msg", "stream", 4, &w);
	frame_writer_free(&w);

	/* BLOCK8 over two blocks, the second one short. */
	size_t n = COMP_BLOCK + 3, len = comp_encoded_size(COMP_BLOCK8, n);
	float *y = malloc(n * sizeof *y);
	unsigned char *b = malloc(3 + len);
	for (size_t i = 0; i < n; i++)
		y[i] = (float)((int)(i % 17) - 8) * 0.125f;
	b[0] = COMP_BLOCK8;
	b[1] = (unsigned char)n;
	b[2] = (unsigned char)(n >> 8);
	if (comp_encode(COMP_BLOCK8, y, n, b + 3, len, &eb))
		die("comp_encode", eb.msg);
	put("compress", "block8-two-blocks", b, 3 + len);
	free(y);
	free(b);
}

/* Read the file at path whole into the corpus of harness. */
static void put_file(const char *harness, const char *name, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		die(path, strerror(errno));
	static unsigned char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	put(harness, name, buf, n);
}

static void file_seeds(void)
{
	char dir[] = "/tmp/cotrain-seeds-XXXXXX", path[4200];
	if (!mkdtemp(dir))
		die("mkdtemp", strerror(errno));
	cot_errbuf eb;

	st_writer *wr;
	float w[6] = { 1, 2, 3, 4, 5, 6 };
	int64_t ids[3] = { 1, -2, 3 }, s_w[2] = { 2, 3 }, s_ids[1] = { 3 }, s_empty[2] = { 0, 4 };
	uint16_t half = 0x3c00;
	if (st_writer_new(&wr, &eb) || st_writer_meta(wr, "format", "pt", &eb) ||
	    st_writer_add(wr, "w", ST_F32, 2, s_w, w, &eb) ||
	    st_writer_add(wr, "ids", ST_I64, 1, s_ids, ids, &eb) ||
	    st_writer_add(wr, "empty", ST_F32, 2, s_empty, NULL, &eb) ||
	    st_writer_add(wr, "scalar", ST_F16, 0, NULL, &half, &eb))
		die("st_writer", eb.msg);
	snprintf(path, sizeof path, "%s/t.safetensors", dir);
	if (st_writer_write(wr, path, &eb))
		die("st_writer_write", eb.msg);
	st_writer_free(wr);
	put_file("safetensors", "mixed", path);
	unlink(path);

	kern_config c = {
		.n_layer = 1, .n_shared = 1, .n_head = 1, .d_model = 4, .seq_len = 4, .vocab = 256, .d_ff = 8
	};
	kern_model *m;
	if (kern_model_create(&c, 0, &m, &eb))
		die("kern_model_create", eb.msg);
	kern_model_init(m, 42);
	snprintf(path, sizeof path, "%s/c.safetensors", dir);
	if (ckpt_save(m, path, &eb))
		die("ckpt_save", eb.msg);
	kern_model_free(m);
	put_file("checkpoint", "tiny", path);
	put_file("safetensors", "checkpoint", path);
	unlink(path);

	shard_meta meta = { .dataset = "tiny", .idx = 2, .first_token = 4096 };
	const char *text = "It was the best of times, it was the worst of times.\n";
	char sha[FS_SHA_HEX_LEN + 1];
	if (shard_write(dir, &meta, (const unsigned char *)text, strlen(text), sha, NULL, &eb) ||
	    fs_path(dir, sha, path, sizeof path, &eb))
		die("shard_write", eb.msg);
	put_file("shard", "tiny", path);
	unlink(path);
	char cmd[4300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd))
		die("rm", dir);
}

/* A client state with a project, a work unit and a journaled report, as the
 * body (byte 0 even: the harness writes the header) and as a whole file. */
static void state_seeds(void)
{
	cl_state s;
	cl_project *p;
	cot_errbuf eb;
	if (cl_state_init(&s) || cl_state_add(&s, &p, &eb))
		die("cl_state", "could not make a state");
	strcpy(p->url, "http://h/projects/tiny");
	strcpy(p->base, "http://h");
	strcpy(p->name, "tiny");
	strcpy(p->host_token, "tok12345");
	p->host_id = 3;
	p->model.n_layer = 1;
	p->has_work = 1;
	p->work = (cl_work){ .id = 9,
		             .lo = 10,
		             .hi = 30,
		             .keep_hi = 30,
		             .mb_done = 7,
		             .mb_reported = 5,
		             .pending_op = CL_REPORT_HEARTBEAT,
		             .pending_mb = 7,
		             .deadline = 100,
		             .nfiles = 1 };
	strcpy(p->work.files[0].url, "/files/x");
	memset(p->work.files[0].sha256, 'a', 64);
	p->work.files[0].size = 12;
	cl_project_mark_done(p, 8);
	char *text;
	size_t len;
	if (cl_state_to_text(&s, &text, &len, &eb))
		die("cl_state_to_text", eb.msg);
	const char *nl = memchr(text, '\n', len);
	size_t blen = len - (size_t)(nl + 1 - text);
	unsigned char *b = malloc(len + 1);
	b[0] = 0;
	memcpy(b + 1, nl + 1, blen);
	put("state", "body", b, 1 + blen);
	b[0] = 1;
	memcpy(b + 1, text, len);
	put("state", "file", b, 1 + len);
	free(b);
	free(text);
	cl_state_free(&s);
}

static void text_seeds(void)
{
	put_str("nat_line", "answers",
	        "OK relay\r\nGO direct 203.0.113.5 7070 1\nSEEN 198.51.100.7 40000 cone open\n"
	        "ERR invalid malformed request line\n");
	put_str("nat_line", "request", "MEET demo 3 7 9 dial 0123456789abcdef\n");

	static const char *plan =
	        "{\"project\":\"p\",\"version\":3,\"attempt\":1,\"state\":\"averaging\",\"host_id\":7,"
	        "\"group\":0,\"n_groups\":1,\"round_samples\":30,\"param_count\":100,"
	        "\"deadline\":\"2026-11-22T00:10:00+00:00\",\"compression\":\"none\",\"members\":["
	        "{\"host_id\":5,\"endpoint\":\"127.0.0.1:7000\",\"samples\":10,\"can_aggregate\":true,"
	        "\"lo\":0,\"hi\":60},"
	        "{\"host_id\":7,\"endpoint\":\"[::1]:7001\",\"samples\":20,\"can_aggregate\":false,"
	        "\"lo\":60,\"hi\":100}]}";
	put_str("plan", "one-group", plan);
	static const char *plan2 =
	        "{\"project\":\"p\",\"version\":3,\"attempt\":2,\"state\":\"averaging\",\"host_id\":7,"
	        "\"group\":1,\"n_groups\":2,\"round_samples\":50,\"param_count\":100,"
	        "\"deadline\":\"2026-11-22T00:10:00.5-02:30\",\"compression\":\"block8\",\"members\":["
	        "{\"host_id\":7,\"endpoint\":\"10.0.0.7:7001\",\"samples\":20,\"can_aggregate\":true,"
	        "\"lo\":0,\"hi\":100}],"
	        "\"gradient\":{\"sha256\":"
	        "\"0000000000000000000000000000000000000000000000000000000000000000\","
	        "\"url\":\"/files/x\",\"samples\":50},"
	        "\"params_sha256\":\"0000000000000000000000000000000000000000000000000000000000000001\"}";
	put_str("plan", "two-groups", plan2);

	static const char *work =
	        "{\"work_unit_id\":12,\"version\":3,\"lo\":40,\"hi\":48,"
	        "\"deadline\":\"2026-11-21T23:47:32.123456+00:00\",\"seq_len\":128,\"microbatch_size\":8,"
	        "\"mb_per_epoch\":1000,\"flops_per_sample\":1.5e9,\"files\":["
	        "{\"url\":\"/files/aa\",\"kind\":\"checkpoint\",\"size\":123456,"
	        "\"sha256\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"},"
	        "{\"url\":\"https://mirror.example/s\",\"kind\":\"shard\",\"size\":0,"
	        "\"sha256\":\"fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\"}]}";
	put_str("work", "two-files", work);
	put_str("work", "no-files",
	        "{\"work_unit_id\":1,\"version\":0,\"lo\":0,\"hi\":1,\"deadline\":\"2026-01-01T00:00:00Z\","
	        "\"seq_len\":1,\"microbatch_size\":1,\"mb_per_epoch\":1,\"files\":[]}");

	put_str("project_info", "local",
	        "{\"name\":\"demo\",\"title\":\"t\",\"description\":\"d\",\"config\":{\"name\":\"demo\","
	        "\"model\":{\"n_layer\":2,\"n_shared\":2,\"n_head\":2,\"d_model\":16,\"d_ff\":64,"
	        "\"seq_len\":8,\"vocab\":256},\"optimizer\":{\"type\":\"adamw\",\"lr\":0.003,"
	        "\"beta1\":0.9,\"beta2\":0.95,\"eps\":1e-08,\"weight_decay\":0.1,\"clip_norm\":1.0,"
	        "\"schedule\":{\"warmup_steps\":2,\"total_steps\":32,\"decay\":\"cosine\","
	        "\"min_lr_ratio\":0.1}},\"mode\":\"local\",\"inner_batch\":2,"
	        "\"outer\":{\"lr\":0.7,\"momentum\":0.9,\"nesterov\":true}},"
	        "\"dataset\":{\"name\":\"demo\",\"tokenizer\":\"byte\",\"n_tokens\":1048576,"
	        "\"manifest\":{\"url\":\"/files/x\",\"sha256\":"
	        "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\",\"size\":1234}},"
	        "\"seq_len\":8,\"microbatch_size\":8,\"target_batch\":4096,\"mb_per_epoch\":512,"
	        "\"seed\":0,\"flops_per_sample\":1.2e10,\"wu_seconds\":180,\"active\":true,"
	        "\"current_version\":0,\"checkpoint\":null}");
	put_str("project_info", "sync",
	        "{\"config\":{\"model\":{\"n_layer\":1,\"n_shared\":1,\"n_head\":1,\"d_model\":4,\"d_ff\":8,"
	        "\"seq_len\":4,\"vocab\":256},\"optimizer\":{\"type\":\"lamb\"}},\"seq_len\":4,"
	        "\"microbatch_size\":2,\"mb_per_epoch\":10,\"seed\":-5}");
	put_str("spotcheck", "check",
	        "{\"id\":3,\"project\":\"demo\",\"version\":4,\"lo\":1500,\"hi\":1504,\"k\":16,"
	        "\"seed\":\"-1234567890123\",\"tolerance\":0.001,\"checkpoint_sha256\":"
	        "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\","
	        "\"deadline\":\"2026-11-22T00:10:00+00:00\",\"state\":\"open\"}");

	put_str("control", "status", "{\"cmd\": \"status\"}\n");
	put_str("control", "echo",
	        "{\"cmd\": \"echo\", \"args\": {\"project\": \"demo\", \"n\": [1, 2.5, null]}}\n");
	put_str("control", "no-newline", "{\"cmd\":\"echo\"}");

	put_str("project_file", "sync",
	        "{\"name\":\"tiny\",\"title\":\"a tiny test\",\"dataset\":\"tiny\",\"license\":\"CC-BY-4.0\","
	        "\"model\":{\"n_layer\":2,\"n_shared\":1,\"n_head\":2,\"d_model\":16,\"d_ff\":64,"
	        "\"seq_len\":8,\"vocab\":256},"
	        "\"optimizer\":{\"type\":\"lamb\",\"lr\":0.001,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-6,"
	        "\"weight_decay\":0.01,\"clip_norm\":1.0,\"schedule\":{\"warmup_steps\":10,"
	        "\"total_steps\":100,\"decay\":\"linear\",\"min_lr_ratio\":0.1}},"
	        "\"target_batch\":64,\"microbatch_size\":8,\"seed\":1,\"work_unit_seconds\":60,"
	        "\"min_batch_fraction\":0.5,\"eval_every\":2,\"eval_sequences\":8}");
	put_str("project_file", "minimal",
	        "{\"name\":\"m\",\"dataset\":\"d\",\"model\":{\"n_layer\":1,\"n_head\":1,\"d_model\":4,"
	        "\"d_ff\":8,\"seq_len\":4,\"vocab\":256},\"target_batch\":8,\"microbatch_size\":8}");
}

/* Piece manifests as the checkpoint route answers them: a file of one
 * piece and one of four, the last short. */
static void manifest_seeds(void)
{
	static const uint64_t sizes[] = { 1, 200000 };
	static const char *const names[] = { "one-piece", "four-pieces" };
	for (int k = 0; k < 2; k++) {
		ckpt_manifest m = { .size = sizes[k], .piece_size = ckpt_piece_size(sizes[k]) };
		m.n = (uint32_t)((m.size + m.piece_size - 1) / m.piece_size);
		m.hash = malloc(m.n * sizeof *m.hash);
		for (uint32_t i = 0; i < m.n; i++)
			hash_sha256(&i, sizeof i, m.hash[i]);
		hash_sha256_hex(names[k], strlen(names[k]), m.sha256);
		json_t *j = ckpt_manifest_to_json(&m);
		char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		if (!text)
			die(names[k], "could not encode a manifest");
		put_str("ckpt_manifest", names[k], text);
		free(text);
		json_decref(j);
		ckpt_manifest_free(&m);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_seeds CORPUS_DIR\n");
		return 2;
	}
	top = argv[1];
	if (mkdir(top, 0755) && errno != EEXIST)
		die(top, strerror(errno));
	peer_seeds();
	averaging_seeds();
	file_seeds();
	text_seeds();
	state_seeds();
	manifest_seeds();
	return 0;
}
