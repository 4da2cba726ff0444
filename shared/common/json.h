/* cotrain: shape validation for JSON over Jansson.
 *
 * Every input is untrusted until checked: these helpers parse a request body
 * into an object and pull typed, bounded fields out of it, each failure
 * described in eb in PostgreSQL's message style ("field \"cores\" must be an
 * integer between 1 and 4096").  Unknown fields are ignored, so clients may be
 * newer than the server.  Strings returned point into the json_t and live as
 * long as it does. */
#ifndef COT_JSON_H
#define COT_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "shared/common/error.h"

/* Parse len bytes as one JSON object (duplicate keys refused, no NUL inside
 * strings, nesting bounded by Jansson).  On success *out owns a new
 * reference the caller must json_decref.  COT_ERR_INVALID with a detail on
 * malformed JSON or a value that is not an object. */
cot_err cot_json_parse_object(const char *buf, size_t len, json_t **out, cot_errbuf *eb);

/* Field getters.  When the field is absent: COT_ERR_INVALID ("missing field")
 * if required, else COT_OK with *out untouched (set your default first).
 * A JSON null counts as absent.  Wrong type or out of bounds: COT_ERR_INVALID. */

/* A string of minlen..maxlen bytes (UTF-8, as Jansson guarantees). */
cot_err cot_json_str(const json_t *obj, const char *key, bool required, size_t minlen, size_t maxlen,
                     const char **out, cot_errbuf *eb);
/* An integer (not a real) in [min, max]. */
cot_err cot_json_int(const json_t *obj, const char *key, bool required, long long min, long long max,
                     long long *out, cot_errbuf *eb);
/* A finite number, integer or real, in [min, max]. */
cot_err cot_json_num(const json_t *obj, const char *key, bool required, double min, double max, double *out,
                     cot_errbuf *eb);
/* true or false. */
cot_err cot_json_bool(const json_t *obj, const char *key, bool required, bool *out, cot_errbuf *eb);

#endif
