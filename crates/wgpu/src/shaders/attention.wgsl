// Attention of one token for a group of HG heads (HG and TILE are set per module) over one split of its candidates, as
// ds4_model::stage: the candidates of token t at position p = pos + t are its raw rows at positions
// max(0, p + 1 - swa) ..= p (before `pos` from the ring, row q % swa, else this step's new KV row
// q - pos), then the compressed rows: none (ratio 0), the first (p + 1) / ratio, or the indexer's
// top_k picks when an indexer is on and there are more than top_k. Rows are both K and V and shared
// by every head (MQA): a workgroup serves HG heads from one read of each row. Softmax over
// {q.row / sqrt(D)} and the head's sink logit, online over tiles of TILE candidates (16 in steps that split, 64 in prefill): a thread scores
// the tile's candidates for the HG heads (score_tile: a thread per candidate, or a subgroup per
// candidate with its lanes splitting the row), then each thread accumulates its own output dims.
// Workgroup (group, token, split): split y takes tiles y, y + nsplit, ...; split 0 also holds the
// sink. With one split the output is final; otherwise each split writes (acc, max, sum) to `part`
// and attention_merge.wgsl combines them. nsplit depends only on ntok and whether the step is batched
// (the host computes the same).
// Each row reads its own sequence (seq.wgsl): its slot's ring (rows slot * swa ..) and compressed rows
// (rows slot * cap ..), this step's new rows of its sequence only; a batched step splits as a
// one-token step, so every row sums as it would decoded alone.
struct Params {
    n_head: u32, d: u32, swa: u32, ratio: u32,
    top_k: u32, scale: f32, groups: u32, splits: u32,
    short_step: u32, cap: u32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kvn: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ring: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> comp: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> sel: array<u32>;
@group(0) @binding(5) var<storage, read> sinks: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
@group(0) @binding(7) var<storage, read_write> part: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;
@group(0) @binding(9) var<uniform> step: Step;

const WG: u32 = 128u;
const MAXD: u32 = 512u;
// vec4s of a head per thread in the accumulation (rows are read as vec4: d is a multiple of 4).
const PER: u32 = MAXD / 4u / WG;
const SRC_RING: u32 = 0u;
const SRC_NEW: u32 = 1u;
const SRC_COMP: u32 = 2u;
// Softmax state of a split that has not seen a candidate yet (exp of it minus anything is 0).
const NEG: f32 = -3.4028235e38;

var<workgroup> qs: array<vec4<f32>, HG * MAXD / 4u>;
var<workgroup> sc: array<f32, HG * TILE>;  // the tile's scores, then their softmax weights
var<workgroup> src: array<u32, 64>;    // TILE
var<workgroup> hm: array<f32, HG>;     // per head: the running max (after the tile's scores)
var<workgroup> ha: array<f32, HG>;     // per head: the factor rescaling what was summed before the tile
var<workgroup> hd: array<f32, HG>;     // per head: the softmax denominator, published at the end

// vec4 i of a candidate row (source in the top 2 bits, row index below).
fn row_val(s: u32, i: u32) -> vec4<f32> {
    let kind = s >> 30u;
    let off = (s & 0x3fffffffu) * (p.d / 4u) + i;
    if (kind == SRC_RING) { return ring[off]; }
    if (kind == SRC_NEW) { return kvn[off]; }
    return comp[off];
}

// Steps of up to p.short_step tokens (decode, an MTP verify, a rollback's re-run) and batched steps
// split each row as a one-token step does (p.splits, computed by attention.rs): every row then sums as
// it would decoded alone. Longer steps (prefill) do not split.
fn nsplit_of(ntok: u32) -> u32 {
    return select(p.splits, 1u, ntok > p.short_step && step.batch == 0u);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_PARAMS) {
    SG_INIT
    let g = wid.x;
    let t = wid.y;
    let y = wid.z;
    let nsplit = nsplit_of(step.ntok);
    if (t >= step.ntok || y >= nsplit) { return; }
    let d = p.d;
    let d4 = d / 4u;
    let h0 = g * HG;
    let nhg = min(HG, p.n_head - h0);
    for (var k = 0u; k < HG; k++) {
        for (var i = lid; i < d4; i += WG) {
            let b = ((t * p.n_head) + h0 + k) * d + 4u * i;
            let v = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
            qs[k * (MAXD / 4u) + i] = select(vec4<f32>(0.0), v, k < nhg);
        }
    }
    workgroupBarrier();

    let sq = seq_of(t);
    let pos = sq.pos + t - sq.row0;
    let start = select(0u, pos + 1u - p.swa, pos + 1u >= p.swa);
    let n_raw = pos + 1u - start;
    var nc = 0u;
    if (p.ratio != 0u) { nc = (pos + 1u) / p.ratio; }
    let picked = p.top_k != 0u && nc > p.top_k;
    let total = n_raw + select(nc, p.top_k, picked);

    // The softmax state of head lid lives in thread lid (< HG): its running max and denominator.
    // Each tile's max, rescale factor and weights exp(s - max) are computed once per (head,
    // candidate) and shared through workgroup memory, not by every thread; the sums keep candidate
    // order, so the results are those of each thread keeping its own copy.
    let own = y == 0u && lid < nhg;
    var mk = select(NEG, sinks[min(h0 + min(lid, HG - 1u), p.n_head - 1u)], own);
    var dk = select(0.0, 1.0, own);
    var acc: array<array<vec4<f32>, PER>, HG>;
    for (var base = y * TILE; base < total; base += nsplit * TILE) {
        let c = base + lid;
        var code = 0u;
        if (lid < TILE && c < total) {
            if (c < n_raw) {
                let qp = start + c;
                code = select((SRC_NEW << 30u) | (sq.row0 + qp - sq.pos), (SRC_RING << 30u) | (sq.slot * p.swa + qp % p.swa), qp < sq.pos);
            } else {
                let j = c - n_raw;
                code = (SRC_COMP << 30u) | (sq.slot * p.cap + select(j, sel[t * p.top_k + j], picked));
            }
        }
        if (lid < TILE) { src[lid] = code; }
        workgroupBarrier();
        score_tile(lid, min(TILE, total - base), d4);
        workgroupBarrier();
        let cnt = min(TILE, total - base);
        if (lid < HG) {
            var mt = mk;
            for (var l = 0u; l < cnt; l++) { mt = max(mt, sc[lid * TILE + l]); }
            ha[lid] = exp(mk - mt);
            hm[lid] = mt;
            mk = mt;
        }
        workgroupBarrier();
        for (var i = lid; i < HG * TILE; i += WG) {
            if (i % TILE < cnt) { sc[i] = exp(sc[i] - hm[i / TILE]); }
        }
        workgroupBarrier();
        if (lid < HG) {
            dk *= ha[lid];
            for (var l = 0u; l < cnt; l++) { dk += sc[lid * TILE + l]; }
        }
        for (var k = 0u; k < HG; k++) {
            let alpha = ha[k];
            for (var j = 0u; j < PER; j++) { acc[k][j] *= alpha; }
        }
        // Two candidates a round, their rows loaded before either is added (the loads overlap);
        // each is added in candidate order as one a round would.
        for (var l = 0u; l < cnt; l += 2u) {
            let two = l + 1u < cnt;
            let code0 = src[l];
            let code1 = src[min(l + 1u, cnt - 1u)];
            for (var j = 0u; j < PER; j++) {
                let i = lid + j * WG;
                if (i < d4) {
                    let v0 = row_val(code0, i);
                    let v1 = row_val(code1, i);
                    for (var k = 0u; k < HG; k++) { acc[k][j] += sc[k * TILE + l] * v0; }
                    if (two) {
                        for (var k = 0u; k < HG; k++) { acc[k][j] += sc[k * TILE + l + 1u] * v1; }
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (lid < HG) {
        hm[lid] = mk;
        hd[lid] = dk;
    }
    workgroupBarrier();
    for (var k = 0u; k < nhg; k++) {
        let h = h0 + k;
        if (nsplit == 1u) {
            for (var j = 0u; j < PER; j++) {
                let i = lid + j * WG;
                if (i < d4) {
                    let v = acc[k][j] / hd[k];
                    let ob = (t * p.n_head + h) * d + 4u * i;
                    o[ob] = v.x;
                    o[ob + 1u] = v.y;
                    o[ob + 2u] = v.z;
                    o[ob + 3u] = v.w;
                }
            }
        } else {
            let pb = ((t * nsplit + y) * p.n_head + h) * (d + 2u);
            for (var j = 0u; j < PER; j++) {
                let i = lid + j * WG;
                if (i < d4) {
                    let v = acc[k][j];
                    part[pb + 4u * i] = v.x;
                    part[pb + 4u * i + 1u] = v.y;
                    part[pb + 4u * i + 2u] = v.z;
                    part[pb + 4u * i + 3u] = v.w;
                }
            }
            if (lid == 0u) {
                part[pb + d] = hm[k];
                part[pb + d + 1u] = hd[k];
            }
        }
    }
}
