/* cotrain tests: PyTorch reference files.  See ref_file.h. */
#include "tests/ref_file.h"

#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static ref_record *recs;
static int nrecs;

/* Append the records of the reference file at path to recs. */
void ref_load(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		bail_out("cannot open %s", path);
	char magic[8];
	uint32_t count;
	if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "CTREF001", 8) != 0 || fread(&count, 4, 1, f) != 1 ||
	    count > 10000)
		bail_out("%s is not a reference file", path);
	recs = realloc(recs, (nrecs + count) * sizeof *recs);
	if (!recs)
		bail_out("out of memory");
	memset(recs + nrecs, 0, count * sizeof *recs);
	for (uint32_t i = 0; i < count; i++) {
		ref_record *r = &recs[nrecs + i];
		uint32_t len, dt, nd;
		if (fread(&len, 4, 1, f) != 1 || len >= sizeof r->name || fread(r->name, 1, len, f) != len ||
		    fread(&dt, 4, 1, f) != 1 || fread(&nd, 4, 1, f) != 1 || nd > 4 ||
		    fread(r->shape, 4, nd, f) != nd)
			bail_out("%s: bad record %u", path, i);
		r->dtype = (int)dt;
		r->ndim = (int)nd;
		r->n = 1;
		for (uint32_t k = 0; k < nd; k++)
			r->n *= r->shape[k];
		if (r->n > (1u << 24))
			bail_out("%s: record %s too large", path, r->name);
		r->data = malloc(r->n * 4 + 1);
		if (fread(r->data, 4, r->n, f) != r->n)
			bail_out("%s: truncated at %s", path, r->name);
	}
	nrecs += (int)count;
	fclose(f);
}

const ref_record *ref_get(const char *tag, const char *what, int dtype)
{
	char name[160];
	snprintf(name, sizeof name, "%s.%s", tag, what);
	for (int i = 0; i < nrecs; i++)
		if (strcmp(recs[i].name, name) == 0) {
			if (recs[i].dtype != dtype)
				bail_out("record %s has the wrong type", name);
			return &recs[i];
		}
	bail_out("reference file lacks %s", name);
}

/* max |a - b| / max |b| */
double ref_rel_err(const float *a, const float *b, size_t n)
{
	double e = 0, s = 0;
	for (size_t i = 0; i < n; i++) {
		e = fmax(e, fabs((double)a[i] - b[i]));
		s = fmax(s, fabs((double)b[i]));
	}
	return s > 0 ? e / s : e;
}

void ref_free_all(void)
{
	for (int i = 0; i < nrecs; i++)
		free(recs[i].data);
	free(recs);
	recs = NULL;
	nrecs = 0;
}
