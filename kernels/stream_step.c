/* cotrain kernels: one microbatch of the training stream.  See stream_step.h. */
#include "kernels/stream_step.h"

#include "kernels/encoder.h"
#include "kernels/gpu.h"

cot_err kern_stream_step(kern_model *m, const int32_t *in, const int32_t *tgt, int B, uint64_t seed,
                         int64_t g, int64_t mb_per_epoch, float scale, float *loss, cot_errbuf *eb)
{
	float l = 0;
	cot_err rc;
	if (loss)
		*loss = 0;
	if (g < 0 || mb_per_epoch < 1)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "microbatch %lld of epochs of %lld is not in the stream", (long long)g,
		                  (long long)mb_per_epoch);
	if (m->config.arch != KERN_ARCH_GPT) {
		kern_enc_result res = { 0 };
		kern_enc_batch batch;
		rc = kern_enc_stream_batch(m, in, (size_t)m->config.seq_len, B, seed, g / mb_per_epoch,
		                           g % mb_per_epoch, &batch, eb);
		if (!rc && kern_gpu_bound(m)) {
			rc = kern_gpu_enc_step(m, &batch, B, scale, &res, eb);
		} else if (!rc) {
			rc = kern_enc_forward(m, &batch, B, &res, eb);
			if (!rc)
				rc = kern_enc_backward_scaled(m, scale, eb);
		}
		l = (float)res.loss;
	} else if (kern_gpu_bound(m)) {
		rc = kern_gpu_step(m, in, tgt, B, scale, &l, eb);
	} else {
		rc = kern_forward(m, in, tgt, B, &l, eb);
		if (!rc)
			rc = kern_backward_scaled(m, scale, eb);
	}
	if (loss && !rc)
		*loss = l;
	return rc;
}
