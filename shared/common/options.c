/* cotrain: command-line options from one table per program (see options.h). */
#include "config.h"

#include "shared/common/options.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OPTS 64     /* options in one table */
#define HELP_WIDTH 79   /* columns of the generated help */
#define HELP_COL_MAX 28 /* the help text starts here at the latest */

static int count(const opt_spec *o)
{
	int n = 0;
	while (o[n].name)
		n++;
	return n;
}

static bool takes_arg(const opt_spec *o)
{
	return o->type != OPT_FLAG && o->type != OPT_HELP && o->type != OPT_VERSION;
}

static void *field(void *settings, const opt_spec *o) { return (char *)settings + o->offset; }

/* The range part of an error, "(must be between 0 and 65535)". */
static void range_text(const opt_spec *o, bool malformed, char *buf, size_t len)
{
	switch (o->type) {
	case OPT_U64:
		if (o->max == 0) {
			snprintf(buf, len, "must be an unsigned 64-bit integer");
			break;
		}
		/* fall through */
	case OPT_INT:
	case OPT_LLONG:
	case OPT_SIZE:
		snprintf(buf, len, "must be %sbetween %lld and %lld", malformed ? "an integer " : "", o->min,
		         o->max);
		break;
	case OPT_DOUBLE:
	case OPT_FLOAT:
		if (o->min_open)
			snprintf(buf, len, "must be %smore than %g and at most %g",
			         malformed ? "a number " : "", o->dmin, o->dmax);
		else
			snprintf(buf, len, "must be %sbetween %g and %g", malformed ? "a number " : "",
			         o->dmin, o->dmax);
		break;
	default:
		snprintf(buf, len, "must be %s", o->expect ? o->expect : "valid");
		break;
	}
}

static void try_help(const opt_program *p)
{
	fprintf(stderr, "Try \"%s --help\" for more information.\n", p->prog);
}

static opt_result invalid(const opt_program *p, const opt_spec *o, const char *arg, bool malformed)
{
	char want[160];
	range_text(o, malformed, want, sizeof want);
	fprintf(stderr, "%s: invalid value for --%s: \"%s\" (%s)\n", p->prog, o->name, arg, want);
	try_help(p);
	return OPT_USAGE;
}

/* Store arg into o's field of settings, checking its form and range. */
static opt_result set_value(const opt_program *p, const opt_spec *o, const char *arg, void *settings)
{
	char *end;
	errno = 0;
	switch (o->type) {
	case OPT_STRING:
		*(const char **)field(settings, o) = arg;
		return OPT_OK;
	case OPT_FLAG:
		*(int *)field(settings, o) = 1;
		return OPT_OK;
	case OPT_INT:
	case OPT_LLONG:
	case OPT_SIZE: {
		long long v = strtoll(arg, &end, 10);
		if (errno == ERANGE)
			return invalid(p, o, arg, false);
		if (errno || end == arg || *end)
			return invalid(p, o, arg, true);
		if (v < o->min || v > o->max)
			return invalid(p, o, arg, false);
		if (o->type == OPT_INT)
			*(int *)field(settings, o) = (int)v;
		else if (o->type == OPT_LLONG)
			*(long long *)field(settings, o) = v;
		else
			*(size_t *)field(settings, o) = (size_t)v;
		return OPT_OK;
	}
	case OPT_U64: {
		const char *s = arg;
		while (*s == ' ' || *s == '\t')
			s++;
		unsigned long long v = strtoull(arg, &end, 10);
		if (*s == '-' || errno == EINVAL || end == arg || *end)
			return invalid(p, o, arg, true);
		if (errno == ERANGE ||
		    (o->max && (v < (unsigned long long)o->min || v > (unsigned long long)o->max)))
			return invalid(p, o, arg, false);
		*(uint64_t *)field(settings, o) = (uint64_t)v;
		return OPT_OK;
	}
	case OPT_DOUBLE:
	case OPT_FLOAT: {
		double v = strtod(arg, &end);
		if (end == arg || *end || isnan(v))
			return invalid(p, o, arg, true);
		if (errno || !isfinite(v) || v > o->dmax || v < o->dmin || (o->min_open && v == o->dmin))
			return invalid(p, o, arg, false);
		if (o->type == OPT_DOUBLE)
			*(double *)field(settings, o) = v;
		else
			*(float *)field(settings, o) = (float)v;
		return OPT_OK;
	}
	case OPT_CALL: {
		cot_errbuf eb = { "", "" };
		if (!o->set(settings, o, arg, &eb))
			return OPT_OK;
		if (!eb.msg[0])
			return invalid(p, o, arg, false);
		fprintf(stderr, "%s: %s\n", p->prog, eb.msg);
		if (eb.hint[0])
			fprintf(stderr, "hint: %s\n", eb.hint);
		try_help(p);
		return OPT_USAGE;
	}
	case OPT_HELP:
	case OPT_VERSION:
		break;
	}
	return OPT_OK;
}

opt_result opt_parse(const opt_program *p, int argc, char **argv, void *settings, int *next)
{
	struct option lopts[MAX_OPTS + 1];
	char shorts[3 * MAX_OPTS + 3];
	size_t ns = 0;
	int n = count(p->opts);
	if (n > MAX_OPTS) {
		fprintf(stderr, "%s: too many options in the table\n", p->prog);
		return OPT_USAGE;
	}
	if (p->stop_at_command)
		shorts[ns++] = '+';
	shorts[ns++] = ':'; /* a missing argument returns ':', not '?' */
	for (int i = 0; i < n; i++) {
		const opt_spec *o = &p->opts[i];
		lopts[i] = (struct option){ o->name, takes_arg(o) ? required_argument : no_argument, NULL,
			                    o->short_name ? o->short_name : 256 + i };
		if (o->short_name) {
			shorts[ns++] = (char)o->short_name;
			if (takes_arg(o))
				shorts[ns++] = ':';
		}
		if (o->def && takes_arg(o) && set_value(p, o, o->def, settings) != OPT_OK)
			return OPT_USAGE; /* a bad table: the message names the option */
	}
	lopts[n] = (struct option){ NULL, 0, NULL, 0 };
	shorts[ns] = '\0';

	int saved_opterr = opterr;
	opterr = 0;
	optind = 0; /* glibc: start afresh */
	opt_result r = OPT_OK;
	int c;
	while (r == OPT_OK && (c = getopt_long(argc, argv, shorts, lopts, NULL)) != -1) {
		if (c == '?' || c == ':') {
			/* The option as given: a short one inside a cluster is not
			 * argv[optind - 1] on its own. */
			const char *what = argv[optind - 1];
			char sbuf[3] = { '-', (char)optopt, '\0' };
			if (c == '?' && optopt > 0 && optopt < 256 && strncmp(what, "--", 2) != 0)
				what = sbuf;
			if (c == ':')
				fprintf(stderr, "%s: option \"%s\" needs a value\n", p->prog, what);
			else
				fprintf(stderr, "%s: unknown option \"%s\"\n", p->prog, what);
			try_help(p);
			r = OPT_USAGE;
			break;
		}
		int i = c >= 256 ? c - 256 : -1;
		for (int k = 0; i < 0 && k < n; k++)
			if (p->opts[k].short_name == c)
				i = k;
		if (i < 0 || i >= n)
			continue; /* cannot happen: getopt returns only what we gave it */
		const opt_spec *o = &p->opts[i];
		if (o->type == OPT_HELP) {
			opt_help(p, stdout);
			r = OPT_EXIT;
		} else if (o->type == OPT_VERSION) {
			opt_version(p->prog, stdout);
			r = OPT_EXIT;
		} else {
			r = set_value(p, o, optarg, settings);
		}
	}
	opterr = saved_opterr;
	if (r == OPT_OK && optind < argc && !p->allow_args) {
		fprintf(stderr, "%s: unexpected argument \"%s\"\n", p->prog, argv[optind]);
		try_help(p);
		r = OPT_USAGE;
	}
	if (next)
		*next = optind;
	return r;
}

/* Print text word by word up to HELP_WIDTH columns, the cursor standing at
 * column at; continuation lines (and lines after a '\n') start at col. */
static void wrap(FILE *f, const char *text, int at, int col)
{
	const char *s = text;
	bool first = true; /* nothing on this line yet */
	while (*s) {
		if (*s == '\n' || *s == ' ') {
			if (*s == '\n') {
				fprintf(f, "\n%*s", col, "");
				at = col;
				first = true;
			}
			s++;
			continue;
		}
		int wl = (int)strcspn(s, " \n");
		if (!first && at + 1 + wl > HELP_WIDTH) {
			fprintf(f, "\n%*s", col, "");
			at = col;
			first = true;
		}
		if (!first) {
			fputc(' ', f);
			at++;
		}
		fprintf(f, "%.*s", wl, s);
		at += wl;
		first = false;
		s += wl;
	}
	fputc('\n', f);
}

void opt_help(const opt_program *p, FILE *f)
{
	fprintf(f, "usage: %s %s\n", p->prog, p->synopsis);
	if (p->intro)
		fputs(p->intro, f);
	if (p->commands)
		p->commands(f);
	bool any_short = false;
	int col = 0;
	char left[MAX_OPTS][96];
	int n = count(p->opts);
	for (int i = 0; i < n; i++)
		any_short |= p->opts[i].short_name != 0;
	for (int i = 0; i < n && i < MAX_OPTS; i++) {
		const opt_spec *o = &p->opts[i];
		int w;
		if (o->short_name)
			w = snprintf(left[i], sizeof left[i], "  -%c, --%s", o->short_name, o->name);
		else
			w = snprintf(left[i], sizeof left[i], "  %s--%s", any_short ? "    " : "", o->name);
		if (o->metavar && (size_t)w < sizeof left[i])
			w += snprintf(left[i] + w, sizeof left[i] - (size_t)w, " %s", o->metavar);
		if (w + 2 > col)
			col = w + 2;
	}
	if (col > HELP_COL_MAX)
		col = HELP_COL_MAX;
	fputs("\nOptions:\n", f);
	for (int i = 0; i < n && i < MAX_OPTS; i++) {
		const opt_spec *o = &p->opts[i];
		char text[1024];
		snprintf(text, sizeof text, "%s%s%s%s", o->help ? o->help : "", o->def ? " (default " : "",
		         o->def ? o->def : "", o->def ? ")" : "");
		int w = (int)strlen(left[i]);
		fputs(left[i], f);
		if (w + 2 > col) {
			fprintf(f, "  ");
			w += 2;
		} else {
			fprintf(f, "%*s", col - w, "");
			w = col;
		}
		wrap(f, text, w, col);
	}
	if (p->outro) {
		fputc('\n', f);
		fputs(p->outro, f);
	}
}

void opt_version(const char *prog, FILE *f) { fprintf(f, "%s (cotrain) %s\n", prog, PACKAGE_VERSION); }
