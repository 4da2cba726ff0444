/* cotrain tests: a small TAP (Test Anything Protocol) producer.
 *
 *   plan(3);                        or  plan_lazy() ... done_testing();
 *   ok(x == 1, "x is %d", x);
 *   is_int(got, 5, "five rows");
 *   is_str(s, "abc", "name");
 *   skip_all("needs root");        prints "1..0 # SKIP needs root", exits 0
 *   return exit_status();           non-zero when any test failed or the
 *                                   plan was not met
 * Every check prints one line; failures print a diagnostic with what was
 * expected and what was got. */
#ifndef COT_TAP_H
#define COT_TAP_H

#include <stdbool.h>

void plan(int n);
void plan_lazy(void);
bool ok(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool is_int(long long got, long long want, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool is_str(const char *got, const char *want, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void skip(int n, const char *reason);
void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn void skip_all(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn void bail_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void done_testing(void);
int exit_status(void);

#endif
