/* gate: whether speculative decoding pays at the current batch size
 * (design notes in engine/gate.h). */
#include "engine/gate.h"

#include "base/base.h"

int loom_gate_class_of(int n_rows) {
    int c = 0;
    while (c + 1 < LOOM_GATE_CLASSES && (1 << c) < n_rows) c++;
    return c;
}

static double rate(const loom_gate_class *c, int m) { return c->sec[m] > 0 ? c->tok[m] / c->sec[m] : 0; }

/* Adds a step to mode m's moving sums: plain sums up to LOOM_GATE_AVG
 * steps, then each step weighs 1 / LOOM_GATE_AVG. */
static void add(loom_gate_class *c, int m, int tokens, double seconds) {
    /* a step the machine stalled (the process descheduled: another's work)
     * weighs no more than LOOM_GATE_CLIP typical ones */
    if (c->typ[m] > 0) seconds = LOOM_MIN(seconds, LOOM_GATE_CLIP * c->typ[m]);
    if (c->n[m] < LOOM_GATE_AVG) {
        c->n[m]++;
    } else {
        c->tok[m] *= 1.0 - 1.0 / LOOM_GATE_AVG;
        c->sec[m] *= 1.0 - 1.0 / LOOM_GATE_AVG;
    }
    c->tok[m] += tokens;
    c->sec[m] += seconds;
    c->typ[m] = c->sec[m] / c->n[m];
}

/* Steps of the chosen mode before the next probe of the other: as many
 * as keep probing's cost within LOOM_GATE_PROBE_SHARE of the time. A
 * probe step costs what the other mode's steps took as last measured,
 * less the time the chosen mode takes for the same tokens. */
static int next_probe(const loom_gate_class *c) {
    int m = c->mode, o = !m;
    double r = rate(c, m), per_step = c->n[m] ? c->sec[m] / c->n[m] : 0;
    if (!c->n[o] || r <= 0 || per_step <= 0) return LOOM_GATE_PROBE_MIN;
    double lost = LOOM_GATE_PROBE_STEPS * (c->sec[o] - c->tok[o] / r) / c->n[o];
    double steps = lost / (LOOM_GATE_PROBE_SHARE * per_step);
    return (int)LOOM_MAX(LOOM_GATE_PROBE_MIN, LOOM_MIN(steps, LOOM_GATE_PROBE_MAX));
}

/* Mode m becomes the choice. */
static void choose_mode(loom_gate_class *c, int m) {
    c->mode = m;
    c->since = 0;
    c->probing = 0;
    c->probe = next_probe(c);
}

int loom_gate_choose(loom_gate *g, int n_rows) {
    if (g->off) return 1;
    loom_gate_class *c = &g->c[loom_gate_class_of(n_rows)];
    if (!c->decided) {
        if (c->n[1] < LOOM_GATE_WARM && c->n[1] <= c->n[0]) return 1;
        if (c->n[0] < LOOM_GATE_WARM) return 0;
        c->decided = 1;
        choose_mode(c, rate(c, 1) >= rate(c, 0));
    }
    if (!c->probing && c->since >= c->probe) {
        c->probing = LOOM_GATE_PROBE_STEPS;
        c->n[!c->mode] = 0; /* the probe measures now, not the past */
        c->tok[!c->mode] = c->sec[!c->mode] = 0;
    }
    return c->probing ? !c->mode : c->mode;
}

/* The probe of mode !c->mode ended: it takes over if it beat the choice
 * by the margin, else the choice holds until the next probe. */
static void probe_done(loom_gate_class *c) {
    int m = c->mode;
    if (rate(c, !m) > rate(c, m) * (1 + LOOM_GATE_MARGIN)) {
        choose_mode(c, !m);
        return;
    }
    c->since = 0;
    c->probe = next_probe(c);
}

void loom_gate_record(loom_gate *g, int n_rows, int spec, int tokens, double seconds) {
    if (g->off || tokens <= 0 || seconds <= 0) return;
    loom_gate_class *c = &g->c[loom_gate_class_of(n_rows)];
    int m = spec != 0;
    if (!c->seen[m]) {
        c->seen[m] = 1;
        return;
    }
    if (!c->decided) {
        add(c, m, tokens, seconds);
        return;
    }
    if (m == c->mode) {
        add(c, m, tokens, seconds);
        c->since++;
        /* speculation slowed down past what plain steps did when last
         * measured (acceptance fell): plain is probed now, not switched
         * to, since the machine may just have become busier (both
         * slower). Plain steps' cost does not follow acceptance: when
         * they are the choice, only the scheduled probes ask (a stall
         * would otherwise set off a dear probe). */
        if (m == 1 && !c->probing && c->n[0] && rate(c, 0) > rate(c, 1) * (1 + LOOM_GATE_MARGIN)) c->since = c->probe;
        return;
    }
    if (!c->probing) { /* not asked for (a step that could not take the choice): measured all the same */
        add(c, m, tokens, seconds);
        return;
    }
    add(c, m, tokens, seconds);
    if (--c->probing == 0) probe_done(c);
}

double loom_gate_rate(const loom_gate *g, int n_rows, int spec) {
    return rate(&g->c[loom_gate_class_of(n_rows)], spec != 0);
}
