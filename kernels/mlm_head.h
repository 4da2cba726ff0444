/* cotrain kernels: the encoders' masked-LM head (BERT's
 * cls.predictions, ALBERT's predictions), on N rows of hidden states:
 *   pre  = x W_d + b_d           x[N,H], W_d[H,E]
 *   out  = LayerNorm(gelu(pre))  eps as given (1e-12)
 *   logits = out wte^T + bias    wte[V,E], the word embedding (tied)
 * The GELU is the tanh form (ALBERT's gelu_new) or the exact one (BERT). */
#ifndef KERN_MLM_HEAD_H
#define KERN_MLM_HEAD_H

typedef struct {
	const float *dense_w, *dense_b; /* [H,E], [E] */
	const float *ln_w, *ln_b;       /* [E] */
	const float *decoder;           /* [V,E]: the word embedding */
	const float *bias;              /* [V] */
} kern_mlm_weights;

typedef struct {
	float *dense_w, *dense_b, *ln_w, *ln_b, *decoder, *bias; /* same shapes, accumulated */
} kern_mlm_grads;

typedef struct {
	float *pre, *act, *out; /* [N,E]: dense output, after GELU, after LayerNorm */
	float *mean, *rstd;     /* [N] */
	float *logits;          /* [N,V] */
} kern_mlm_acts;

/* Fill a's buffers for the N rows of x[N,H]; gelu_erf selects the exact
 * GELU. */
void kern_mlm_head_forward(const kern_mlm_acts *a, const kern_mlm_weights *w, const float *x, int N, int H,
                           int E, int V, int gelu_erf, float eps);

/* Given dlogits[N,V], set dx[N,H] (old contents ignored) and add the
 * weights' gradients into g; s1 and s2 are [N,E] scratch. */
void kern_mlm_head_backward_set(float *dx, const kern_mlm_grads *g, const float *dlogits, float *s1,
                                float *s2, const kern_mlm_acts *a, const kern_mlm_weights *w, const float *x,
                                int N, int H, int E, int V, int gelu_erf);

#endif
