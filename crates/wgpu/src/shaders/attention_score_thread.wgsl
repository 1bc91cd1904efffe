// Scores of a tile, one thread per candidate (every adapter): sc[k][l] = q_k . row_l * scale.
fn score_tile(lid: u32, cnt: u32, d4: u32) {
    if (lid >= cnt) { return; }
    let code = src[lid];
    var s4: array<vec4<f32>, HG>;
    for (var i = 0u; i < d4; i++) {
        let v = row_val(code, i);
        for (var k = 0u; k < HG; k++) { s4[k] += qs[k * (MAXD / 4u) + i] * v; }
    }
    for (var k = 0u; k < HG; k++) { sc[k * TILE + lid] = ((s4[k].x + s4[k].y) + (s4[k].z + s4[k].w)) * p.scale; }
}
