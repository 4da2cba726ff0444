/* cotrain tests: the plain main() of every fuzz harness in builds without
 * libFuzzer.  It runs the harness's LLVMFuzzerTestOneInput once over every
 * file of its corpus, so `make check` replays the corpora (seeds and the
 * inputs of bugs found) on every run, under the sanitizers when the tree
 * was configured with --enable-sanitizers.
 *
 *   tests/fuzz/fuzz_frame [FILE|DIR]...
 *
 * Without arguments it reads $top_srcdir/tests/fuzz/corpus/<name>, where
 * <name> is the program's name without its "fuzz_" prefix.  Output is TAP,
 * one line per input; a crash fails the test through the harness, and an
 * empty corpus fails it too (a replay of nothing proves nothing). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int n_run, n_failed;

/* Read the whole file at path into a malloc'd buffer of exactly its size
 * (so ASan sees any read past the end); NULL with errno on error. */
static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	uint8_t *buf = NULL;
	size_t cap = 0, n = 0;
	for (;;) {
		if (n == cap) {
			cap = cap ? cap * 2 : 4096;
			uint8_t *nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = nb;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	int err = ferror(f);
	fclose(f);
	if (err) {
		free(buf);
		errno = EIO;
		return NULL;
	}
	uint8_t *exact = malloc(n ? n : 1);
	if (!exact) {
		free(buf);
		return NULL;
	}
	memcpy(exact, buf, n);
	free(buf);
	*len = n;
	return exact;
}

static void run_file(const char *path)
{
	size_t len = 0;
	uint8_t *data = slurp(path, &len);
	n_run++;
	if (!data) {
		printf("not ok %d - could not read \"%s\": %s\n", n_run, path, strerror(errno));
		n_failed++;
		return;
	}
	LLVMFuzzerTestOneInput(data, len);
	free(data);
	printf("ok %d - %s (%zu bytes)\n", n_run, path, len);
	fflush(stdout);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file of dir, in name order (the same order on every run). */
static void run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		printf("not ok %d - could not open corpus \"%s\": %s\n", ++n_run, dir, strerror(errno));
		n_failed++;
		return;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			char **nn = realloc(names, cap * sizeof *names);
			if (!nn)
				break;
			names = nn;
		}
		if (!(names[n] = strdup(e->d_name)))
			break;
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof *names, by_name);
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
			run_file(path);
		free(names[i]);
	}
	free(names);
}

static void run_arg(const char *path)
{
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		run_dir(path);
	else
		run_file(path);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			run_arg(argv[i]);
	} else {
		const char *top = getenv("top_srcdir");
		const char *name = strrchr(argv[0], '/');
		name = name ? name + 1 : argv[0];
		if (strncmp(name, "fuzz_", 5) == 0)
			name += 5;
		char dir[4096];
		snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", top ? top : ".", name);
		run_dir(dir);
	}
	if (n_run == 0) {
		printf("not ok 1 - the corpus is empty\n");
		n_run = n_failed = 1;
	}
	printf("1..%d\n", n_run);
	return n_failed ? 1 : 0;
}
