// Subgroup reduction (adapter has SUBGROUP): subgroupAdd per subgroup, the first lane of each
// subgroup stores its sum, every other lane a zero; then a fixed tree over the WG slots of each output
// (log2 WG steps, the same sum for every output whatever the rows per workgroup). This makes no
// assumption about how invocations map to subgroups or about the subgroup size.
// (No `enable subgroups;`: naga rejects the directive but accepts the builtins.)
fn reduce(lid: u32, lane: u32, acc: array<f32, NO>) {
    for (var o = 0u; o < NO; o++) {
        let s = subgroupAdd(acc[o]);
        red[o * WG + lid] = select(0.0, s, lane == 0u);
    }
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            for (var o = 0u; o < NO; o++) { red[o * WG + lid] += red[o * WG + lid + h]; }
        }
        workgroupBarrier();
    }
}
