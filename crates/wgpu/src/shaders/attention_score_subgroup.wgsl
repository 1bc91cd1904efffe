// Scores of a tile, one subgroup per candidate (adapters with SUBGROUP): the lanes read consecutive
// vec4s of the row (coalesced) and subgroupAdd sums them. Subgroup s takes candidates s, s + n, ...
// (n subgroups); nothing is assumed about the subgroup size or which invocations form a subgroup.
var<private> sg: vec4<u32>;  // (lane, subgroup size, subgroup id, subgroups)

fn score_tile(lid: u32, cnt: u32, d4: u32) {
    for (var l = sg.z; l < cnt; l += sg.w) {
        let code = src[l];
        var s4: array<vec4<f32>, HG>;
        for (var i = sg.x; i < d4; i += sg.y) {
            let v = row_val(code, i);
            for (var k = 0u; k < HG; k++) { s4[k] += qs[k * (MAXD / 4u) + i] * v; }
        }
        for (var k = 0u; k < HG; k++) {
            let tot = subgroupAdd((s4[k].x + s4[k].y) + (s4[k].z + s4[k].w));
            if (sg.x == 0u) { sc[k * TILE + l] = tot * p.scale; }
        }
    }
}
