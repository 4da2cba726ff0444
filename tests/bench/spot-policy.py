#!/usr/bin/env python3
"""cotrain benchmark: what a spot-check policy costs and how fast it catches
(doc/credit.md, "Spot checks"), computed exactly, not measured.

For a host that runs ROUNDS rounds of M microbatches each, checked on m of
them per check with the probability spot_rate gives its record (consecutive
agreeing checks; db/functions/spotcheck.sql), a dynamic program over the
record gives:
  - share: the checkers' microbatches over the host's (an honest host);
  - for a host that skips a fraction f of its microbatches from its first
    round (each check catches it with probability 1 - (1 - f)^m, and a
    catch puts its record back to 0): the probability that it is caught
    within ROUNDS rounds and the expected round of its first catch, given
    that it is caught.
Both the geometric rule (trusted_after, decay) and BOINC's (first_rate
until trusted_after agreeing checks, then 1/record), for comparison.

  tests/bench/spot-policy.py [ROUNDS] [M] [m]
"""
import sys


def geometric(first_rate=1.0, trusted_after=1, decay=0.5, min_rate=0.01):
    return lambda r: first_rate if r < trusted_after else max(
        min_rate, first_rate * decay ** (r - trusted_after + 1))


def boinc(first_rate=1.0, trusted_after=10, min_rate=0.01):
    return lambda r: first_rate if r < trusted_after else max(min_rate, 1.0 / max(r, 1))


def run(rate, rounds, detect):
    """Expected checks over the rounds; P(first catch at round t), t = 1..rounds."""
    dist = {0: 1.0}  # record -> probability, not yet caught
    checks, first = 0.0, []
    for _ in range(rounds):
        nxt, caught = {}, 0.0
        for r, p in dist.items():
            q = rate(r)
            checks += p * q
            caught += p * q * detect
            nxt[r + 1] = nxt.get(r + 1, 0.0) + p * q * (1 - detect)
            nxt[r] = nxt.get(r, 0.0) + p * (1 - q)
        first.append(caught)
        dist = nxt
    return checks, first


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    M = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    m = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    for name, rate in (("geometric (trusted_after 1, decay 0.5)", geometric()),
                       ("boinc (trusted_after 10, 1/record)", boinc())):
        checks, _ = run(rate, rounds, 0.0)
        line = "%s rounds=%d M=%d m=%d checks_per_host=%.2f share=%.4f" % (
            name, rounds, M, m, checks, checks * m / (rounds * M))
        for f in (0.5, 0.25, 0.1):
            _, first = run(rate, rounds, 1 - (1 - f) ** m)
            p = sum(first)
            mean = sum((t + 1) * x for t, x in enumerate(first)) / p if p else float("nan")
            line += " f%.2f:caught=%.3f,round=%.2f" % (f, p, mean)
        print(line)


if __name__ == "__main__":
    main()
