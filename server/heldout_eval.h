/* cotrain-server: held-out evaluation of committed model versions
 * (doc/design.md, "Held-out evaluation").
 *
 * A dataset's held-out part (doc/dataset.md) is never handed out as work.
 * Each committed version of a project that evaluates (project file
 * "eval_every", doc/project-file.md) is evaluated once on the project's
 * held-out sample: sequences i = 0 .. n_seq-1, sequence i being tokens
 * [h + i*T, h + i*T + T + 1) of the dataset's stream (h the held-out part's
 * first token, T = seq_len; inputs the first T, targets the next T, as a
 * training sample), n_seq = min(eval_sequences, (heldout_tokens - 1) / T).
 * The figure is the mean next-token cross-entropy over the n_seq * T
 * predictions, in bits: with the byte tokenizer, bits per byte; with a
 * subword tokenizer, bits per token (the column keeps its name,
 * heldout_bpb).
 *
 * An encoder (ALBERT, BERT) has no next-token figure: sequence i's first
 * T - 3 tokens are masked as a training sample is (kern_mask_build: [CLS] A
 * [SEP] B [SEP], 15% of the ordinary tokens predicted), from the fixed key
 * (HEVAL_MASK_SEED, epoch 0, microbatch i, sample 0), so every version
 * of every server faces the same masks whatever the batching; the figures
 * are the masked-LM cross-entropy in nats (mean over all predicted
 * positions) and the fraction of them whose arg-max is the original token
 * (model_version.heldout_mlm_loss, heldout_mlm_accuracy).
 *
 * The evaluator is a thread of its own with its own database connection: it
 * runs at SCHED_IDLE, nice 19 and the idle I/O class, its kernel calls on
 * one thread (kern_set_threads_here), and shares no lock with the rounds,
 * so it never delays one; it polls every round_interval seconds
 * (db/functions/heldout.sql: heldout_next, heldout_store).  Of several
 * server processes on one database only the holder of the DUTY_HELDOUT
 * advisory lock evaluates (server/duty.h). */
#ifndef COT_SERVER_HELDOUT_EVAL_H
#define COT_SERVER_HELDOUT_EVAL_H

#include <stdint.h>

#include "server/settings.h"
#include "shared/common/error.h"

#define HEVAL_BATCH 8 /* sequences per forward pass */
/* The encoders' evaluation masks' seed, the same for every project. */
#define HEVAL_MASK_SEED UINT64_C(0x686f6c646f7574) /* "holdout" */

/* One version's figures. */
typedef struct {
	int arch;            /* the checkpoint's kern_arch */
	double bpb;          /* a GPT's bits per token */
	double mlm_loss;     /* an encoder's: nats per predicted position */
	double mlm_accuracy; /* an encoder's: 0..1 */
	int64_t counted;     /* tokens predicted: n_seq * T, or the masked positions */
} heval_result;

/* The held-out bits per token (per byte with the byte tokenizer) of the
 * checkpoint at ckpt_path on n_seq
 * sequences of T tokens read from tokens[0 .. n_seq*T] (n_seq*T + 1
 * tokens, sequence i starting at i*T): the sum over batches of HEVAL_BATCH
 * sequences of the batch's mean loss times its tokens, in double, divided
 * by n_seq*T and by ln 2.  The checkpoint's seq_len must be T.  Errors:
 * those of ckpt_load_new, COT_ERR_INVALID (n_seq < 1, a seq_len that
 * differs, a token outside the vocabulary, a loss that is not finite). */
cot_err heval_bpb(const char *ckpt_path, const int32_t *tokens, int64_t n_seq, int T, double *bpb,
                  cot_errbuf *eb);

/* The figures of the checkpoint at ckpt_path on the same n_seq sequences,
 * as its arch has them: heval_bpb's for a GPT; for an encoder the masked-LM
 * loss and accuracy above, summed over all predicted positions in double.
 * The errors of heval_bpb, and for an encoder a token outside its
 * vocabulary (COT_ERR_INVALID). */
cot_err heval_checkpoint(const char *ckpt_path, const int32_t *tokens, int64_t n_seq, int T,
                         heval_result *out, cot_errbuf *eb);

typedef struct heval heval;

/* Start the evaluator thread; cfg must outlive it.  *out owns it. */
cot_err heval_start(const srv_config *cfg, heval **out, cot_errbuf *eb);

/* Stop the thread after its current evaluation and free it (NULL is
 * fine). */
void heval_stop(heval *h);

#endif
