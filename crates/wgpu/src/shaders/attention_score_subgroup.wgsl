// Scores of a tile, one subgroup per candidate (adapters with SUBGROUP): the lanes read consecutive
// vec4s of the row (coalesced) and subgroupAdd sums them. Subgroup s takes candidates s, s + n, ...
// (n subgroups); nothing is assumed about the subgroup size or which invocations form a subgroup.
var<private> sg: vec4<u32>;  // (lane, subgroup size, subgroup id, subgroups)

// A subgroup scores two candidates a round (l and l + n), their row loads overlapping; each score
// sums as it would alone.
fn score_tile(lid: u32, cnt: u32, d4: u32) {
    for (var l = sg.z; l < cnt; l += 2u * sg.w) {
        let l1 = l + sg.w;
        let two = l1 < cnt;
        let code0 = src[l];
        let code1 = src[select(l, l1, two)];
        var s0: array<vec4<f32>, HG>;
        var s1: array<vec4<f32>, HG>;
        for (var i = sg.x; i < d4; i += sg.y) {
            let v0 = row_val(code0, i);
            let v1 = row_val(code1, i);
            for (var k = 0u; k < HG; k++) {
                let qk = qs[k * (MAXD / 4u) + i];
                s0[k] += qk * v0;
                s1[k] += qk * v1;
            }
        }
        for (var k = 0u; k < HG; k++) {
            let t0 = subgroupAdd((s0[k].x + s0[k].y) + (s0[k].z + s0[k].w));
            let t1 = subgroupAdd((s1[k].x + s1[k].y) + (s1[k].z + s1[k].w));
            if (sg.x == 0u) {
                sc[k * TILE + l] = t0 * p.scale;
                if (two) { sc[k * TILE + l1] = t1 * p.scale; }
            }
        }
    }
}
