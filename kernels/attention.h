/* cotrain kernels: causal multi-head self-attention.
 *
 * Shapes: qkv[B,T,3C] holds, for each token, q (C channels), k (C), v (C);
 * head h of NH owns channels [h*hd, (h+1)*hd) of each, hd = C/NH.
 *   att[b,h,t,:] = softmax_j<=t( q_t . k_j / sqrt(hd) )
 *   out[b,t,h*hd:(h+1)*hd] = sum_j att[b,h,t,j] v_j
 * Rows are processed in blocks of KERN_ATT_BLOCK: a block of rows [r0, r1)
 * only computes columns [0, r1), the causal mask skipping the rest; within
 * those columns att is 0 above the diagonal and columns >= r1 are never
 * written or read. */
#ifndef KERN_ATTENTION_H
#define KERN_ATTENTION_H

#define KERN_ATT_BLOCK 64

/* out[B,T,C]; att[B,NH,T,T] receives the probabilities (kept for backward). */
void kern_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);

/* dqkv[B,T,3C] += gradient given dout[B,T,C] and the forward's qkv and att;
 * datt[B,NH,T,T] is scratch (overwritten). */
void kern_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                             int B, int T, int C, int NH);

/* The same, dqkv's old contents ignored (no zeroing pass needed). */
void kern_attention_backward_set(float *dqkv, float *datt, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH);

#endif
