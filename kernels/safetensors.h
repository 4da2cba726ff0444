/* cotrain kernels: reading and writing the safetensors layout.
 *
 * A safetensors file is
 *
 *   8 bytes   N, the header length, unsigned little-endian
 *   N bytes   a JSON object (UTF-8), possibly padded with trailing spaces:
 *               {"__metadata__": {"key": "value", ...},          (optional)
 *                "name": {"dtype": "F32", "shape": [2, 3],
 *                         "data_offsets": [begin, end]}, ...}
 *   the rest  the data region: raw little-endian tensor bytes; offsets are
 *             relative to its start, and the tensors cover it exactly,
 *             without gaps or overlaps
 *
 * (https://github.com/huggingface/safetensors).  Files written here pad the
 * header with spaces to a multiple of 8 bytes, as the Python library does,
 * so that data stays aligned; files read here need not be aligned, so read
 * tensor data with memcpy, never through a cast pointer.
 *
 * Everything read is untrusted: st_open and st_parse check the whole header
 * (sizes, types, shapes, offsets, coverage, names) before any tensor is
 * handed out, and turn every violation into COT_ERR_CORRUPT or
 * COT_ERR_TOO_LARGE with a detail, never a crash or an allocation sized by
 * the file. */
#ifndef KERN_SAFETENSORS_H
#define KERN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define ST_HEADER_MAX (16u << 20) /* bytes of JSON header we accept */
#define ST_MAX_TENSORS 65536      /* tensors in one file */
#define ST_MAX_DIMS 8             /* dimensions of one tensor */
#define ST_NAME_MAX 255           /* bytes in a tensor name */

typedef enum {
	ST_BOOL,
	ST_U8,
	ST_I8,
	ST_F8_E5M2,
	ST_F8_E4M3,
	ST_I16,
	ST_U16,
	ST_F16,
	ST_BF16,
	ST_I32,
	ST_U32,
	ST_F32,
	ST_I64,
	ST_U64,
	ST_F64,
	ST_NDTYPES
} st_dtype;

/* The safetensors name of a dtype ("F32"), or NULL when out of range. */
const char *st_dtype_name(st_dtype d);
/* Bytes per element of a dtype, or 0 when out of range. */
size_t st_dtype_size(st_dtype d);

/* One tensor of an open file.  name and data point into the st_file and stay
 * valid until st_close.  data holds nbytes little-endian bytes and may be
 * unaligned. */
typedef struct {
	const char *name;
	st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	size_t numel;
	size_t nbytes;
	const void *data;
} st_tensor;

typedef struct st_file st_file;

/* Map the file at path read-only and validate it.  On success *out owns the
 * mapping; free it with st_close.  Errors: COT_ERR_IO (cannot open, stat or
 * map), COT_ERR_CORRUPT (malformed or truncated), COT_ERR_TOO_LARGE (header
 * or tensor count over the bounds above), COT_ERR_NOMEM.  *out is NULL on
 * error.  The file must not be truncated while it is open (SIGBUS). */
cot_err st_open(const char *path, st_file **out, cot_errbuf *eb);

/* Like st_open, over len bytes in memory that the caller keeps alive and
 * unchanged until st_close (nothing is copied). */
cot_err st_parse(const void *buf, size_t len, st_file **out, cot_errbuf *eb);

/* Release an st_file; NULL is allowed. */
void st_close(st_file *f);

/* Tensors in data-offset order: index 0 .. st_count()-1. */
size_t st_count(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, size_t i);
/* The tensor with this name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);

/* The __metadata__ value for key, or NULL when absent.  Valid until
 * st_close. */
const char *st_meta(const st_file *f, const char *key);

/* ---- writing ---------------------------------------------------------- */

typedef struct st_writer st_writer;

/* A writer collects metadata and tensors, then writes them in one go.
 * Returns COT_ERR_NOMEM or COT_OK; free with st_writer_free. */
cot_err st_writer_new(st_writer **out, cot_errbuf *eb);
void st_writer_free(st_writer *w);

/* Set a metadata key (copied).  A later value for the same key replaces the
 * earlier one.  COT_ERR_INVALID when key is empty; COT_ERR_TOO_LARGE when
 * key and value together exceed a quarter of ST_HEADER_MAX. */
cot_err st_writer_meta(st_writer *w, const char *key, const char *value, cot_errbuf *eb);

/* Add a tensor.  name and shape are copied; data (numel * dtype size bytes,
 * little-endian) is borrowed and must stay valid until st_writer_write
 * returns.  Tensors are laid out in the order they are added.
 * COT_ERR_INVALID for a bad or duplicate name, bad dtype or shape,
 * COT_ERR_TOO_LARGE when sizes overflow or the count exceeds the bound. */
cot_err st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, cot_errbuf *eb);

/* Write everything to path atomically: a temporary file in the same
 * folder, fsync, rename over path, fsync of the folder.  On error path is
 * untouched and the temporary file removed.  COT_ERR_IO or COT_ERR_NOMEM. */
cot_err st_writer_write(st_writer *w, const char *path, cot_errbuf *eb);

#endif
