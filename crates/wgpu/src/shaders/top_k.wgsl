// The top_k largest indexer scores of token t, ties to the lowest index, written in ascending index
// order (ds4_model::attention::top_k_indices), for tokens with nc = (pos_t + 1) / ratio > top_k (pos_t:
// the row's position, seq.wgsl); the ids are rows of the token's own slot.
// One workgroup per token. Scores map to u32 keys in f32::total_cmp order; the k-th largest key T
// is found by a radix select, 8 bits a pass from the top (4 passes of a 256-bin histogram over the
// keys that match the digits found so far), which also gives how many keys == T to take (k minus
// the keys > T); then one pass in index order keeps every key > T and the first such keys == T,
// placing them by a workgroup prefix sum.
struct Params { ratio: u32, top_k: u32, stride: u32, pad: u32 }
@group(0) @binding(0) var<storage, read> scores: array<f32>;
@group(0) @binding(1) var<storage, read_write> sel: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

const WG: u32 = 256u;
var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> found: vec2<u32>;  // (digit, keys above it among the matching ones)
var<workgroup> scan: array<u32, WG>;

fn key(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    return select(b ^ 0x80000000u, ~b, (b >> 31u) == 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    let nc = (row_pos(t) + 1u) / p.ratio;
    let k = p.top_k;
    if (nc <= k) { return; }
    let base = t * p.stride;
    // Radix select: after round i, `prefix` holds the top 8 (i + 1) bits of T and `left` how many
    // keys equal to T in those bits are still to be taken.
    var prefix = 0u;
    var mask = 0u;
    var left = k;
    for (var r = 0u; r < 4u; r++) {
        let shift = 24u - 8u * r;
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        for (var c = lid; c < nc; c += WG) {
            let kk = key(scores[base + c]);
            if ((kk & mask) == prefix) { atomicAdd(&hist[(kk >> shift) & 255u], 1u); }
        }
        workgroupBarrier();
        // The digit: the highest bin where the count of keys from the top reaches `left` (bin 0 if
        // none does), and the keys above it. Counts from the top by a suffix sum over the bins
        // (Hillis-Steele, one bin a thread) instead of one thread walking them.
        let n = atomicLoad(&hist[lid]);
        scan[lid] = n;
        workgroupBarrier();
        for (var s = 1u; s < WG; s <<= 1u) {
            var v = scan[lid];
            if (lid + s < WG) { v += scan[lid + s]; }
            workgroupBarrier();
            scan[lid] = v;
            workgroupBarrier();
        }
        let incl = scan[lid];
        if ((incl >= left && incl - n < left) || (lid == 0u && incl < left)) {
            found = vec2<u32>(lid, incl - n);
        }
        workgroupBarrier();
        let f = found;
        prefix |= f.x << shift;
        mask |= 255u << shift;
        left -= f.y;
        workgroupBarrier();
    }
    let th = prefix;
    let need = left;
    // Running totals before the chunk: keys == T seen, picks written.
    var eq_before = 0u;
    var out = 0u;
    for (var c0 = 0u; c0 < nc; c0 += WG) {
        let c = c0 + lid;
        var gt = 0u;
        var eq = 0u;
        if (c < nc) {
            let kk = key(scores[base + c]);
            gt = u32(kk > th);
            eq = u32(kk == th);
        }
        // Inclusive prefix sums of (gt << 16 | eq) over the chunk (Hillis-Steele).
        scan[lid] = (gt << 16u) | eq;
        workgroupBarrier();
        for (var s = 1u; s < WG; s <<= 1u) {
            var v = scan[lid];
            if (lid >= s) { v += scan[lid - s]; }
            workgroupBarrier();
            scan[lid] = v;
            workgroupBarrier();
        }
        let incl = scan[lid];
        let gt_ex = (incl >> 16u) - gt;
        let eq_ex = (incl & 0xffffu) - eq;
        let take_eq = eq == 1u && eq_before + eq_ex < need;
        if (gt == 1u || take_eq) {
            let at = out + gt_ex + min(eq_before + eq_ex, need) - min(eq_before, need);
            sel[t * k + at] = c;
        }
        let tot = scan[WG - 1u];
        out += (tot >> 16u) + min(eq_before + (tot & 0xffffu), need) - min(eq_before, need);
        eq_before += tot & 0xffffu;
        workgroupBarrier();
    }
}
