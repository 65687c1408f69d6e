/* gate: whether speculative decoding pays at the current batch size.
 *
 * Proposals cost verification tokens. Where a batch is already
 * compute-bound (on a CPU, from a few rows of a small model on), each
 * verification token costs nearly a whole decoded token, and a drafter's
 * forward adds its own: speculation then lowers throughput however often
 * the proposals are kept. Each row's proposal count already follows that
 * row's acceptance (commit.c: spec_adapt); the gate decides, per step,
 * whether the step carries proposals at all, from measurements.
 *
 * Design notes
 * - Classes. Steps are grouped by running rows: 1, 2, 3-4, 5-8, ... 65+
 *   (LOOM_GATE_CLASSES). Each class keeps, for plain (mode 0) and
 *   speculating (mode 1) decode-only steps, moving sums of the tokens
 *   they committed and the seconds they took (whole steps: planning,
 *   drafting, the forward, the commit); a mode's rate is their ratio,
 *   which weighs a slow step by its time, as throughput does.
 * - Warm-up. A class measures each mode LOOM_GATE_WARM times, the two
 *   alternating (speculation first), before it decides. The first step
 *   of each mode in a class is left out: it touches buffers and weights
 *   for the first time (the first drafter forward of a batch size costs
 *   several later ones).
 * - Choice. The faster mode runs; the other must beat it by
 *   LOOM_GATE_MARGIN to take over (noise does not flip it back and
 *   forth).
 * - Probes. After `probe` steps of the chosen mode, LOOM_GATE_PROBE_STEPS
 *   steps of the other, whose averages restart there (the estimate is of
 *   now: acceptance, contexts and the machine's load change). The next
 *   probe comes after as many steps as keep probing's cost within
 *   LOOM_GATE_PROBE_SHARE of the time: where the other mode's steps (as
 *   last measured: the probe, or the warm-up) lost L seconds each against
 *   the chosen mode's rate, after PROBE_STEPS * L / (share * seconds per
 *   chosen step) steps, at least LOOM_GATE_PROBE_MIN and at most
 *   LOOM_GATE_PROBE_MAX. A speculating step of a compute-bound batch
 *   costs several plain ones, so its probes come rarely; a plain probe
 *   of a batch that speculates well costs little and comes often.
 * - Speculation, when chosen, that slows down below plain steps' last
 *   rate (acceptance fell) probes plain at once rather than switching:
 *   both may have slowed (a busier machine), and only measurements taken
 *   together compare. Plain steps' cost does not follow acceptance; when
 *   they are the choice only the scheduled probes ask.
 * - Stalls. On a shared machine a step now and then takes many times its
 *   usual time (the process was descheduled); one such plain step once
 *   held a batch of 16 in speculation for the rest of its run. A step
 *   counts as at most LOOM_GATE_CLIP typical steps of its mode (the
 *   mode's mean step, kept across probes); a lasting slowdown still
 *   moves the mean, by up to that factor a step.
 * - Determinism. The gate never reads a clock: the engine passes each
 *   step's seconds (loom_gate_record), tests inject them.
 * Call loom_gate_choose before planning a step and loom_gate_record after
 * a decode-only step with the mode it ran. */
#ifndef LOOM_GATE_H
#define LOOM_GATE_H

#define LOOM_GATE_CLASSES 8
#define LOOM_GATE_WARM 3
#define LOOM_GATE_MARGIN 0.03
#define LOOM_GATE_PROBE_STEPS 2
#define LOOM_GATE_PROBE_MIN 16
#define LOOM_GATE_PROBE_MAX 4096
#define LOOM_GATE_PROBE_SHARE 0.01
/* The moving sums' weight of the newest step, once a mode has that many */
#define LOOM_GATE_AVG 8
/* A step counts as at most this many typical steps of its mode */
#define LOOM_GATE_CLIP 4

typedef struct loom_gate_class {
    double tok[2], sec[2];     /* moving sums of tokens and seconds, per mode */
    int n[2];                  /* steps in them (LOOM_GATE_AVG at most) */
    int mode;                  /* the chosen mode */
    int since;                 /* steps of it since the last probe */
    int probe;                 /* steps of it before the next probe */
    int probing;               /* > 0: probe steps of the other mode left */
    int decided;               /* warm-up over */
    int seen[2];               /* a step of the mode came (the first is left out) */
    double typ[2];             /* seconds of a typical step of each mode (kept across probes) */
} loom_gate_class;

typedef struct loom_gate {
    loom_gate_class c[LOOM_GATE_CLASSES];
    int off;                   /* 1: never gate (always speculate) */
} loom_gate;

/* The class of a step with n_rows running rows. */
int loom_gate_class_of(int n_rows);
/* 1 when the next step at n_rows running rows should carry proposals. */
int loom_gate_choose(loom_gate *g, int n_rows);
/* A decode-only step at n_rows rows, in mode spec (1: it carried
 * proposals), committed tokens in seconds. Steps with nothing committed
 * or no time are left out. */
void loom_gate_record(loom_gate *g, int n_rows, int spec, int tokens, double seconds);
/* A mode's measured rate in tokens/s at n_rows rows (0: not measured). */
double loom_gate_rate(const loom_gate *g, int n_rows, int spec);

#endif
