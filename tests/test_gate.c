/* test_gate: the speculation gate's decisions (engine/gate.h) against
 * simulated steps with injected timings: no clock, no model. A machine
 * is a cost model per batch size: a plain step commits one token a row in
 * `plain` seconds, a speculating one `1 + acc` tokens a row in `spec`
 * seconds; noise (a fixed pseudo-random sequence) scales each step's time
 * as a busy machine does. */
#include <stdint.h>
#include <stdio.h>

#include "engine/gate.h"
#include "test.h"

typedef struct machine {
    double plain, spec;   /* seconds of a plain and of a speculating step */
    double acc;           /* tokens a row a speculating step adds */
    double noise;         /* each step's time times 1 +- noise */
    double load;          /* and times this (0 = 1): other work on the machine */
    int stall;            /* > 0: every stall-th step (about) takes 30 times as long */
    uint64_t x;           /* the noise's state */
} machine;

typedef struct tally {
    double tokens, seconds;
    int steps[2];         /* steps run in each mode */
} tally;

static double jitter(machine *mc) {
    mc->x ^= mc->x << 13;
    mc->x ^= mc->x >> 7;
    mc->x ^= mc->x << 17;
    double u = (double)(mc->x >> 11) / (double)(1ull << 53); /* [0, 1) */
    return 1 + mc->noise * (2 * u - 1);
}

/* n steps at `rows` rows through the gate: each asks it, runs the mode
 * it chose on the machine and tells it what the step did. */
static void run(loom_gate *g, machine *mc, int rows, int n, tally *t) {
    for (int i = 0; i < n; i++) {
        int spec = loom_gate_choose(g, rows);
        int tokens = spec ? (int)(rows * (1 + mc->acc) + 0.5) : rows;
        double secs = (spec ? mc->spec : mc->plain) * jitter(mc) * (mc->load > 0 ? mc->load : 1);
        if (mc->stall > 0 && (mc->x >> 20) % (uint64_t)mc->stall == 0) secs *= 30;
        loom_gate_record(g, rows, spec, tokens, secs);
        t->tokens += tokens;
        t->seconds += secs;
        t->steps[spec]++;
    }
}

static double rate(const tally *t) { return t->tokens / t->seconds; }

static void classes(void) {
    CHECK_EQ_INT(loom_gate_class_of(1), 0);
    CHECK_EQ_INT(loom_gate_class_of(2), 1);
    CHECK_EQ_INT(loom_gate_class_of(3), 2);
    CHECK_EQ_INT(loom_gate_class_of(4), 2);
    CHECK_EQ_INT(loom_gate_class_of(5), 3);
    CHECK_EQ_INT(loom_gate_class_of(16), 4);
    CHECK_EQ_INT(loom_gate_class_of(17), 5);
    CHECK_EQ_INT(loom_gate_class_of(64), 6);
    CHECK_EQ_INT(loom_gate_class_of(65), 7);
    CHECK_EQ_INT(loom_gate_class_of(100000), 7);
}

/* Warm-up: the first step of each mode left out, then the two
 * alternating, speculation first; then the faster mode runs. */
static void warm_up(void) {
    loom_gate g = {0};
    enum { W = 2 * LOOM_GATE_WARM + 2 };
    int got[W], want[W] = {1, 1, 0, 0};
    for (int i = 4; i < W; i++) want[i] = i % 2 == 0;
    for (int i = 0; i < W; i++) {
        got[i] = loom_gate_choose(&g, 16);
        /* speculating steps: 32 tokens in 4 s; plain: 16 in 1 s; the
         * first of each far slower (left out) */
        double cold = i < 4 && got[i] == want[i] && (i == 0 || i == 2) ? 100 : 1;
        loom_gate_record(&g, 16, got[i], got[i] ? 32 : 16, (got[i] ? 4.0 : 1.0) * cold);
    }
    for (int i = 0; i < W; i++) CHECKF(got[i] == want[i], "warm-up step %d chose %d", i, got[i]);
    CHECK_EQ_INT(loom_gate_choose(&g, 16), 0);
    CHECK(fabs(loom_gate_rate(&g, 16, 0) - 16.0) < 1e-9 && fabs(loom_gate_rate(&g, 16, 1) - 8.0) < 1e-9);
    /* a speculating step lost 4 - 32 / 16 = 2 s against plain steps of
     * 1 s: the first probe comes after 2 * 2 / (0.01 * 1) = 400 of them */
    int plain = 0;
    while (plain < 10000 && !loom_gate_choose(&g, 16)) {
        loom_gate_record(&g, 16, 0, 16, 1.0);
        plain++;
    }
    CHECKF(plain == 400, "first probe after %d plain steps", plain);
    /* another class knows nothing yet */
    CHECK_EQ_INT(loom_gate_choose(&g, 1), 1);
    /* steps that are not recorded (prefills) leave warm-up where it was */
    CHECK_EQ_INT(loom_gate_choose(&g, 1), 1);
    /* off: always speculate */
    loom_gate off = {.off = 1};
    for (int i = 0; i < 100; i++) {
        CHECK_EQ_INT(loom_gate_choose(&off, 16), 1);
        loom_gate_record(&off, 16, 1, 32, 4.0);
    }
}

/* Batch 16 where speculating steps cost 6 plain ones for 2.5 times the
 * tokens: within 5% of plain decoding (probes included), still probing;
 * and batch 1 where speculation doubles the rate: within 5% of always
 * speculating. Both in one gate, interleaved, with 30% noise. */
static void both_ways(void) {
    loom_gate g = {0};
    machine big = {.plain = 0.010, .spec = 0.060, .acc = 1.5, .noise = 0.3, .x = 7};
    machine one = {.plain = 0.002, .spec = 0.003, .acc = 2.0, .noise = 0.3, .x = 11};
    tally tb = {0}, t1 = {0};
    for (int r = 0; r < 40; r++) {
        run(&g, &big, 16, 250, &tb);
        run(&g, &one, 1, 250, &t1);
    }
    double plain16 = 16 / big.plain, spec1 = (1 + one.acc) / one.spec;
    printf("batch 16: %.0f tok/s, plain %.0f (%.3f), %d speculating steps of %d\n", rate(&tb), plain16,
           rate(&tb) / plain16, tb.steps[1], tb.steps[0] + tb.steps[1]);
    printf("batch 1: %.0f tok/s, speculating %.0f (%.3f), %d plain steps of %d\n", rate(&t1), spec1,
           rate(&t1) / spec1, t1.steps[0], t1.steps[0] + t1.steps[1]);
    CHECKF(rate(&tb) >= 0.95 * plain16, "batch 16: %.1f tok/s against plain %.1f", rate(&tb), plain16);
    CHECKF(tb.steps[1] > LOOM_GATE_WARM, "batch 16: %d speculating steps: it never probed", tb.steps[1]);
    CHECKF(rate(&t1) >= 0.95 * spec1, "batch 1: %.1f tok/s against speculating %.1f", rate(&t1), spec1);
    CHECKF(t1.steps[0] > LOOM_GATE_WARM, "batch 1: %d plain steps: it never probed", t1.steps[0]);
}

/* Steps until the gate has run `mode` RUN steps in a row (a choice, not a
 * probe), at most limit; returns the steps before that run began. */
#define RUN (LOOM_GATE_PROBE_STEPS + 3)
static int steps_until(loom_gate *g, machine *mc, int rows, int mode, int limit) {
    int in_row = 0, i = 0;
    for (; i < limit && in_row < RUN; i++) {
        tally u = {0};
        run(g, mc, rows, 1, &u);
        in_row = u.steps[mode] ? in_row + 1 : 0;
    }
    return i - in_row;
}

/* Acceptance changes under a running gate: from paying to losing the
 * gate turns within a few steps; from losing to paying within the
 * probes' interval (which keeps probing's cost to about a percent). */
static void turns(void) {
    loom_gate g = {0};
    machine mc = {.plain = 0.010, .spec = 0.015, .acc = 2.0, .noise = 0.1, .x = 3};
    tally t = {0};
    run(&g, &mc, 4, 500, &t);
    CHECK_EQ_INT(loom_gate_choose(&g, 4), 1);
    run(&g, &mc, 4, 1, &t);
    mc.acc = 0.1; /* now it loses: 4.4 tokens in 15 ms against 4 in 10 */
    int after = steps_until(&g, &mc, 4, 0, 1000);
    CHECKF(after <= 2 * LOOM_GATE_AVG + LOOM_GATE_PROBE_STEPS, "still speculating %d steps after it began to lose", after);
    tally lose = {0};
    run(&g, &mc, 4, 3000, &lose);
    CHECKF(lose.steps[1] * 30 < lose.steps[0], "losing: %d speculating steps of %d", lose.steps[1],
           lose.steps[0] + lose.steps[1]);
    mc.acc = 2.0; /* pays again: 12 tokens in 15 ms */
    int back = steps_until(&g, &mc, 4, 1, 2 * LOOM_GATE_PROBE_MAX);
    printf("turns: plain after %d steps, speculating again after %d\n", after, back);
    CHECKF(back < LOOM_GATE_PROBE_MAX, "speculation back after %d steps", back);
    tally win = {0};
    run(&g, &mc, 4, 3000, &win);
    CHECKF(win.steps[0] * 20 < win.steps[1], "paying: %d plain steps of %d", win.steps[0],
           win.steps[0] + win.steps[1]);
}

/* The machine gets 4 times slower for a while (other work), then
 * recovers: a losing mode measured before the slowdown does not take over
 * on its old figure. */
static void busy(void) {
    loom_gate g = {0};
    machine mc = {.plain = 0.010, .spec = 0.030, .acc = 1.5, .noise = 0.05, .x = 5};
    tally t = {0};
    run(&g, &mc, 16, 1000, &t);
    mc.load = 4;
    tally spike = {0};
    run(&g, &mc, 16, 200, &spike);
    mc.load = 1;
    tally after = {0};
    run(&g, &mc, 16, 200, &after);
    printf("busy: %d speculating steps of 200 while slow, %d after\n", spike.steps[1], after.steps[1]);
    CHECKF(spike.steps[1] <= 2 * LOOM_GATE_PROBE_STEPS, "%d speculating steps while slow", spike.steps[1]);
    CHECKF(after.steps[1] <= 2 * LOOM_GATE_PROBE_STEPS, "%d speculating steps after", after.steps[1]);
}

/* Stalls (one step in 40 or so 30 times as long, in either mode) do
 * not turn the choice, at batch 16 where speculation loses nor at batch
 * 1 where it wins. */
static void stalls(void) {
    loom_gate g = {0};
    machine big = {.plain = 0.010, .spec = 0.040, .acc = 2.0, .noise = 0.2, .x = 9, .stall = 40};
    machine one = {.plain = 0.002, .spec = 0.003, .acc = 2.0, .noise = 0.2, .x = 13, .stall = 40};
    tally tb = {0}, t1 = {0};
    for (int r = 0; r < 20; r++) {
        run(&g, &big, 16, 200, &tb);
        run(&g, &one, 1, 200, &t1);
    }
    printf("stalls: batch 16 speculated %d of %d steps, batch 1 %d of %d\n", tb.steps[1],
           tb.steps[0] + tb.steps[1], t1.steps[1], t1.steps[0] + t1.steps[1]);
    CHECKF(tb.steps[1] * 50 < tb.steps[0] + tb.steps[1], "batch 16: %d speculating steps", tb.steps[1]);
    CHECKF(t1.steps[0] * 10 < t1.steps[0] + t1.steps[1], "batch 1: %d plain steps", t1.steps[0]);
}

/* A probe step that loses little comes often, one that loses much
 * rarely: the interval follows the probe's cost. */
static void probe_interval(void) {
    int interval[2];
    for (int k = 0; k < 2; k++) {
        loom_gate g = {0};
        /* plain 10 ms; speculating 12 ms or 80 ms, for 1.05 times the tokens */
        machine mc = {.plain = 0.010, .spec = k ? 0.080 : 0.012, .acc = 0.05, .noise = 0, .x = 1};
        tally t = {0};
        run(&g, &mc, 64, 20000, &t);
        interval[k] = t.steps[1] ? (t.steps[0] + t.steps[1]) / t.steps[1] : 0;
    }
    printf("probe intervals: %d steps (cheap), %d (dear)\n", interval[0], interval[1]);
    CHECKF(interval[1] > 5 * interval[0], "intervals %d (cheap) and %d (dear)", interval[0], interval[1]);
    CHECK(interval[0] >= LOOM_GATE_PROBE_MIN / LOOM_GATE_PROBE_STEPS);
}

int main(void) {
    classes();
    warm_up();
    both_ways();
    turns();
    busy();
    stalls();
    probe_interval();
    return test_report("test_gate");
}
