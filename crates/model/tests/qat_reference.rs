//! FP8 E4M3, FP4 E2M1 and Hadamard simulation steps, bit-exact against torch-made fixtures
//! (tools/reference/qat_fixtures.py).
use ds4_model::qat;

fn load(name: &str) -> Vec<f32> {
    let p = format!("{}/tests/fixtures/qat/{name}.bin", env!("CARGO_MANIFEST_DIR"));
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).collect();
    assert!(bad.is_empty(), "{what}: {} of {} differ, first at {}: got {} want {}", bad.len(), got.len(), bad[0], got[bad[0]], want[bad[0]]);
}

#[test]
fn fp8_scalar_cast() {
    let x = load("fp8_scalar_in");
    let got: Vec<f32> = x.iter().map(|&v| qat::e4m3_round(v.clamp(-448.0, 448.0))).collect();
    assert_bits(&got, &load("fp8_scalar_out"), "e4m3");
}

#[test]
fn fp8_block_simulation() {
    let mut x = load("fp8_block_in");
    qat::fp8_simulate(&mut x, 64);
    assert_bits(&x, &load("fp8_block_out"), "fp8 block");
}

#[test]
fn fp4_scalar_and_block() {
    let x = load("fp4_scalar_in");
    let got: Vec<f32> = x.iter().map(|&v| qat::e2m1_round(v.clamp(-6.0, 6.0))).collect();
    assert_bits(&got, &load("fp4_scalar_out"), "e2m1");
    let mut b = load("fp4_block_in");
    qat::fp4_simulate(&mut b, 32);
    assert_bits(&b, &load("fp4_block_out"), "fp4 block");
}

#[test]
fn hadamard_transforms() {
    for n in [32usize, 128] {
        let mut x = load(&format!("hadamard{n}_in"));
        for row in x.chunks_mut(n) {
            qat::hadamard(row);
        }
        assert_bits(&x, &load(&format!("hadamard{n}_out")), &format!("hadamard {n}"));
    }
}

#[test]
fn indexer_qat_and_kv_fp8() {
    let mut x = load("indexer_qat_in");
    for row in x.chunks_mut(128) {
        qat::hadamard(row);
        qat::fp4_simulate(row, 32);
    }
    assert_bits(&x, &load("indexer_qat_out"), "indexer qat");
    let mut kv = load("kv_fp8_in");
    for row in kv.chunks_mut(128) {
        qat::fp8_simulate(&mut row[..64], 64);
    }
    assert_bits(&kv, &load("kv_fp8_out"), "kv fp8");
}
