/* cotrain-admin files: the file store's collector by hand (server/file_gc.h;
 * the server runs the same pass every --gc-interval). */
#include "server/admin.h"
#include "server/file_gc.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char usage[] =
        "usage: cotrain-admin files gc [--dry-run] [--keep-last N] [--keep-every K] [--grace S]\n"
        "\n"
        "Removes from the file store what the retention policy lets go: the checkpoints of\n"
        "versions other than each project's last N (default 5) and every Kth (default 50; 0:\n"
        "none), unless pinned (model pin) or still needed (the current version, a version with\n"
        "live work units, a round not yet committed, an open spot check); shards and manifests\n"
        "of no dataset; group sums and mean gradients of committed rounds; any other file no\n"
        "row names.  Nothing stored less than S seconds ago goes (default 3600).  Lists each\n"
        "file and its bytes, then the total; with --dry-run, what would go, changing nothing.\n";

static void print_one(void *ud, const char *sha, uint64_t size, const char *kind, const char *project,
                      int version)
{
	const char *verb = ud;
	if (project)
		printf("%s %-10s %s %12" PRIu64 " bytes  (project %s, version %d)\n", verb, kind, sha, size,
		       project, version);
	else
		printf("%s %-10s %s %12" PRIu64 " bytes\n", verb, kind, sha, size);
}

static int gc_cmd(admin_ctx *ctx, int argc, char **argv)
{
	fgc_policy pol = { FGC_KEEP_LAST_DEFAULT, FGC_KEEP_EVERY_DEFAULT, FGC_GRACE_DEFAULT, false };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		long long v;
		if (strcmp(a, "--dry-run") == 0) {
			pol.dry_run = true;
			continue;
		}
		int *dst = strcmp(a, "--keep-last") == 0    ? &pol.keep_last
		           : strcmp(a, "--keep-every") == 0 ? &pol.keep_every
		           : strcmp(a, "--grace") == 0      ? &pol.grace_s
		                                            : NULL;
		if (!dst)
			return admin_usage(usage, "files gc: unexpected argument \"%s\"", a);
		long long lo = dst == &pol.keep_last ? 1 : 0,
		          hi = dst == &pol.grace_s ? 86400LL * 365 : 1000000;
		if (i + 1 >= argc || !admin_parse_ll(argv[i + 1], lo, hi, &v))
			return admin_usage(usage, "files gc: %s must be an integer from %lld to %lld", a, lo,
			                   hi);
		*dst = (int)v;
		i++;
	}
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	cot_errbuf eb = { "", "" };
	fgc_totals t;
	const char *verb = pol.dry_run ? "would remove" : "removed";
	if (fgc_run(ctx->db, ctx->store_dir, &pol, print_one, (void *)verb, &t, &eb)) {
		fflush(stdout);
		return admin_fail(&eb);
	}
	printf("%s %ld file%s, %" PRIu64 " bytes%s\n", verb, t.files, t.files == 1 ? "" : "s", t.bytes,
	       pol.dry_run ? " (dry run: nothing changed)" : "");
	return ADMIN_OK;
}

int admin_files_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "files: no command given");
	if (strcmp(argv[1], "gc") == 0)
		return gc_cmd(ctx, argc - 1, argv + 1);
	return admin_usage(usage, "files: unknown command \"%s\"", argv[1]);
}
