/* cotrain CUDA backend: the stage profile of COTRAIN_CUDA_PROFILE=1
 * (kern_gpu_api's profile), shared by the GPT's passes (cuda_gpt.cu) and
 * the encoders' (cuda_encoder.cu): an event recorded before each stage,
 * and the time from each to the next summed by the stage's kind. */
#ifndef COTRAIN_CUDA_PROF_H
#define COTRAIN_CUDA_PROF_H

#include <cuda_runtime.h>
#include <vector>

/* The kinds of work the profile tells apart (names in cuda_gpt.cu). */
enum {
	PROF_PRODUCTS,
	PROF_SPLIT, /* q, k and v into the heads' layout */
	PROF_ATTENTION,
	PROF_ATTENTION_BWD,
	PROF_LAYERNORM,
	PROF_ELEMENTWISE,
	PROF_HEAD,    /* the logits' product (an encoder's: the MLM head's) */
	PROF_HEAD_DX, /* the head's backward products: into the activations' gradient */
	PROF_HEAD_DW, /* and into the tied embedding's */
	PROF_CE,
	PROF_EMBEDDING,
	PROF_KINDS
};
enum { PROF_MAX_EVENTS = 4096 };

struct cu_prof {
	bool on; /* COTRAIN_CUDA_PROFILE=1 when the model was created */
	int np;  /* marks since the last collection */
	std::vector<cudaEvent_t> ev;
	std::vector<int> kind;
	double ms[PROF_KINDS];
};

/* The work queued on s from here to the next mark is of kind k (nothing
 * when p is NULL or off). */
static inline void cu_prof_mark(cu_prof *p, int k, cudaStream_t s)
{
	if (p && p->on && p->np < PROF_MAX_EVENTS) {
		cudaEventRecord(p->ev[(size_t)p->np], s);
		p->kind[(size_t)p->np++] = k;
	}
}

#endif
