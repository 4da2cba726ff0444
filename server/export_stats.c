/* cotrain: BOINC db_dump-style statistics export (see export_stats.h). */
#include "server/export_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "server/duty.h"
#include "shared/common/log.h"

/* An output file: gzip through libarchive's raw format, or plain. */
typedef struct {
	struct archive *a;
	FILE *f;
	char tmp[4096]; /* the path written */
	char buf[65536];
	size_t len;
	bool failed;
} out_file;

static cot_err out_open(out_file *o, const char *dir, const char *name, bool gz, cot_errbuf *eb)
{
	memset(o, 0, sizeof *o);
	int n = snprintf(o->tmp, sizeof o->tmp, "%s/%s", dir, name);
	if (n < 0 || (size_t)n >= sizeof o->tmp)
		return cot_seterr(eb, COT_ERR_INVALID, "export directory path is too long");
	if (!gz) {
		o->f = fopen(o->tmp, "w");
		if (!o->f)
			return cot_seterr(eb, COT_ERR_IO, "could not create \"%s\": %s", o->tmp,
			                  strerror(errno));
		return COT_OK;
	}
	o->a = archive_write_new();
	if (!o->a)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	struct archive_entry *e = archive_entry_new();
	if (!e || archive_write_add_filter_gzip(o->a) != ARCHIVE_OK ||
	    archive_write_set_format_raw(o->a) != ARCHIVE_OK ||
	    archive_write_open_filename(o->a, o->tmp) != ARCHIVE_OK) {
		cot_seterr(eb, COT_ERR_IO, "could not create \"%s\": %s", o->tmp,
		           archive_error_string(o->a) ? archive_error_string(o->a) : "out of memory");
		archive_entry_free(e);
		archive_write_free(o->a);
		o->a = NULL;
		return COT_ERR_IO;
	}
	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, AE_IFREG);
	archive_entry_set_perm(e, 0644);
	int rc = archive_write_header(o->a, e);
	archive_entry_free(e);
	if (rc != ARCHIVE_OK) {
		cot_seterr(eb, COT_ERR_IO, "could not write \"%s\": %s", o->tmp, archive_error_string(o->a));
		archive_write_free(o->a);
		o->a = NULL;
		return COT_ERR_IO;
	}
	return COT_OK;
}

static void out_flush(out_file *o)
{
	if (o->failed || o->len == 0)
		return;
	if (o->a) {
		if (archive_write_data(o->a, o->buf, o->len) != (la_ssize_t)o->len)
			o->failed = true;
	} else if (fwrite(o->buf, 1, o->len, o->f) != o->len) {
		o->failed = true;
	}
	o->len = 0;
}

static void out_write(out_file *o, const char *s, size_t n)
{
	while (n) {
		size_t room = sizeof o->buf - o->len;
		size_t k = n < room ? n : room;
		memcpy(o->buf + o->len, s, k);
		o->len += k;
		s += k;
		n -= k;
		if (o->len == sizeof o->buf)
			out_flush(o);
	}
}

static void out_puts(out_file *o, const char *s) { out_write(o, s, strlen(s)); }

static void out_printf(out_file *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(out_file *o, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof line)
		o->failed = true; /* every caller's line is far shorter */
	else
		out_write(o, line, (size_t)n);
}

/* Text escaped as BOINC's xml_escape() (lib/parse.cpp) escapes it, byte by
 * byte, so stats sites that undo BOINC's escaping read it unchanged: '<' and
 * '&' as entities, every byte above 127 as a character reference &#N; to the
 * byte's value (readers map the references back to bytes and decode UTF-8),
 * tab, newline and carriage return as &#9; &#10; &#13;, other control
 * characters dropped, "]]>" as "]]&gt;".  The output is plain ASCII, and
 * well-formed XML whatever the input.  One change before escaping: U+FFFE
 * and U+FFFF (bytes EF BF BE/BF), which XML cannot carry, become U+FFFD, so
 * that what a reader decodes is still text it can store and re-export;
 * the API refuses them in new names (apiutil.c, api_text_check). */
static void out_xml(out_file *o, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		const unsigned char *run = p;
		while (*p >= 32 && *p < 128 && *p != '<' && *p != '&' && *p != ']')
			p++;
		if (p > run)
			out_write(o, (const char *)run, (size_t)(p - run));
		unsigned char ch = *p;
		if (!ch)
			break;
		if (ch == '<') {
			out_puts(o, "&lt;");
		} else if (ch == '&') {
			out_puts(o, "&amp;");
		} else if (ch == ']') {
			if (p[1] == ']' && p[2] == '>') {
				out_puts(o, "]]&gt;");
				p += 2;
			} else {
				out_puts(o, "]");
			}
		} else if (ch == 0xEF && p[1] == 0xBF && (p[2] == 0xBE || p[2] == 0xBF)) {
			out_puts(o, "&#239;&#191;&#189;");
			p += 2;
		} else if (ch > 127 || ch == '\t' || ch == '\n' || ch == '\r') {
			char ref[8];
			int n = snprintf(ref, sizeof ref, "&#%u;", ch);
			out_write(o, ref, (size_t)n);
		}
		/* other control characters: dropped, as xml_escape drops them */
		p++;
	}
}

/* Flush and close; on success the file's bytes are on disk (fsync), since
 * the directory is swapped in right after. */
static cot_err out_close(out_file *o, cot_errbuf *eb)
{
	out_flush(o);
	bool bad = o->failed;
	if (o->a) {
		if (archive_write_close(o->a) != ARCHIVE_OK)
			bad = true;
		archive_write_free(o->a);
		o->a = NULL;
	}
	if (o->f) {
		if (fflush(o->f) || fsync(fileno(o->f)))
			bad = true;
		if (fclose(o->f))
			bad = true;
		o->f = NULL;
	} else if (!bad) {
		int fd = open(o->tmp, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fsync(fd))
			bad = true;
		if (fd >= 0)
			close(fd);
	}
	if (bad)
		return cot_seterr(eb, COT_ERR_IO, "could not write \"%s\"", o->tmp);
	return COT_OK;
}

/* Abandon a file after an error: close it, leave its bytes to the caller's
 * removal of the staging folder. */
static void out_abandon(out_file *o)
{
	if (o->a) {
		archive_write_free(o->a);
		o->a = NULL;
	}
	if (o->f) {
		fclose(o->f);
		o->f = NULL;
	}
}

static cot_err db_fail(PGresult *r, PGconn *c, cot_errbuf *eb, const char *what)
{
	cot_seterr(eb, COT_ERR_DB, "could not read %s: %s", what,
	           r ? PQresultErrorMessage(r) : PQerrorMessage(c));
	size_t n = strlen(eb->msg);
	while (n && eb->msg[n - 1] == '\n')
		eb->msg[--n] = '\0';
	PQclear(r);
	return COT_ERR_DB;
}

/* Numbers as BOINC writes them: %f for its doubles (never an exponent),
 * integers as they are. */
static double num(PGresult *r, int i, int j)
{
	double v = strtod(PQgetvalue(r, i, j), NULL);
	return isfinite(v) ? v : 0;
}

/* What the writers count, for tables.xml. */
typedef struct {
	long long nusers, nteams, nhosts, nusers_deleted, nhosts_deleted;
	double total_credit;
} totals;

typedef void row_writer(out_file *o, PGresult *r, int i, totals *t);

/* One entity file: DIR/file holds root's start tag, write() for every row of
 * the cursor query sql, root's end tag, preceded by BOINC's XML declaration. */
static cot_err dump(PGconn *c, const char *dir, const char *file, const char *root, const char *sql,
                    row_writer *write, totals *t, cot_errbuf *eb)
{
	out_file o;
	cot_err rc = out_open(&o, dir, file, true, eb);
	if (rc)
		return rc;
	char decl[8192];
	snprintf(decl, sizeof decl, "DECLARE stats_cur NO SCROLL CURSOR FOR %s", sql);
	PGresult *r = PQexec(c, decl);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		out_abandon(&o);
		return db_fail(r, c, eb, file);
	}
	PQclear(r);
	out_printf(&o, "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<%s>\n", root);
	for (;;) {
		r = PQexec(c, "FETCH 5000 FROM stats_cur");
		if (PQresultStatus(r) != PGRES_TUPLES_OK) {
			out_abandon(&o);
			return db_fail(r, c, eb, file);
		}
		int nr = PQntuples(r);
		for (int i = 0; i < nr; i++)
			write(&o, r, i, t);
		PQclear(r);
		if (nr == 0)
			break;
	}
	PQclear(PQexec(c, "CLOSE stats_cur"));
	out_printf(&o, "</%s>\n", root);
	return out_close(&o, eb);
}

#define EPOCH(x) "coalesce(extract(epoch FROM " x "), 0)::float8"
#define DELETED_DAYS "60" /* BOINC's user_deleted/host_deleted expire after 60 days */

/* Users with credit, not disabled (BOINC: total_credit > 0, not deleted). */
/* clang-format off */
static const char *const user_sql =
	"SELECT a.id, a.name, " EPOCH("a.created_at") "::bigint, c.total, c.rac,"
	"       " EPOCH("c.rac_time") ", md5(a.cross_project_id || lower(a.email)),"
	"       coalesce(a.team_id, 0)"
	"  FROM account a JOIN account_credit c ON c.account_id = a.id"
	" WHERE NOT a.disabled AND c.total > 0 ORDER BY a.id";
/* clang-format on */

/* write_user() of BOINC's db_dump.cpp: country and url only when set (cotrain
 * has neither), teamid only when in a team, <has_profile/> only with a profile
 * (cotrain has no profiles). */
static void write_user(out_file *o, PGresult *r, int i, totals *t)
{
	double total = num(r, i, 3);
	out_printf(o, "<user>\n <id>%s</id>\n <name>", PQgetvalue(r, i, 0));
	out_xml(o, PQgetvalue(r, i, 1));
	out_printf(o,
	           "</name>\n <create_time>%s</create_time>\n"
	           " <total_credit>%f</total_credit>\n <expavg_credit>%f</expavg_credit>\n"
	           " <expavg_time>%f</expavg_time>\n <cpid>%s</cpid>\n",
	           PQgetvalue(r, i, 2), total, num(r, i, 4), num(r, i, 5), PQgetvalue(r, i, 6));
	if (strcmp(PQgetvalue(r, i, 7), "0") != 0)
		out_printf(o, " <teamid>%s</teamid>\n", PQgetvalue(r, i, 7));
	out_puts(o, "</user>\n");
	t->nusers++;
	t->total_credit += total;
}

/* Teams with credit.  The founder's name is left out when the founder's
 * account is disabled, as BOINC leaves it out when the user is gone. */
/* clang-format off */
static const char *const team_sql =
	"SELECT t.id, t.name, coalesce(t.founder_id, 0), c.total, c.rac, " EPOCH("c.rac_time") ","
	"       f.name, " EPOCH("t.created_at") "::bigint, t.description"
	"  FROM team t JOIN team_credit c ON c.team_id = t.id"
	"  LEFT JOIN account f ON f.id = t.founder_id AND NOT f.disabled"
	" WHERE c.total > 0 ORDER BY t.id";
/* clang-format on */

/* write_team(): type 1 is BOINC's "None" (cotrain has no team types); url
 * and name_html are never set; description only when set; country always
 * (cotrain has none: empty). */
static void write_team(out_file *o, PGresult *r, int i, totals *t)
{
	out_printf(o, "<team>\n <id>%s</id>\n <type>1</type>\n <name>", PQgetvalue(r, i, 0));
	out_xml(o, PQgetvalue(r, i, 1));
	out_printf(o,
	           "</name>\n <userid>%s</userid>\n <total_credit>%f</total_credit>\n"
	           " <expavg_credit>%f</expavg_credit>\n <expavg_time>%f</expavg_time>\n",
	           PQgetvalue(r, i, 2), num(r, i, 3), num(r, i, 4), num(r, i, 5));
	if (!PQgetisnull(r, i, 6)) {
		out_puts(o, "  <founder_name>");
		out_xml(o, PQgetvalue(r, i, 6));
		out_puts(o, "</founder_name>\n");
	}
	out_printf(o, " <create_time>%s</create_time>\n", PQgetvalue(r, i, 7));
	if (PQgetvalue(r, i, 8)[0]) {
		out_puts(o, "<description>");
		out_xml(o, PQgetvalue(r, i, 8));
		out_puts(o, "</description>\n");
	}
	out_puts(o, " <country></country>\n</team>\n");
	t->nteams++;
}

/* Hosts with credit, not revoked, of accounts not disabled (BOINC: total_credit
 * > 0, not deleted, with an owner).  The owner's id only when the owner shows
 * their hosts.  n_bwup/n_bwdown: the bandwidth (bytes/s) the host reported in
 * its latest round. */
/* clang-format off */
static const char *const host_sql =
	"SELECT h.id, CASE WHEN a.show_hosts THEN h.account_id END, c.total, c.rac,"
	"       " EPOCH("c.rac_time") ", h.cpu_model, h.os_name, h.os_version,"
	"       " EPOCH("h.created_at") "::bigint, " EPOCH("h.last_seen") "::bigint, h.cores,"
	"       h.flops / h.cores, h.memory_bytes::float8, coalesce(bw.bandwidth, 0),"
	"       h.flops / h.cores / 4.32e11, md5(h.cpid_seed || lower(a.email))"
	"  FROM host h JOIN account a ON a.id = h.account_id"
	"  JOIN host_credit c ON c.host_id = h.id"
	"  LEFT JOIN (SELECT DISTINCT ON (host_id) host_id, bandwidth FROM round_member"
	"              ORDER BY host_id, version DESC) bw ON bw.host_id = h.id"
	" WHERE NOT h.revoked AND NOT a.disabled AND c.total > 0 ORDER BY h.id";
/* clang-format on */

/* write_host() with <detail/>, BOINC's default for host.gz.  What cotrain
 * does not measure is 0 (timezone, p_iops, p_membw, m_cache, m_swap,
 * d_total, d_free, avg_turnaround) or empty (p_vendor, misc); p_fpops is per
 * CPU (the host's training rate over its cores), credit_per_cpu_sec what one
 * CPU earns per second at that rate (p_fpops / 4.32e11). */
static void write_host(out_file *o, PGresult *r, int i, totals *t)
{
	out_printf(o, "<host>\n    <id>%s</id>\n", PQgetvalue(r, i, 0));
	if (!PQgetisnull(r, i, 1))
		out_printf(o, "    <userid>%s</userid>\n", PQgetvalue(r, i, 1));
	out_printf(o,
	           "    <total_credit>%f</total_credit>\n    <expavg_credit>%f</expavg_credit>\n"
	           "    <expavg_time>%f</expavg_time>\n    <p_vendor></p_vendor>\n    <p_model>",
	           num(r, i, 2), num(r, i, 3), num(r, i, 4));
	out_xml(o, PQgetvalue(r, i, 5));
	out_puts(o, "</p_model>\n    <os_name>");
	out_xml(o, PQgetvalue(r, i, 6));
	out_puts(o, "</os_name>\n    <os_version>");
	out_xml(o, PQgetvalue(r, i, 7));
	double bw = num(r, i, 13);
	out_printf(o,
	           "</os_version>\n    <misc><![CDATA[]]></misc>\n"
	           "  <create_time>%s</create_time>\n  <rpc_time>%s</rpc_time>\n"
	           "  <timezone>0</timezone>\n  <ncpus>%s</ncpus>\n  <p_fpops>%f</p_fpops>\n"
	           "  <p_iops>%f</p_iops>\n  <p_membw>%f</p_membw>\n  <m_nbytes>%f</m_nbytes>\n"
	           "  <m_cache>%f</m_cache>\n  <m_swap>%f</m_swap>\n  <d_total>%f</d_total>\n"
	           "  <d_free>%f</d_free>\n",
	           PQgetvalue(r, i, 8), PQgetvalue(r, i, 9), PQgetvalue(r, i, 10), num(r, i, 11), 0.0, 0.0,
	           num(r, i, 12), 0.0, 0.0, 0.0, 0.0);
	out_printf(o,
	           "  <n_bwup>%f</n_bwup>\n  <n_bwdown>%f</n_bwdown>\n"
	           "  <avg_turnaround>%f</avg_turnaround>\n"
	           "  <credit_per_cpu_sec>%f</credit_per_cpu_sec>\n  <host_cpid>%s</host_cpid>\n"
	           "</host>\n",
	           bw, bw, 0.0, num(r, i, 14), PQgetvalue(r, i, 15));
	t->nhosts++;
}

/* Accounts disabled in the last 60 days, with the cpid they were exported
 * under (BOINC's user_deleted). */
/* clang-format off */
static const char *const user_deleted_sql =
	"SELECT a.id, md5(a.cross_project_id || lower(a.email)) FROM account a"
	" WHERE a.disabled AND a.disabled_at > now() - interval '" DELETED_DAYS " days'"
	" ORDER BY a.id";
/* clang-format on */

static void write_user_deleted(out_file *o, PGresult *r, int i, totals *t)
{
	out_printf(o, "<user>\n    <id>%s</id>\n    <cpid>%s</cpid>\n</user>\n", PQgetvalue(r, i, 0),
	           PQgetvalue(r, i, 1));
	t->nusers_deleted++;
}

/* Hosts revoked, or whose owner was disabled, in the last 60 days (BOINC's
 * host_deleted: a deleted user's hosts go with it). */
/* clang-format off */
static const char *const host_deleted_sql =
	"SELECT h.id, md5(h.cpid_seed || lower(a.email)) FROM host h"
	"  JOIN account a ON a.id = h.account_id"
	" WHERE (h.revoked AND h.revoked_at > now() - interval '" DELETED_DAYS " days')"
	"    OR (NOT h.revoked AND a.disabled AND a.disabled_at > now() - interval '" DELETED_DAYS " days')"
	" ORDER BY h.id";
/* clang-format on */

static void write_host_deleted(out_file *o, PGresult *r, int i, totals *t)
{
	out_printf(o, "<host>\n    <id>%s</id>\n    <host_cpid>%s</host_cpid>\n</host>\n",
	           PQgetvalue(r, i, 0), PQgetvalue(r, i, 1));
	t->nhosts_deleted++;
}

/* tables.xml as tables_file() writes it: counts only when not zero, the
 * applications (cotrain's projects, by title) and the badges (none). */
static cot_err write_tables(PGconn *c, const char *dir, const totals *t, cot_errbuf *eb)
{
	PGresult *r = PQexec(c, "SELECT title FROM project ORDER BY id");
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		return db_fail(r, c, eb, "the projects");
	out_file o;
	cot_err rc = out_open(&o, dir, "tables.xml", false, eb);
	if (rc) {
		PQclear(r);
		return rc;
	}
	out_printf(&o,
	           "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<tables>\n"
	           "    <update_time>%lld</update_time>\n",
	           (long long)time(NULL));
	if (t->nusers)
		out_printf(&o, "    <nusers_total>%lld</nusers_total>\n", t->nusers);
	if (t->nteams)
		out_printf(&o, "    <nteams_total>%lld</nteams_total>\n", t->nteams);
	if (t->nhosts)
		out_printf(&o, "    <nhosts_total>%lld</nhosts_total>\n", t->nhosts);
	if (t->nusers_deleted)
		out_printf(&o, "    <nusers_deleted_total>%lld</nusers_deleted_total>\n", t->nusers_deleted);
	if (t->nhosts_deleted)
		out_printf(&o, "    <nhosts_deleted_total>%lld</nhosts_deleted_total>\n", t->nhosts_deleted);
	if (t->total_credit)
		out_printf(&o, "    <total_credit>%f</total_credit>\n", t->total_credit);
	out_puts(&o, "    <applications>\n");
	for (int i = 0; i < PQntuples(r); i++) {
		out_puts(&o, "        <application>\n            <name>");
		out_xml(&o, PQgetvalue(r, i, 0));
		out_puts(&o, "</name>\n        </application>\n");
	}
	PQclear(r);
	out_puts(&o, "    </applications>\n    <badges>\n    </badges>\n</tables>\n");
	return out_close(&o, eb);
}

/* db_dump.xml: BOINC copies its dump spec there; this is the spec of what
 * cotrain writes, BOINC's default one. */
static cot_err write_spec(const char *dir, const char *staging, const char *final_dir, cot_errbuf *eb)
{
	static const char *const tables[][2] = {
		{ "user", "" },
		{ "user_deleted", "" },
		{ "host", "            <detail/>\n" },
		{ "host_deleted", "            <detail/>\n" },
		{ "team", "" },
	};
	out_file o;
	cot_err rc = out_open(&o, dir, "db_dump.xml", false, eb);
	if (rc)
		return rc;
	out_puts(&o, "<boinc_db_dump_spec>\n    <output_dir>");
	out_xml(&o, staging);
	out_puts(&o, "</output_dir>\n    <final_output_dir>");
	out_xml(&o, final_dir);
	out_puts(&o, "</final_output_dir>\n");
	for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
		out_printf(&o,
		           "    <enumeration>\n        <table>%s</table>\n"
		           "        <filename>%s</filename>\n        <output>\n"
		           "            <compression>gzip</compression>\n%s        </output>\n"
		           "    </enumeration>\n",
		           tables[i][0], tables[i][0], tables[i][1]);
	out_puts(&o, "</boinc_db_dump_spec>\n");
	return out_close(&o, eb);
}

/* ---- the folder swap ------------------------------------------------------ */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return (flag == FTW_DP ? rmdir(path) : unlink(path)) ? -1 : 0;
}

/* Remove path (a folder this code made, or a leftover of it) and everything
 * under it, links not followed; absent is fine. */
static cot_err rm_tree(const char *path, cot_errbuf *eb)
{
	struct stat st;
	if (lstat(path, &st)) {
		if (errno == ENOENT)
			return COT_OK;
		return cot_seterr(eb, COT_ERR_IO, "could not remove \"%s\": %s", path, strerror(errno));
	}
	if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS))
		return cot_seterr(eb, COT_ERR_IO, "could not remove \"%s\": %s", path, strerror(errno));
	return COT_OK;
}

static cot_err fsync_dir(const char *path, cot_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd)) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not sync \"%s\": %s", path, strerror(e));
	}
	close(fd);
	return COT_OK;
}

/* The sibling names of the export folder dir: parent, and .NAME.new (the
 * generation being written), .NAME.old (the one before the current), .NAME.lock. */
typedef struct {
	char dir[4096], parent[4096], staging[4200], old[4200], lock[4200];
} export_paths;

static cot_err paths_of(const char *dir, export_paths *p, cot_errbuf *eb)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof p->dir - 16)
		return cot_seterr(eb, COT_ERR_INVALID, "export directory path \"%s\" is not usable", dir);
	memcpy(p->dir, dir, n);
	p->dir[n] = '\0';
	char a[4096], b[4096];
	snprintf(a, sizeof a, "%s", p->dir);
	snprintf(b, sizeof b, "%s", p->dir);
	const char *base = basename(a);
	if (!strcmp(base, "/") || !strcmp(base, ".") || !strcmp(base, ".."))
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "export directory path \"%s\" must end in a folder name", dir);
	snprintf(p->parent, sizeof p->parent, "%s", dirname(b));
	/* parent and base are each shorter than p->dir: these fit. */
	snprintf(p->staging, sizeof p->staging, "%s/.%s.new", p->parent, base);
	snprintf(p->old, sizeof p->old, "%s/.%s.old", p->parent, base);
	snprintf(p->lock, sizeof p->lock, "%s/.%s.lock", p->parent, base);
	return COT_OK;
}

/* Put the finished generation p->staging in place as p->dir in one step:
 * renameat2(RENAME_EXCHANGE) swaps the two folders atomically, so the path
 * p->dir names a complete generation at every instant; the previous one is
 * kept as p->old until the next export (a reader that opened the folder
 * before the swap reads on in it).  The first export renames. */
static cot_err swap_in(const export_paths *p, cot_errbuf *eb)
{
	struct stat st;
	if (lstat(p->dir, &st) && errno == ENOENT) {
		if (rename(p->staging, p->dir))
			return cot_seterr(eb, COT_ERR_IO, "could not rename \"%s\" to \"%s\": %s", p->staging,
			                  p->dir, strerror(errno));
		return fsync_dir(p->parent, eb);
	}
	if (!S_ISDIR(st.st_mode))
		return cot_seterr(eb, COT_ERR_INVALID, "\"%s\" exists and is not a folder", p->dir);
	if (renameat2(AT_FDCWD, p->staging, AT_FDCWD, p->dir, RENAME_EXCHANGE)) {
		cot_seterr(eb, COT_ERR_IO, "could not swap \"%s\" and \"%s\": %s", p->staging, p->dir,
		           strerror(errno));
		if (errno == EINVAL || errno == ENOSYS)
			cot_sethint(eb,
			            "The file system of \"%s\" cannot exchange two folders in one "
			            "step (renameat2 RENAME_EXCHANGE); put the export on another "
			            "one, e.g. ext4, xfs, btrfs or tmpfs.",
			            p->parent);
		return COT_ERR_IO;
	}
	/* p->staging now names the previous generation. */
	if (rename(p->staging, p->old))
		return cot_seterr(eb, COT_ERR_IO, "could not rename \"%s\" to \"%s\": %s", p->staging, p->old,
		                  strerror(errno));
	return fsync_dir(p->parent, eb);
}

/* Write every file into p->staging from one snapshot of the database. */
static cot_err write_generation(PGconn *c, const export_paths *p, cot_errbuf *eb)
{
	PGresult *r = PQexec(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		return db_fail(r, c, eb, "the database");
	PQclear(r);
	totals t = { 0 };
	const char *dir = p->staging;
	cot_err rc = dump(c, dir, "user.gz", "users", user_sql, write_user, &t, eb);
	if (!rc)
		rc = dump(c, dir, "user_deleted.gz", "users_deleted", user_deleted_sql, write_user_deleted,
		          &t, eb);
	if (!rc)
		rc = dump(c, dir, "host.gz", "hosts", host_sql, write_host, &t, eb);
	if (!rc)
		rc = dump(c, dir, "host_deleted.gz", "hosts_deleted", host_deleted_sql, write_host_deleted,
		          &t, eb);
	if (!rc)
		rc = dump(c, dir, "team.gz", "teams", team_sql, write_team, &t, eb);
	if (!rc)
		rc = write_tables(c, dir, &t, eb);
	PQclear(PQexec(c, rc ? "ROLLBACK" : "COMMIT"));
	if (!rc)
		rc = write_spec(dir, p->staging, p->dir, eb);
	if (!rc)
		rc = fsync_dir(dir, eb);
	return rc;
}

cot_err stats_export(PGconn *c, const char *dir, cot_errbuf *eb)
{
	export_paths p;
	cot_err rc = paths_of(dir, &p, eb);
	if (rc)
		return rc;
	/* One export at a time per folder (the server's timer and cron may meet). */
	int lk = open(p.lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lk < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not open \"%s\": %s", p.lock, strerror(errno));
	if (flock(lk, LOCK_EX)) {
		close(lk);
		return cot_seterr(eb, COT_ERR_IO, "could not lock \"%s\": %s", p.lock, strerror(errno));
	}
	rc = rm_tree(p.staging, eb); /* a leftover of an export that died */
	if (!rc && mkdir(p.staging, 0755))
		rc = cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", p.staging,
		                strerror(errno));
	if (!rc)
		rc = write_generation(c, &p, eb);
	if (!rc)
		rc = rm_tree(p.old, eb);
	if (!rc)
		rc = swap_in(&p, eb);
	if (rc) {
		cot_errbuf ignore = { 0 };
		rm_tree(p.staging, &ignore);
	}
	close(lk); /* releases the lock */
	return rc;
}

struct stats_timer {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	const char *conninfo, *dir;
	int interval_s;
	duty *duty; /* DUTY_STATS: only its holder runs */
};

static void *timer_main(void *arg)
{
	stats_timer *t = arg;
	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		pthread_mutex_unlock(&t->mu);
		if (duty_held(t->duty)) {
			PGconn *c = PQconnectdb(t->conninfo);
			cot_errbuf eb = { 0 };
			if (PQstatus(c) != CONNECTION_OK)
				log_warn("stats export: could not connect: %s", PQerrorMessage(c));
			else if (stats_export(c, t->dir, &eb))
				log_warn("stats export: %s", eb.msg);
			else
				log_info("stats export written to \"%s\"", t->dir);
			PQfinish(c);
		}
		pthread_mutex_lock(&t->mu);
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += t->interval_s;
		while (!t->stop && pthread_cond_timedwait(&t->cv, &t->mu, &until) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

cot_err stats_timer_start(const char *conninfo, const char *dir, int interval_s, stats_timer **out,
                          cot_errbuf *eb)
{
	stats_timer *t = calloc(1, sizeof *t);
	if (!t)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	t->conninfo = conninfo;
	t->dir = dir;
	t->interval_s = interval_s > 0 ? interval_s : 86400;
	cot_err rc = duty_open(conninfo, DUTY_STATS, &t->duty, eb);
	if (rc) {
		free(t);
		return rc;
	}
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	if (pthread_create(&t->thread, NULL, timer_main, t)) {
		duty_close(t->duty);
		free(t);
		return cot_seterr(eb, COT_ERR_IO, "could not start the stats export thread");
	}
	*out = t;
	return COT_OK;
}

void stats_timer_stop(stats_timer *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	t->stop = true;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->thread, NULL);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	duty_close(t->duty);
	free(t);
}
