/* tuning: reads the CUDA backend's environment knobs (tuning.h). */
#include "cuda/tuning.h"

#include <stdlib.h>
#include <string.h>

/* 1 unless the variable is "0" (a knob on by default). */
static int on_unless_0(const char *name) {
    const char *v = getenv(name);
    return !(v && !strcmp(v, "0"));
}

/* 1 only when the variable is "1" (a knob off by default). */
static int off_unless_1(const char *name) {
    const char *v = getenv(name);
    return v && !strcmp(v, "1");
}

extern "C" void loom_cuda_tuning_read(loom_cuda_tuning *t) {
    t->pdl = on_unless_0("LOOM_CUDA_PDL");
    const char *mma = getenv("LOOM_CUDA_GEMV_MMA");
    t->gemv_mma = mma ? atoi(mma) : 3;
    const char *ks = getenv("LOOM_CUDA_GEMV_KS"), *u = getenv("LOOM_CUDA_GEMV_U");
    const char *bps = getenv("LOOM_CUDA_GEMV_BPS");
    const char *pf = getenv("LOOM_CUDA_GEMV_PF_MB"), *sp = getenv("LOOM_CUDA_ATTN_SPLIT");
    t->gemv_ks = ks ? atoi(ks) : 1;
    t->gemv_ks = t->gemv_ks <= 0 ? 0 : t->gemv_ks < 2 ? 1 : t->gemv_ks < 4 ? 2 : 4;
    t->gemv_u = u && (atoi(u) == 4 || atoi(u) == 8) ? atoi(u) : 0;
    t->gemv_bps = bps ? atoi(bps) : 0;
    t->gemv_pf = (size_t)(pf && atoi(pf) >= 0 ? atoi(pf) : 16) << 20;
    t->attn_split_min = sp && atoi(sp) >= 1 ? atoi(sp) : 8;
    const char *ab = getenv("LOOM_CUDA_ATTN_BLOCKS");
    t->attn_blocks = ab && atoi(ab) >= 1 ? atoi(ab) : 4;
    const char *acl = getenv("LOOM_CUDA_ATTN_CLUSTER");
    int ncl = acl ? atoi(acl) : 8;
    t->attn_cluster = ncl >= 8 ? 8 : ncl >= 4 ? 4 : ncl >= 2 ? 2 : 0;
    const char *gw = getenv("LOOM_CUDA_GEMV_W");
    t->gemv_w = gw && (atoi(gw) == 8 || atoi(gw) == 16) ? atoi(gw) : 0;
    t->gemv_pre2 = on_unless_0("LOOM_CUDA_GEMV_PRE2");
    t->gemv_np = on_unless_0("LOOM_CUDA_GEMV_NP");
    const char *fmt = getenv("LOOM_CUDA_FA_MT");
    t->fa_mt = fmt && atoi(fmt) == 1 ? 1 : 2;
    t->qkv_warp = on_unless_0("LOOM_CUDA_QKV_WARP");

    t->gu16 = on_unless_0("LOOM_CUDA_GU16");
    t->qkv16 = on_unless_0("LOOM_CUDA_QKV16");
    t->attn_qkv = off_unless_1("LOOM_CUDA_ATTN_QKV");
    const char *gv = getenv("LOOM_CUDA_GEMV_T");
    t->gemv_t = gv ? atoi(gv) : 2;
    t->head_am = on_unless_0("LOOM_CUDA_HEAD_AM");
    t->f8_f32 = off_unless_1("LOOM_CUDA_F8_F32");
    const char *lc = getenv("LOOM_CUDA_LIN_CHUNK");
    t->lin_chunk = lc && atoi(lc) >= 0 ? atoi(lc) : 0;
    t->graphs = on_unless_0("LOOM_CUDA_GRAPHS");
    t->step_times = off_unless_1("LOOM_CUDA_STEP_TIMES");
}
