/* cotrain: command-line options from one table per program.
 *
 * A program describes each option once, in an array of opt_spec: its name,
 * short letter, the type and place of the value (offsetof into the
 * program's settings struct, or a setter), its range, its default and its
 * help text.  opt_parse builds getopt_long's tables from it, stores the
 * values, checks their ranges, and answers --help (generated from the
 * table) and --version.  The program keeps no usage text, option enum or
 * switch of its own.
 *
 * Errors follow PostgreSQL's style, on stderr, with a pointer to --help:
 *   cotrain-server: invalid value for --port: "70000" (must be between 0 and 65535)
 *   Try "cotrain-server --help" for more information. */
#ifndef COT_OPTIONS_H
#define COT_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "shared/common/error.h"

typedef enum {
	OPT_STRING,  /* const char *: the argument itself (argv stays alive) */
	OPT_INT,     /* int, decimal, in [min, max] */
	OPT_LLONG,   /* long long, decimal, in [min, max] */
	OPT_SIZE,    /* size_t, decimal, in [min, max] */
	OPT_U64,     /* uint64_t, decimal, in [min, max] (max 0: any 64-bit value) */
	OPT_DOUBLE,  /* double, in [dmin, dmax] ((dmin, dmax] with min_open) */
	OPT_FLOAT,   /* float, as OPT_DOUBLE */
	OPT_FLAG,    /* int set to 1; takes no argument */
	OPT_CALL,    /* set(settings, spec, arg, eb) does the work */
	OPT_HELP,    /* print the generated help on stdout, exit 0 */
	OPT_VERSION, /* print "PROGRAM (cotrain) VERSION" on stdout, exit 0 */
} opt_type;

typedef struct opt_spec opt_spec;

/* A setter for OPT_CALL: COT_OK, or an error with eb's message, which
 * opt_parse prints after the program's name (no message: the generic
 * "invalid value" one, naming spec->expect). */
typedef cot_err (*opt_setter)(void *settings, const opt_spec *spec, const char *arg, cot_errbuf *eb);

struct opt_spec {
	const char *name; /* long name without "--"; NULL ends the table */
	int short_name;   /* a letter, or 0 */
	opt_type type;
	size_t offset;       /* offsetof(settings struct, field) */
	long long min, max;  /* integer types */
	double dmin, dmax;   /* OPT_DOUBLE, OPT_FLOAT */
	bool min_open;       /* the floating-point range excludes dmin */
	const char *def;     /* default, parsed like an argument before the command line; NULL: none */
	const char *metavar; /* the argument's name in --help ("N", "DIR"); NULL: no argument */
	const char *help;    /* one sentence or phrase; wrapped by opt_help */
	opt_setter set;      /* OPT_CALL */
	const char *key;     /* free for the setter (a configuration key, say) */
	const char *expect; /* OPT_CALL: what a valid value is, for the error ("debug, info, warn or error") */
};

typedef struct {
	const char *prog;          /* "cotrain-server" */
	const char *synopsis;      /* after "usage: PROG ": "[OPTION]..." */
	const char *intro;         /* after the synopsis line, before the options; may be NULL */
	void (*commands)(FILE *f); /* prints the program's commands after the intro; may be NULL */
	const char *outro;         /* after the options; may be NULL */
	const opt_spec *opts;
	bool stop_at_command; /* options end at the first non-option (a command follows) */
	bool allow_args;      /* non-options are allowed (else "unexpected argument") */
} opt_program;

/* What opt_parse did. */
typedef enum {
	OPT_OK = 0,    /* settings are filled; argv[*next..] are the rest */
	OPT_EXIT = 1,  /* --help or --version answered: exit 0 */
	OPT_USAGE = 2, /* a message is on stderr: exit 2 */
} opt_result;

/* Apply every default of p's table to settings, then the command line.
 * Returns OPT_OK with *next set to the first argument left (options end at
 * the first non-option when p->stop_at_command, else getopt permutes), or
 * OPT_EXIT after printing the help or version on stdout, or OPT_USAGE after
 * printing an error on stderr (unknown option, missing or malformed value,
 * value out of range, unexpected argument).  Uses getopt_long, so it is not
 * reentrant; optind is reset to 1 on return. */
opt_result opt_parse(const opt_program *p, int argc, char **argv, void *settings, int *next);

/* The help generated from p: "usage: PROG SYNOPSIS", the intro, every
 * option with its metavar, help and default, the outro. */
void opt_help(const opt_program *p, FILE *f);

/* "PROGRAM (cotrain) VERSION\n" on f. */
void opt_version(const char *prog, FILE *f);

/* Stringify a numeric macro for a table's def: OPT_STR(PASSWORD_DEFAULT_ITERATIONS). */
#define OPT_STR_(x) #x
#define OPT_STR(x) OPT_STR_(x)

#endif
