/* cotrain: BOINC db_dump-style statistics export (see export_stats.h). */
#include "server/export_stats.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "shared/common/log.h"

/* An output file: gzip through libarchive's raw format, or plain. */
typedef struct {
	struct archive *a;
	FILE *f;
	char tmp[4096], final[4096];
	char buf[65536];
	size_t len;
	bool failed;
} out_file;

static cot_err out_open(out_file *o, const char *dir, const char *name, bool gz, cot_errbuf *eb)
{
	memset(o, 0, sizeof *o);
	int n1 = snprintf(o->final, sizeof o->final, "%s/%s", dir, name);
	int n2 = snprintf(o->tmp, sizeof o->tmp, "%s/.%s.tmp", dir, name);
	if (n1 < 0 || n2 < 0 || (size_t)n2 >= sizeof o->tmp)
		return cot_seterr(eb, COT_ERR_INVALID, "export directory path is too long");
	if (!gz) {
		o->f = fopen(o->tmp, "w");
		if (!o->f)
			return cot_seterr(eb, COT_ERR_IO, "could not create \"%s\": %s", o->tmp, strerror(errno));
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

/* Text escaped for XML 1.0 character data: the five specials as entities,
 * control characters that XML forbids replaced by '?'. */
static void out_xml(out_file *o, const char *s)
{
	for (const char *p = s; *p; p++) {
		unsigned char ch = (unsigned char)*p;
		switch (ch) {
		case '&': out_puts(o, "&amp;"); break;
		case '<': out_puts(o, "&lt;"); break;
		case '>': out_puts(o, "&gt;"); break;
		case '"': out_puts(o, "&quot;"); break;
		case '\'': out_puts(o, "&apos;"); break;
		default:
			if (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')
				out_puts(o, "?");
			else
				out_write(o, p, 1);
		}
	}
}

/* Close (and rename into place unless failed or abandon). */
static cot_err out_close(out_file *o, bool abandon, cot_errbuf *eb)
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
		if (fclose(o->f))
			bad = true;
		o->f = NULL;
	}
	if (abandon || bad) {
		unlink(o->tmp);
		if (bad && !abandon)
			return cot_seterr(eb, COT_ERR_IO, "could not write \"%s\"", o->tmp);
		return COT_OK;
	}
	if (rename(o->tmp, o->final))
		return cot_seterr(eb, COT_ERR_IO, "could not rename \"%s\": %s", o->tmp, strerror(errno));
	return COT_OK;
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

/* One entity file: sql is a cursor query whose columns are the XML field
 * names (in order); every row becomes <elem> with one child per column. */
static cot_err dump(PGconn *c, const char *dir, const char *file, const char *root,
                    const char *elem, const char *sql, cot_errbuf *eb)
{
	out_file o;
	cot_err rc = out_open(&o, dir, file, true, eb);
	if (rc)
		return rc;
	char decl[8192];
	snprintf(decl, sizeof decl, "DECLARE stats_cur NO SCROLL CURSOR FOR %s", sql);
	PGresult *r = PQexec(c, decl);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		out_close(&o, true, eb);
		return db_fail(r, c, eb, file);
	}
	PQclear(r);
	out_puts(&o, "<");
	out_puts(&o, root);
	out_puts(&o, ">\n");
	for (;;) {
		r = PQexec(c, "FETCH 5000 FROM stats_cur");
		if (PQresultStatus(r) != PGRES_TUPLES_OK) {
			out_close(&o, true, eb);
			return db_fail(r, c, eb, file);
		}
		int nr = PQntuples(r), nf = PQnfields(r);
		for (int i = 0; i < nr; i++) {
			out_puts(&o, "<");
			out_puts(&o, elem);
			out_puts(&o, ">\n");
			for (int j = 0; j < nf; j++) {
				const char *f = PQfname(r, j);
				out_puts(&o, " <");
				out_puts(&o, f);
				out_puts(&o, ">");
				out_xml(&o, PQgetvalue(r, i, j));
				out_puts(&o, "</");
				out_puts(&o, f);
				out_puts(&o, ">\n");
			}
			out_puts(&o, "</");
			out_puts(&o, elem);
			out_puts(&o, ">\n");
		}
		PQclear(r);
		if (nr == 0)
			break;
	}
	PQclear(PQexec(c, "CLOSE stats_cur"));
	out_puts(&o, "</");
	out_puts(&o, root);
	out_puts(&o, ">\n");
	return out_close(&o, false, eb);
}

#define EPOCH(x) "coalesce(extract(epoch FROM " x "), 0)::float8"

static const char *const user_sql =
	"SELECT a.id, a.name, '' AS country, " EPOCH("a.created_at") "::bigint AS create_time,"
	"       coalesce(c.total, 0) AS total_credit, coalesce(c.rac, 0) AS expavg_credit,"
	"       " EPOCH("c.rac_time") " AS expavg_time,"
	"       md5(a.cross_project_id || lower(a.email)) AS cpid,"
	"       coalesce(a.team_id, 0) AS teamid, '' AS url, 0 AS has_profile"
	"  FROM account a LEFT JOIN account_credit c ON c.account_id = a.id"
	" WHERE NOT a.disabled ORDER BY a.id";

static const char *const team_sql =
	"SELECT t.id, 0 AS type, t.name, coalesce(t.founder_id, 0) AS userid,"
	"       coalesce(c.total, 0) AS total_credit, coalesce(c.rac, 0) AS expavg_credit,"
	"       " EPOCH("c.rac_time") " AS expavg_time,"
	"       coalesce(f.name, '') AS founder_name, " EPOCH("t.created_at") "::bigint AS create_time,"
	"       '' AS url, '' AS name_html, t.description, '' AS country,"
	"       (SELECT count(*) FROM account a WHERE a.team_id = t.id) AS nusers"
	"  FROM team t LEFT JOIN team_credit c ON c.team_id = t.id"
	"  LEFT JOIN account f ON f.id = t.founder_id ORDER BY t.id";

static const char *const host_sql =
	"SELECT h.id, h.account_id AS userid, coalesce(c.total, 0) AS total_credit,"
	"       coalesce(c.rac, 0) AS expavg_credit, " EPOCH("c.rac_time") " AS expavg_time,"
	"       '' AS p_vendor, h.cpu_model AS p_model, h.os_name, h.os_version,"
	"       h.gpu AS coprocs, " EPOCH("h.created_at") "::bigint AS create_time,"
	"       " EPOCH("h.last_seen") "::bigint AS rpc_time, h.cores AS p_ncpus,"
	"       h.flops AS p_fpops, h.memory_bytes::float8 AS m_nbytes"
	"  FROM host h JOIN account a ON a.id = h.account_id"
	"  LEFT JOIN host_credit c ON c.host_id = h.id"
	" WHERE NOT h.revoked AND NOT a.disabled ORDER BY h.id";

static const char *const totals_sql =
	"SELECT (SELECT count(*) FROM account WHERE NOT disabled),"
	"       (SELECT count(*) FROM team),"
	"       (SELECT count(*) FROM host h JOIN account a ON a.id = h.account_id"
	"         WHERE NOT h.revoked AND NOT a.disabled),"
	"       (SELECT coalesce(sum(total), 0) FROM account_credit c JOIN account a"
	"            ON a.id = c.account_id WHERE NOT a.disabled)";

cot_err stats_export(PGconn *c, const char *dir, cot_errbuf *eb)
{
	if (mkdir(dir, 0755) && errno != EEXIST)
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", dir,
		                  strerror(errno));
	/* One snapshot for every file, so the totals agree. */
	PGresult *r = PQexec(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		return db_fail(r, c, eb, "the database");
	PQclear(r);
	cot_err rc = dump(c, dir, "user.gz", "users", "user", user_sql, eb);
	if (!rc)
		rc = dump(c, dir, "team.gz", "teams", "team", team_sql, eb);
	if (!rc)
		rc = dump(c, dir, "host.gz", "hosts", "host", host_sql, eb);
	if (!rc) {
		r = PQexec(c, totals_sql);
		if (PQresultStatus(r) != PGRES_TUPLES_OK) {
			rc = db_fail(r, c, eb, "the totals");
		} else {
			out_file o;
			rc = out_open(&o, dir, "tables.xml", false, eb);
			if (!rc) {
				char line[512];
				snprintf(line, sizeof line,
				         "<tables>\n <update_time>%lld</update_time>\n"
				         " <nusers_total>%s</nusers_total>\n <nteams_total>%s</nteams_total>\n"
				         " <nhosts_total>%s</nhosts_total>\n <total_credit>%s</total_credit>\n"
				         " <applications>\n  <application>\n   <name>cotrain</name>\n"
				         "  </application>\n </applications>\n</tables>\n",
				         (long long)time(NULL), PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1),
				         PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3));
				out_puts(&o, line);
				rc = out_close(&o, false, eb);
			}
			PQclear(r);
		}
	}
	PQclear(PQexec(c, rc ? "ROLLBACK" : "COMMIT"));
	return rc;
}

struct stats_timer {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	const char *conninfo, *dir;
	int interval_s;
};

static void *timer_main(void *arg)
{
	stats_timer *t = arg;
	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		pthread_mutex_unlock(&t->mu);
		PGconn *c = PQconnectdb(t->conninfo);
		cot_errbuf eb = { 0 };
		if (PQstatus(c) != CONNECTION_OK)
			log_warn("stats export: could not connect: %s", PQerrorMessage(c));
		else if (stats_export(c, t->dir, &eb))
			log_warn("stats export: %s", eb.msg);
		else
			log_info("stats export written to \"%s\"", t->dir);
		PQfinish(c);
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

cot_err stats_timer_start(const char *conninfo, const char *dir, int interval_s,
                          stats_timer **out, cot_errbuf *eb)
{
	stats_timer *t = calloc(1, sizeof *t);
	if (!t)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	t->conninfo = conninfo;
	t->dir = dir;
	t->interval_s = interval_s > 0 ? interval_s : 86400;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	if (pthread_create(&t->thread, NULL, timer_main, t)) {
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
	free(t);
}
