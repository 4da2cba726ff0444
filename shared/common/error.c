/* cotrain: error codes and their details. */
#include "shared/common/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *cot_strerror(cot_err e)
{
	switch (e) {
	case COT_OK:
		return "ok";
	case COT_ERR_NOMEM:
		return "out_of_memory";
	case COT_ERR_INVALID:
		return "invalid";
	case COT_ERR_IO:
		return "io_error";
	case COT_ERR_NOT_FOUND:
		return "not_found";
	case COT_ERR_EXISTS:
		return "already_exists";
	case COT_ERR_TOO_LARGE:
		return "too_large";
	case COT_ERR_CORRUPT:
		return "corrupt";
	case COT_ERR_DB:
		return "database_error";
	case COT_ERR_SCHEMA:
		return "schema_mismatch";
	case COT_ERR_AUTH:
		return "unauthorized";
	case COT_ERR_FORBIDDEN:
		return "forbidden";
	case COT_ERR_CONFLICT:
		return "conflict";
	case COT_ERR_UNSUPPORTED:
		return "unsupported";
	case COT_ERR_TIMEOUT:
		return "timeout";
	case COT_ERR_NETWORK:
		return "network_error";
	case COT_ERR_INTERNAL:
		return "internal_error";
	}
	return "unknown";
}

cot_err cot_seterr(cot_errbuf *eb, cot_err e, const char *fmt, ...)
{
	if (eb) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
		va_end(ap);
		eb->hint[0] = '\0';
	}
	return e;
}

void cot_sethint(cot_errbuf *eb, const char *fmt, ...)
{
	if (eb) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(eb->hint, sizeof eb->hint, fmt, ap);
		va_end(ap);
	}
}
